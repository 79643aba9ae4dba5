# The zoo's smaller nets as they ran: tf.contrib.slim.nets under TensorFlow 1.x.
#
# check_equivalence(tf1_python=...) imports this module in the TensorFlow 1.15
# interpreter and names each net as "contrib_nets:alexnet_v2" (so: Python 3.6
# syntax, TensorFlow and NumPy only, no equivtool import). There the net is
# built from tf.contrib.slim.nets, the code the models were trained with; under
# TensorFlow 2 the same function builds it from tf_slim.nets (contrib's nets as
# they were carried over), with the same scopes and variable names, so the
# in-process TF1 side can run it too. Each net is built as the zoo builds it
# (examples/slim_zoo/zoo.py): its published arg scope, 10 classes, the layer's
# training flag as is_training.
import tensorflow as tf

CLASSES = 10

# net -> (module of the nets package, its arg scope function)
NETS = {
    "alexnet_v2": ("alexnet", "alexnet_v2_arg_scope"),
    "inception_v1": ("inception", "inception_v1_arg_scope"),
    "resnet_v1_50": ("resnet_v1", "resnet_arg_scope"),
}


def slim_and_nets():
    """(slim, nets): tf.contrib.slim and tf.contrib.slim.nets in TensorFlow 1.x; tf_slim in 2.x."""
    if tf.__version__.startswith("1."):
        from tensorflow.contrib.slim import nets
        return tf.contrib.slim, nets
    import tf_slim
    from tf_slim import nets
    return tf_slim, nets


def build(name, inputs, training):
    """Net ``name`` under its arg scope: (logits, end_points)."""
    slim, nets = slim_and_nets()
    module_name, scope_name = NETS[name]
    module = getattr(nets, module_name)
    with slim.arg_scope(getattr(module, scope_name)()):
        return getattr(module, name)(inputs, num_classes=CLASSES, is_training=bool(training))


def alexnet_v2(inputs, training):
    return build("alexnet_v2", inputs, training)


def inception_v1(inputs, training):
    return build("inception_v1", inputs, training)


def resnet_v1_50(inputs, training):
    return build("resnet_v1_50", inputs, training)


def sgd():
    """The zoo's TF1 optimizer (GradientDescentOptimizer(0.01)), named "contrib_nets:sgd"."""
    optimizers = tf.train if tf.__version__.startswith("1.") else tf.compat.v1.train
    return optimizers.GradientDescentOptimizer(0.01)
