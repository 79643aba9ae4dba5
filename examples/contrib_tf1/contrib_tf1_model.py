# A small TF1 model as it was written for TensorFlow 1.15, with tf.contrib
# (fully_connected, batch_norm, layer_norm, an LSTM cell unrolled over two
# time steps, dropout). check_equivalence(tf1_python=...)
# imports it in the TensorFlow 1.15 interpreter as "contrib_tf1_model:model"
# (so: Python 3.6 syntax, TensorFlow and NumPy only, no equivtool import).
# Imported under TensorFlow 2, the same code runs on tf-slim (contrib's layers
# as they were carried over): the TF2 rewrite is that code in a shim layer
# (Shim), and the in-process TF1 side can run it too.
import tensorflow as tf

UNITS, FEATURES, CLASSES = 8, 6, 3
CELL, STEPS = 5, 2      # the LSTM's units; time steps: the hidden units split in two
DECAY, FORGET_BIAS = 0.9, 1.0  # batch_norm's moving-average decay; the LSTM's forget-gate bias


def _layers():
    """tf.contrib.layers and the v1 API in TensorFlow 1.x; tf-slim and tf.compat.v1 in 2.x."""
    if tf.__version__.startswith("1."):
        return tf.contrib.layers, tf
    import tf_slim
    return tf_slim, tf.compat.v1


def _rnn():
    """(the LSTM cell, static_rnn): tf.contrib.rnn in TensorFlow 1.x; tf.compat.v1.nn's in 2.x
    (tf-keras's legacy cells: the same variables, rnn/lstm/kernel and bias).

    TensorFlow 1.15's cell, given no initializer, draws its kernel from the variable
    scope's default, the v1 glorot_uniform_initializer; tf-keras's legacy cell draws
    Keras's GlorotUniform instead, other numbers from the same seed (the old side in
    TensorFlow 1.15 shows it; tf.compat.v1 in TensorFlow 2 runs tf-keras's cell on
    both sides and cannot). The rewrite names the initializer the old code used."""
    if tf.__version__.startswith("1."):
        return tf.contrib.rnn.LSTMCell, tf.contrib.rnn.static_rnn

    def lstm_cell(units, **kwargs):
        return tf.compat.v1.nn.rnn_cell.LSTMCell(units, initializer=tf.compat.v1.glorot_uniform_initializer(),
                                                 **kwargs)
    return lstm_cell, tf.compat.v1.nn.static_rnn


def _layer_norm(v1, net, epsilon):
    """A layer norm written out, with its own epsilon (contrib's is 1e-12): the planted slip."""
    with v1.variable_scope("LayerNorm"):
        beta = v1.get_variable("beta", [UNITS], initializer=v1.zeros_initializer())
        gamma = v1.get_variable("gamma", [UNITS], initializer=v1.ones_initializer())
        mean, variance = tf.nn.moments(net, [1], keepdims=True)
        return tf.nn.batch_normalization(net, mean, variance, beta, gamma, epsilon)


def net(inputs, training, epsilon=None, forget_bias=FORGET_BIAS, decay=DECAY):
    """fully_connected -> batch_norm -> layer_norm -> an LSTM over STEPS time steps ->
    dropout -> fully_connected. The rewrite slips: ``epsilon``, the layer norm written
    out with that epsilon; ``forget_bias``, the LSTM's; ``decay``, batch_norm's."""
    layers, v1 = _layers()
    lstm_cell, static_rnn = _rnn()
    with v1.variable_scope("small"):
        hidden = layers.fully_connected(inputs, UNITS, scope="fc1")
        hidden = layers.batch_norm(hidden, decay=decay, is_training=training, scope="BatchNorm")
        if epsilon is None:
            hidden = layers.layer_norm(hidden, scope="LayerNorm")
        else:
            hidden = _layer_norm(v1, hidden, epsilon)
        # unrolled (static_rnn), not a while loop: every op of the cell can be fetched
        cell = lstm_cell(CELL, forget_bias=forget_bias, name="lstm")
        steps, _ = static_rnn(cell, tf.split(hidden, STEPS, axis=1), dtype=tf.float32, scope="rnn")
        hidden = layers.dropout(steps[-1], keep_prob=0.5, is_training=training, scope="dropout")
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
        """The TF2 rewrite: the same code in a shim layer (epsilon, forget_bias, decay: the
        planted slips)."""

        def __init__(self, epsilon=None, forget_bias=FORGET_BIAS, decay=DECAY):
            super(Shim, self).__init__()
            self.epsilon, self.forget_bias, self.decay = epsilon, forget_bias, decay

        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, inputs, training=None):
            return net(inputs, bool(training), self.epsilon, self.forget_bias, self.decay)
    return Shim


if not tf.__version__.startswith("1."):
    Shim = _shim_class()
