# What tests/test_tf1_python_side.py runs in the TensorFlow 1.15 interpreter
# besides the example's model (examples/contrib_tf1/contrib_tf1_model.py, on
# the same sys.path): a model that raises, and random draws for the random
# tool's TF1 half. Python 3.6 syntax, TensorFlow and NumPy only.
import tensorflow as tf

from contrib_tf1_model import CLASSES, FEATURES, UNITS, _layers


def failing_model(inputs, training):
    _, v1 = _layers()
    with v1.variable_scope("small"):
        raise ValueError("a planted error in the model")


def draws(inputs, training):
    """Random numbers the random tool seeds: initializers, draws and a dropout mask."""
    _, v1 = _layers()
    weights = v1.get_variable("w", [FEATURES, UNITS], initializer=v1.glorot_uniform_initializer())
    normal = v1.get_variable("t", [UNITS], initializer=v1.truncated_normal_initializer(stddev=0.5))
    return {"w": weights + 0.0, "t": normal + 0.0, "uniform": v1.random_uniform([5]),
            "normal": v1.random_normal([2, 3]), "dropout": v1.nn.dropout(tf.ones([4, UNITS]), rate=0.5)}


def adam():
    """The TF1 Adam optimizer, named as "tf1_python_model:adam" (resume's tests)."""
    _, v1 = _layers()
    return v1.train.AdamOptimizer(0.01)


def dense_model(inputs, training):
    """fully_connected -> layer_norm -> dropout -> fully_connected, named as
    "tf1_python_model:dense_model": the resume tests' model. Not the example's
    (which has a batch norm after fc1): a bias that feeds a batch norm in training
    mode has a zero gradient up to rounding, and Adam, which divides by the
    gradient's size, steps it by the rounding noise's sign, so which of two
    faithful runs passes its noise floor is a matter of chance (docs/noise-floor.md)."""
    layers, v1 = _layers()
    with v1.variable_scope("small"):
        hidden = layers.fully_connected(inputs, UNITS, scope="fc1")
        hidden = layers.layer_norm(hidden, scope="LayerNorm")
        hidden = layers.dropout(hidden, keep_prob=0.5, is_training=training, scope="dropout")
        return layers.fully_connected(hidden, CLASSES, activation_fn=None, scope="logits")


def composite_outputs(x, split=1, shift=0.0):
    """A dense, a non-uniform ragged and a sparse output of x (as tests/test_bad_input.py's
    composites), the same code in TensorFlow 1.15 and 2.x: the ragged rows are all values
    but the last split, then those (split plants a fault in the row partition alone);
    shift is added to the sparse values alone (a planted fault in them)."""
    flat = tf.reshape(x, [-1])
    count = tf.size(flat, out_type=tf.int64)
    ragged = tf.RaggedTensor.from_row_lengths(flat, tf.stack([count - split, tf.constant(split, tf.int64)]))
    mask = x > 0.5
    sparse = tf.SparseTensor(tf.where(mask), tf.boolean_mask(x, mask) + shift,
                             tf.shape(x, out_type=tf.int64))
    return {"dense": x * 2.0, "ragged": ragged, "sparse": sparse}


def composites(inputs, training):
    """composite_outputs as a TF1 function, named as "tf1_python_model:composites"."""
    return composite_outputs(inputs)


def slices_outputs(x, fault=""):
    """A dense output and a tf.IndexedSlices of x's rows (row 0 doubled at index 3, row 1
    at index 1, of a [5, 3] tensor), the same code in TensorFlow 1.15 and 2.x. fault plants:
    "value" (0.5 added to one element of row 1), "index" (row 1 at index 2), "split" (row 3
    as two entries of index 3 that sum to the same, listed in another order: no fault),
    "split_wrong" (those two entries summing to another value), "no_shape" (dense_shape
    left unknown: no fault), "empty" (no entry: nothing to compare)."""
    values, indices, shape = x * 2.0, tf.constant([3, 1], tf.int64), tf.constant([5, 3], tf.int64)
    if fault == "value":
        values = values + tf.constant([[0.0, 0.0, 0.0], [0.0, 0.5, 0.0]])
    elif fault == "index":
        indices = tf.constant([3, 2], tf.int64)
    elif fault in ("split", "split_wrong"):
        second = x[:1] * (1.5 if fault == "split_wrong" else 1.0)
        values, indices = tf.concat([x[1:] * 2.0, x[:1], second], 0), tf.constant([1, 3, 3], tf.int64)
    elif fault == "no_shape":
        shape = None
    elif fault == "empty":
        values, indices = x[:0], tf.constant([], tf.int64)
    return {"dense": x + 1.0, "slices": tf.IndexedSlices(values, indices, shape)}


def slices(inputs, training):
    """slices_outputs as a TF1 function, named as "tf1_python_model:slices"."""
    return slices_outputs(inputs)


def empty_slices(inputs, training):
    """slices_outputs with no entry, named as "tf1_python_model:empty_slices"."""
    return slices_outputs(inputs, "empty")


def slices_without_shape(inputs, training):
    """slices_outputs with dense_shape unknown, named as "tf1_python_model:slices_without_shape"."""
    return slices_outputs(inputs, "no_shape")


def all_composites(inputs, training):
    """composite_outputs and slices_outputs in one dict, named as "tf1_python_model:all_composites"."""
    outputs = composite_outputs(inputs)
    outputs.update(slices_outputs(inputs))
    return outputs


def embedding_gradient(inputs, training):
    """An embedding lookup of ids [3, 1, 3] and its gradient w.r.t. the table (a
    tf.IndexedSlices with index 3 twice), named as "tf1_python_model:embedding_gradient";
    a tape where eager (the TF2 layer), tf.gradients in a graph."""
    _, v1 = _layers()
    table = v1.get_variable("table", [5, 3], initializer=v1.random_uniform_initializer(-1.0, 1.0))
    ids, weights = tf.constant([3, 1, 3]), tf.concat([inputs, inputs[:1]], 0)
    if tf.executing_eagerly():
        with tf.GradientTape() as tape:
            looked = tf.gather(table, ids)
            total = tf.reduce_sum(looked * weights)
        gradient = tape.gradient(total, table)
    else:
        looked = tf.gather(table, ids)
        gradient = tf.gradients(tf.reduce_sum(looked * weights), table)[0]
    return {"table_gradient": gradient, "looked": looked}  # the last is the default loss's


if not tf.__version__.startswith("1."):
    class DenseShim(tf.keras.layers.Layer):
        """dense_model's TF2 rewrite: the same code in a shim layer."""

        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, inputs, training=None):
            return dense_model(inputs, bool(training))
