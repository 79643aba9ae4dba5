# A faithful model whose TF1 side, run in TensorFlow 1.15, misses the guide's
# tolerance against its TF2 rewrite only by kernel rounding (tests/test_kernel_floor.py):
# a stack of 3x3 convolutions, each followed by batch norm in training mode
# over a batch of one, few values per channel (depth and a normalisation over
# few values amplify the few-ULP differences of 1.15's kernels). Imported in
# the TensorFlow 1.15 interpreter as "kernel_floor_model:deep_bn" (Python 3.6
# syntax, TensorFlow and NumPy only); under TensorFlow 2 the same code runs on
# tf-slim in a shim layer (DeepShim).
import tensorflow as tf

DEPTH, CHANNELS, SIZE = 12, 16, 2


def _layers():
    """tf.contrib.layers in TensorFlow 1.x; tf-slim in 2.x."""
    if tf.__version__.startswith("1."):
        return tf.contrib.layers, tf
    import tf_slim
    return tf_slim, tf.compat.v1


def deep_bn(inputs, training, decay=0.9):
    layers, v1 = _layers()
    net = inputs
    with v1.variable_scope("deep"):
        for i in range(DEPTH):
            net = layers.conv2d(net, CHANNELS, 3, activation_fn=None, scope="conv%d" % i)
            net = layers.batch_norm(net, decay=decay, is_training=training, scale=True, scope="bn%d" % i)
            net = tf.nn.relu(net)
        return layers.conv2d(net, 3, 1, activation_fn=None, scope="logits")


if not tf.__version__.startswith("1."):
    class DeepShim(tf.keras.layers.Layer):
        """deep_bn's TF2 rewrite: the same code in a shim layer (decay: a planted slip)."""

        def __init__(self, decay=0.9):
            super(DeepShim, self).__init__()
            self.decay = decay

        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, inputs, training=None):
            return deep_bn(inputs, bool(training), self.decay)
