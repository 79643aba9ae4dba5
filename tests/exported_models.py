"""Small exported artifacts for the ``equivtool compare`` tests, made with the example's
exporters (examples/exported/export.py): the slim test network as a TF1 SavedModel
(``tf.compat.v1.saved_model.Builder``) and a frozen graph, its shim as a TF2
SavedModel (faithful, with a planted batch-norm epsilon, and with its input renamed),
and a tiny tf-keras model as an .h5 file and a TF2 SavedModel."""

from __future__ import annotations

import os
import sys

import equivtool  # noqa: F401 - before TensorFlow
import tensorflow as tf

from small_models import INPUT_SHAPE, SlimNetShim, slim_net

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples.exported.export import export_tf1, export_tf2  # noqa: E402


def _tf1(images):
    end_points = slim_net(images, False)
    return {"logits": end_points["logits"], "pool1": end_points["pool1"]}


def _call(layer, images):
    end_points = layer(images, training=False)
    return {"logits": end_points["logits"], "pool1": end_points["pool1"]}


def export_keras(h5_path: str, folder: str) -> None:
    """A tiny tf-keras model as an .h5 file and as a TF2 SavedModel."""
    inputs = tf.keras.Input([6], name="features")
    hidden = tf.keras.layers.Dense(4, activation="relu", name="hidden")(inputs)
    outputs = tf.keras.layers.Dense(3, name="scores")(hidden)
    model = tf.keras.Model(inputs, outputs)
    model.save(h5_path)
    tf.saved_model.save(model, folder)


def build_all(root: str) -> dict:
    paths = {name: os.path.join(root, name) for name in ("tf1", "tf2", "tf2_bad_eps", "tf2_x", "keras_sm")}
    paths["pb"] = os.path.join(root, "frozen.pb")
    paths["h5"] = os.path.join(root, "model.h5")
    values, tensors = export_tf1(_tf1, INPUT_SHAPE, paths["tf1"], frozen_path=paths["pb"])
    paths["graph_outputs"] = ",".join(f"{k}={v}" for k, v in tensors.items())
    export_tf2(SlimNetShim(), _call, values, INPUT_SHAPE, paths["tf2"])
    export_tf2(SlimNetShim(bn_epsilon=1e-1), _call, values, INPUT_SHAPE, paths["tf2_bad_eps"])  # the planted fault
    export_tf2(SlimNetShim(), _call, values, INPUT_SHAPE, paths["tf2_x"], input_name="x")
    export_keras(paths["h5"], paths["keras_sm"])
    return paths
