# A small TF1 model as it was written for TensorFlow 1.15, with tf.contrib
# (fully_connected, layer_norm, dropout). check_equivalence(tf1_python=...)
# imports it in the TensorFlow 1.15 interpreter as "contrib_tf1_model:model"
# (so: Python 3.6 syntax, TensorFlow and NumPy only, no equivtool import).
# Imported under TensorFlow 2, the same code runs on tf-slim (contrib's layers
# as they were carried over): the TF2 rewrite is that code in a shim layer
# (Shim), and the in-process TF1 side can run it too.
import tensorflow as tf

UNITS, FEATURES, CLASSES = 8, 6, 3


def _layers():
    """tf.contrib.layers and the v1 API in TensorFlow 1.x; tf-slim and tf.compat.v1 in 2.x."""
    if tf.__version__.startswith("1."):
        return tf.contrib.layers, tf
    import tf_slim
    return tf_slim, tf.compat.v1


def _layer_norm(v1, net, epsilon):
    """A layer norm written out, with its own epsilon (contrib's is 1e-12): the planted slip."""
    with v1.variable_scope("LayerNorm"):
        beta = v1.get_variable("beta", [UNITS], initializer=v1.zeros_initializer())
        gamma = v1.get_variable("gamma", [UNITS], initializer=v1.ones_initializer())
        mean, variance = tf.nn.moments(net, [1], keepdims=True)
        return tf.nn.batch_normalization(net, mean, variance, beta, gamma, epsilon)


def net(inputs, training, epsilon=None):
    """fully_connected -> layer_norm -> dropout -> fully_connected; ``epsilon``: the
    layer norm written out with that epsilon instead (a rewrite slip)."""
    layers, v1 = _layers()
    with v1.variable_scope("small"):
        hidden = layers.fully_connected(inputs, UNITS, scope="fc1")
        if epsilon is None:
            hidden = layers.layer_norm(hidden, scope="LayerNorm")
        else:
            hidden = _layer_norm(v1, hidden, epsilon)
        hidden = layers.dropout(hidden, keep_prob=0.5, is_training=training, scope="dropout")
        return layers.fully_connected(hidden, CLASSES, activation_fn=None, scope="logits")


def model(inputs, training):
    return net(inputs, training)


def loss(outputs, regularization_loss):
    """A loss of one's own, named "contrib_tf1_model:loss": imported in both interpreters."""
    return 0.5 * tf.reduce_sum(tf.abs(outputs)) + regularization_loss


def sgd():
    """The TF1 optimizer, named as "contrib_tf1_model:sgd" for the old interpreter."""
    return _layers()[1].train.GradientDescentOptimizer(0.1)


def _shim_class():
    class Shim(tf.keras.layers.Layer):
        """The TF2 rewrite: the same code in a shim layer (epsilon: the planted slip)."""

        def __init__(self, epsilon=None):
            super(Shim, self).__init__()
            self.epsilon = epsilon

        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, inputs, training=None):
            return net(inputs, bool(training), self.epsilon)
    return Shim


if not tf.__version__.startswith("1."):
    Shim = _shim_class()
