"""A TF1 function and native Keras 3 rewrites of it, for ``equivtool check --map``
(tests/test_cli_map.py): the rewrite names its variables its own way
(``net/fc1/kernel`` against ``fc1/kernel``)."""

import keras
import tensorflow as tf

v1 = tf.compat.v1


def tf1(x, training=False):
    h = v1.layers.dense(x, 8, activation=tf.nn.relu, name="fc1")
    h = v1.layers.batch_normalization(h, training=training, name="bn", momentum=0.99)
    return v1.layers.dense(h, 3, name="out")


class Net(keras.Model):
    def __init__(self, momentum=0.99, extra=False):
        super().__init__()
        self.fc1 = keras.layers.Dense(8, activation="relu", name="fc1")
        self.bn = keras.layers.BatchNormalization(name="bn", momentum=momentum, epsilon=1e-3)
        self.out = keras.layers.Dense(3, name="out")
        self.extra = keras.layers.Dense(3, name="extra") if extra else None

    def call(self, x, training=False):
        y = self.out(self.bn(self.fc1(x), training=training))
        return y + 0.0 * self.extra(y) if self.extra is not None else y


def faithful():
    return Net()


def momentum_slip():
    """Keras' usual BN momentum where the TF1 code says 0.99: the planted slip."""
    return Net(momentum=0.9)


def with_an_extra_layer():
    """A variable TF1 has no counterpart for: the mapping cannot be complete."""
    return Net(extra=True)


#: rename rules written by hand (TF2 name -> TF1 name), as ``--rename`` takes them
RULES = [(r"^net/", "")]


def adam():
    """The Keras 3 optimizer a converted TF1 Adam run's slots go into (TF1's epsilon)."""
    return keras.optimizers.Adam(0.01, epsilon=1e-8)


def tf1_sgd():
    """The TF1 optimizer of the optimizer step (``--tf1-optimizer``)."""
    return v1.train.GradientDescentOptimizer(0.1)


def sgd():
    return keras.optimizers.SGD(0.1)


def sgd_slip():
    """A learning rate 1% off: the planted optimizer slip."""
    return keras.optimizers.SGD(0.101)


def abs_loss(outputs, regularization_loss):
    """A loss of one's own (``--loss``)."""
    return tf.reduce_mean(tf.abs(outputs)) + regularization_loss


def tf1_adam():
    return v1.train.AdamOptimizer(0.01)
