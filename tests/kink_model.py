# A model whose ReLU inputs hold exact zeros, for the kink floor (tests/test_kinks.py):
# channel 0 of the ReLU's input is a value minus itself (the gradient flowing
# through the first term), exactly 0 in every TensorFlow. Its TF2 rewrite may add `nudge` there (a planted difference: 1e-30
# stands for two kernels rounding a value next to 0 to opposite signs, 1e-2 for a
# slip) and scale the logits (`scale`, a slip no kink explains). Imported in the
# TensorFlow 1.15 interpreter as "kink_model:kinked" (Python 3.6 syntax,
# TensorFlow and NumPy only); under TensorFlow 2 the same code runs on tf-slim in a
# shim layer (KinkShim).
import tensorflow as tf

SIZE, CHANNELS = 6, 4


def _layers():
    """tf.contrib.layers in TensorFlow 1.x; tf-slim in 2.x."""
    if tf.__version__.startswith("1."):
        return tf.contrib.layers, tf
    import tf_slim
    return tf_slim, tf.compat.v1


def kinked(inputs, training, nudge=0.0, scale=1.0):
    layers, v1 = _layers()
    with v1.variable_scope("kinked"):
        net = layers.conv2d(inputs, CHANNELS, 3, activation_fn=None, scope="conv1")
        first = net[..., :1]
        net = tf.concat([first - tf.stop_gradient(first), net[..., 1:]], -1)  # channel 0: exactly 0
        if nudge:
            net = net + nudge
        net = tf.nn.relu(net)
        net = tf.nn.max_pool(net, [1, 2, 2, 1], [1, 2, 2, 1], "SAME")
        net = layers.conv2d(net, CHANNELS, 3, activation_fn=tf.nn.relu, scope="conv2")
        logits = layers.conv2d(net, 2, 1, activation_fn=None, scope="logits")
        return logits * scale if scale != 1.0 else logits


def sgd():
    """The TF1 optimizer ("kink_model:sgd")."""
    return tf.compat.v1.train.GradientDescentOptimizer(0.1)


def adam():
    """The TF1 optimizer ("kink_model:adam")."""
    return tf.compat.v1.train.AdamOptimizer(0.01)


if not tf.__version__.startswith("1."):
    class KinkShim(tf.keras.layers.Layer):
        """kinked's TF2 rewrite: the same code in a shim layer (nudge, scale: planted)."""

        def __init__(self, nudge=0.0, scale=1.0):
            super(KinkShim, self).__init__()
            self.nudge, self.scale = nudge, scale

        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, inputs, training=None):
            return kinked(inputs, bool(training), self.nudge, self.scale)
