"""Export a TF1 model and its TF2 shim as SavedModels, then compare the artifacts.

What a migration ships: the TF1 graph exported with
``tf.compat.v1.saved_model.Builder`` (what serves today), and the TF2 shim
layer, holding the same variable values, exported with ``tf.saved_model.save``
and a serving signature (what should replace it). ``equivtool compare OLD NEW``
then proves the two artifacts compute the same numbers, and ``--localize``
names the first node where they part.

    python -m examples.exported.export OUT_DIR [--image-size 75] [--plant-fault]

exports Inception-ResNet-v2 (the repository's tf-slim model and shim) to
``OUT_DIR/tf1`` and ``OUT_DIR/tf2`` (with ``--plant-fault``, the TF2 export's
batch norms use epsilon 1e-2 instead of 1e-3), then runs the comparison.
"""

from __future__ import annotations

import argparse
import os
import sys

import equivtool  # noqa: F401 - before TensorFlow
import numpy as np
import tensorflow as tf

OUTPUTS = ("logits", "predictions")


def export_tf1(build, input_shape, folder: str, *, seed: int = 0, frozen_path: str | None = None):
    """Build ``build(images) -> {name: tensor}`` in a fresh graph, initialize its
    variables (seeded), save it as a TF1 SavedModel (tag "serve", signature
    "serving_default") and, with ``frozen_path``, as a frozen GraphDef too.

    Returns the variable values by name and the outputs' tensor names (what
    ``--graph-outputs`` names for the frozen graph).
    """
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        images = tf.compat.v1.placeholder(tf.float32, [None, *input_shape[1:]], name="images")
        outputs = build(images)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            signature = tf.compat.v1.saved_model.predict_signature_def({"images": images}, outputs)
            builder = tf.compat.v1.saved_model.Builder(folder)
            builder.add_meta_graph_and_variables(session, ["serve"],
                                                 signature_def_map={"serving_default": signature})
            builder.save()
            values = {v.name: session.run(v) for v in tf.compat.v1.global_variables()}
            if frozen_path is not None:
                frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
                    session, graph.as_graph_def(), [t.op.name for t in outputs.values()])
                with open(frozen_path, "wb") as f:
                    f.write(frozen.SerializeToString())
    return values, {name: t.name for name, t in outputs.items()}


def export_tf2(layer, call, values: dict, input_shape, folder: str, *, input_name: str = "images") -> None:
    """Build ``layer``, load the TF1 ``values`` into its variables (same names), and
    save it with a "serving_default" signature taking ``input_name`` and returning
    ``call(layer, images)``."""
    layer(tf.zeros([1, *input_shape[1:]]))
    missing = [v.name for v in layer.variables if v.name not in values]
    if missing:
        raise ValueError(f"the TF2 layer has variables the TF1 graph has not: {missing[:5]}")
    for v in layer.variables:
        v.assign(values[v.name])
    module = tf.Module()
    module.layer = layer
    spec = tf.TensorSpec([None, *input_shape[1:]], tf.float32, name=input_name)
    module.serve = tf.function(lambda images: call(layer, images), input_signature=[spec])
    tf.saved_model.save(module, folder, signatures={"serving_default": module.serve})


def export_inception_resnet_v2(out_dir: str, image_size: int = 75, num_classes: int = 10,
                               plant_fault: bool = False) -> tuple[str, str]:
    """Inception-ResNet-v2 (no aux head) as ``out_dir/tf1`` and ``out_dir/tf2``."""
    from ..inception_resnet_v2.keras_shim import make_shim, tf1_forward
    kwargs = {"batch_norm_scale": True, "create_aux_logits": False}
    shape = (1, image_size, image_size, 3)

    def build(images):
        logits, end_points = tf1_forward(images, False, num_classes, **kwargs)
        return {"logits": logits, "predictions": end_points["Predictions"]}

    def call(layer, images):
        logits, end_points = layer(images, training=False)
        return {"logits": logits, "predictions": end_points["Predictions"]}

    tf1, tf2 = os.path.join(out_dir, "tf1"), os.path.join(out_dir, "tf2")
    values, _ = export_tf1(build, shape, tf1)
    shim_kwargs = dict(kwargs, batch_norm_epsilon=1e-2) if plant_fault else kwargs
    export_tf2(make_shim(num_classes, **shim_kwargs), call, values, shape, tf2)
    return tf1, tf2


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--image-size", type=int, default=75, help="at least 75 (default 75)")
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--plant-fault", action="store_true", help="batch-norm epsilon 1e-2 in the TF2 export")
    args = parser.parse_args(argv)
    if args.image_size < 75:
        parser.error("--image-size: Inception-ResNet-v2 needs at least 75 px")
    os.makedirs(args.out_dir, exist_ok=True)
    tf1, tf2 = export_inception_resnet_v2(args.out_dir, args.image_size, args.num_classes, args.plant_fault)
    report = equivtool.compare_models(tf1, tf2, localize=True, input_shapes={"images": [1, args.image_size,
                                                                                      args.image_size, 3]},
                                      val_range={"images": (-1.0, 1.0)})
    print(report)
    print(report.steps[0].data["localization"])
    print(f"\nthe same from the command line:\n  equivtool compare {tf1} {tf2} --localize "
          f"--input-shapes images:1,{args.image_size},{args.image_size},3 --val-range images:-1,1")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
