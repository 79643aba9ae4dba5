# A 2019-style model as it was written for TensorFlow 1.15, with tf.contrib:
# slim's fully_connected and contrib.layers.layer_norm, exported with
# SavedModelBuilder. tests/test_tf1_interpreter.py runs it in a TensorFlow 1.15
# interpreter (Python 3.6+ syntax; TensorFlow and NumPy only):
#
#   python tf1_contrib_model.py EXPORT_DIR [--resampler]
#
# --resampler exports a graph with contrib's Resampler op instead: TensorFlow
# 1.15 registers it only once tf.contrib is imported.
#
# ``weights()`` needs NumPy only, so the test builds the TF2 rewrite here with
# the same values.
import sys

import numpy as np

UNITS, FEATURES, CLASSES = 8, 6, 3
LAYER_NORM_EPSILON = 1e-12  # what tf.contrib.layers.layer_norm hard-codes


def weights():
    rng = np.random.RandomState(7)
    return {
        "fc1/weights": (0.5 * rng.standard_normal((FEATURES, UNITS))).astype(np.float32),
        "fc1/biases": (0.1 * rng.standard_normal(UNITS)).astype(np.float32),
        "LayerNorm/gamma": (1.0 + 0.1 * rng.standard_normal(UNITS)).astype(np.float32),
        "LayerNorm/beta": (0.1 * rng.standard_normal(UNITS)).astype(np.float32),
        "logits/weights": (0.5 * rng.standard_normal((UNITS, CLASSES))).astype(np.float32),
        "logits/biases": (0.1 * rng.standard_normal(CLASSES)).astype(np.float32),
    }


def export(folder):
    import tensorflow as tf
    slim = tf.contrib.slim
    graph = tf.Graph()
    with graph.as_default():
        x = tf.placeholder(tf.float32, [None, FEATURES], name="x")
        with tf.variable_scope("small"):
            net = slim.fully_connected(x, UNITS, activation_fn=tf.nn.relu, scope="fc1")
            net = tf.contrib.layers.layer_norm(net, scope="LayerNorm")
            y = slim.fully_connected(net, CLASSES, activation_fn=None, scope="logits")
        with tf.Session(graph=graph) as session:
            session.run(tf.global_variables_initializer())
            values = weights()
            for variable in tf.global_variables():  # the fixed values the TF2 rewrite uses too
                variable.load(values[variable.op.name[len("small/"):]], session)
            builder = tf.saved_model.builder.SavedModelBuilder(folder)
            signature = tf.saved_model.signature_def_utils.predict_signature_def({"x": x}, {"y": y})
            builder.add_meta_graph_and_variables(session, [tf.saved_model.tag_constants.SERVING],
                                                 signature_def_map={"serving_default": signature})
            builder.save()


def export_resampler(folder):
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        data = tf.placeholder(tf.float32, [1, 4, 4, 1], name="data")
        warp = tf.placeholder(tf.float32, [1, 2, 2], name="warp")
        out = tf.contrib.resampler.resampler(data, warp)
        with tf.Session(graph=graph) as session:
            builder = tf.saved_model.builder.SavedModelBuilder(folder)
            signature = tf.saved_model.signature_def_utils.predict_signature_def(
                {"data": data, "warp": warp}, {"out": out})
            builder.add_meta_graph_and_variables(session, [tf.saved_model.tag_constants.SERVING],
                                                 signature_def_map={"serving_default": signature})
            builder.save()


if __name__ == "__main__":
    (export_resampler if "--resampler" in sys.argv[2:] else export)(sys.argv[1])
