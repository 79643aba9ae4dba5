"""Small exported artifacts for the ``equivtool compare`` tests: the slim test network
as a TF1 SavedModel (``tf.compat.v1.saved_model.Builder``) and a frozen graph, its
shim as a TF2 SavedModel (faithful, and with a planted batch-norm epsilon), and a
tiny tf-keras model as an .h5 file and a TF2 SavedModel."""

from __future__ import annotations

import os

import equivtool  # noqa: F401 - before TensorFlow
import numpy as np
import tensorflow as tf

from small_models import SlimNetShim, slim_net

IMAGE = [None, 8, 8, 3]


def export_tf1(folder: str, frozen_path: str) -> dict:
    """The TF1 slim network as a SavedModel and a frozen graph; returns its variable values
    and the frozen graph's ``--graph-outputs``."""
    graph = tf.Graph()
    with graph.as_default():
        images = tf.compat.v1.placeholder(tf.float32, IMAGE, name="images")
        end_points = slim_net(images, False)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            signature = tf.compat.v1.saved_model.predict_signature_def(
                {"images": images}, {"logits": end_points["logits"], "pool1": end_points["pool1"]})
            builder = tf.compat.v1.saved_model.Builder(folder)
            builder.add_meta_graph_and_variables(session, ["serve"],
                                                 signature_def_map={"serving_default": signature})
            builder.save()
            values = {v.name: session.run(v) for v in tf.compat.v1.global_variables()}
            frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
                session, graph.as_graph_def(), [end_points["logits"].op.name, end_points["pool1"].op.name])
    with open(frozen_path, "wb") as f:
        f.write(frozen.SerializeToString())
    return values, f"logits={end_points['logits'].name},pool1={end_points['pool1'].name}"


def export_tf2(folder: str, values: dict, *, input_name: str = "images", **net_kwargs) -> None:
    """The shim layer with the TF1 values, saved with a serving signature."""
    layer = SlimNetShim(**net_kwargs)
    layer(tf.zeros([1, 8, 8, 3]))
    for v in layer.variables:
        v.assign(values[v.name])
    module = tf.Module()
    module.layer = layer

    def serve(**kwargs):
        end_points = layer(kwargs[input_name], training=False)
        return {"logits": end_points["logits"], "pool1": end_points["pool1"]}

    spec = tf.TensorSpec(IMAGE, tf.float32, name=input_name)
    module.serve = tf.function(lambda x: serve(**{input_name: x}), input_signature=[spec])
    tf.saved_model.save(module, folder, signatures={"serving_default": module.serve})


def export_keras(h5_path: str, folder: str) -> None:
    """A tiny tf-keras model as an .h5 file and as a TF2 SavedModel."""
    tf.keras.utils.set_random_seed(1)
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
    values, paths["graph_outputs"] = export_tf1(paths["tf1"], paths["pb"])
    export_tf2(paths["tf2"], values)
    export_tf2(paths["tf2_bad_eps"], values, bn_epsilon=1e-1)  # the planted fault
    export_tf2(paths["tf2_x"], values, input_name="x")
    export_keras(paths["h5"], paths["keras_sm"])
    return paths
