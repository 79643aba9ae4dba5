"""Export a TF1 model and its TF2 shim as SavedModels, then compare the artifacts.

What a migration ships: the TF1 graph exported with
``tf.compat.v1.saved_model.Builder`` (what serves today), and the TF2 shim
layer, holding the same variable values, exported with ``tf.saved_model.save``
and a serving signature (what should replace it). ``equivtool compare OLD NEW``
then proves the two artifacts compute the same numbers, and ``--localize``
names the first node where they part.

    equivtool demo --exported [OUT_DIR] [--image-size 299] [--html report.html]
    python -m examples.exported.export [OUT_DIR] ...   (the same)

exports Inception-ResNet-v2 (the repository's tf-slim model and shim) to
``OUT_DIR/tf1`` and ``OUT_DIR/tf2``, and the planted fault (the TF2 export's
batch norms with epsilon 1e-2 instead of 1e-3) to ``OUT_DIR/tf2_bn_epsilon``;
then compares the faithful pair (EQUIVALENT) and localizes the fault.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

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
            values = session.run({v.name: v for v in tf.compat.v1.global_variables()})  # one run, not one per variable
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
                               fault_dir: str | None = None) -> tuple[str, str]:
    """Inception-ResNet-v2 (no aux head) as ``out_dir/tf1`` and ``out_dir/tf2``; with
    ``fault_dir``, also a TF2 export there whose batch norms use epsilon 1e-2, not 1e-3."""
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
    export_tf2(make_shim(num_classes, **kwargs), call, values, shape, tf2)
    if fault_dir is not None:
        export_tf2(make_shim(num_classes, **kwargs, batch_norm_epsilon=1e-2), call, values, shape, fault_dir)
    return tf1, tf2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="equivtool demo --exported", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", default=None,
                        help="where to export the models (default: a temporary folder, removed at the end)")
    parser.add_argument("--image-size", type=int, default=299, help="at least 75 (default 299)")
    parser.add_argument("--num-classes", type=int, default=1001, help="classes (default 1001)")
    parser.add_argument("--html", default=None, help="write the faithful pair's HTML report here")
    parser.add_argument("--json", default=None, help="write the faithful pair's JSON report here")
    return parser


def main(argv=None) -> int:
    """Export, compare the faithful pair (EQUIVALENT), then localize the planted fault.

    Exits 0 only when the faithful pair is EQUIVALENT and the planted fault is NOT
    EQUIVALENT with its first diverging node a batch norm.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.image_size < 75:
        parser.error("--image-size: Inception-ResNet-v2 needs at least 75 px")
    for flag, path in (("--html", args.html), ("--json", args.json)):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            parser.error(f"{flag}: the folder of {path!r} does not exist")
    with contextlib.ExitStack() as stack:
        out_dir = args.out_dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="equivtool-exported-"))
        os.makedirs(out_dir, exist_ok=True)
        return _demo(out_dir, args)


def _demo(out_dir: str, args) -> int:
    size = args.image_size
    fault = os.path.join(out_dir, "tf2_bn_epsilon")
    started = time.perf_counter()
    print(f"[1/3] exporting Inception-ResNet-v2 ({size} px, {args.num_classes} classes) to {out_dir}:\n"
          "      tf1/ (the tf-slim graph, tf.compat.v1.saved_model.Builder), tf2/ (its shim, tf.saved_model.save)\n"
          "      and tf2_bn_epsilon/ (the shim with batch-norm epsilon 1e-2 instead of 1e-3: the planted fault)",
          flush=True)
    tf1, tf2 = export_inception_resnet_v2(out_dir, size, args.num_classes, fault_dir=fault)
    print(f"      done in {time.perf_counter() - started:.0f} s", flush=True)
    options = {"input_shapes": {"images": [1, size, size, 3]}, "val_range": {"images": (-1.0, 1.0)}}
    print("\n[2/3] equivtool compare tf1 tf2: the faithful pair", flush=True)
    report = equivtool.compare_models(tf1, tf2, **options)
    print(report)
    if args.html:
        report.to_html(args.html)
    if args.json:
        report.to_json(args.json)
    print("\n[3/3] equivtool compare tf1 tf2_bn_epsilon --localize: the planted fault", flush=True)
    faulty = equivtool.compare_models(tf1, fault, localize=True, **options)
    found = faulty.steps[0].data.get("localization")
    print(faulty.verdict)
    print(found)
    localized = found is not None and found.status == "diverged" and "FusedBatchNorm" in (found.tf2_type or "")
    print(f"\nthe same from the command line:\n  equivtool compare {tf1} {tf2} "
          f"--input-shapes images:1,{size},{size},3 --val-range images:-1,1\n"
          f"  equivtool compare {tf1} {fault} --localize --input-shapes images:1,{size},{size},3 "
          "--val-range images:-1,1")
    ok = report.passed and not faulty.passed and localized
    print(f"\n{'OK' if ok else 'FAILED'}: the faithful pair: {report.verdict}; the planted fault: "
          f"{faulty.verdict}" + (f", first diverging at {found.tf2_op}" if localized else ", not localized to "
                                 "a batch norm"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
