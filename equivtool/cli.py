"""``equivtool`` command line: doctor | check | demo | audit | build-ops.

Exit codes (all commands): 0 success (environment fine, models equivalent,
run reproducible), 1 the check ran and found a difference, 2 bad arguments or
a target that cannot be loaded (a one-line message, no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time

EXIT_OK, EXIT_DIFFERENT, EXIT_USAGE = 0, 1, 2

# The command line keeps TensorFlow's C++ start-up chatter out of its output
# (an explicit TF_CPP_MIN_LOG_LEVEL in the environment wins).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class UsageError(Exception):
    """A bad argument: printed as one line, exit code 2."""


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def load_target(spec: str, argument: str):
    """Import ``MODULE:ATTR`` (the current directory is importable, as with ``python -m``)."""
    if spec.count(":") != 1 or not all(spec.split(":")):
        raise UsageError(f"{argument}: expected MODULE:NAME (e.g. my_models:tf1_forward), got {spec!r}")
    module_name, attr = spec.split(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UsageError(f"{argument}: cannot import module {module_name!r} ({exc})") from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise UsageError(f"{argument}: module {module_name!r} has no attribute {attr!r}") from None
    if not callable(target):
        raise UsageError(f"{argument}: {spec} is a {type(target).__name__}, expected a callable")
    return target


def parse_shape(text: str) -> tuple:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UsageError(f"--input-shape: expected comma-separated positive integers like 1,299,299,3, got {text!r}") from None
    if not shape or any(d <= 0 for d in shape):
        raise UsageError(f"--input-shape: expected comma-separated positive integers like 1,299,299,3, got {text!r}")
    return shape


def split_names(text: str | None, allowed, argument: str):
    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise UsageError(f"{argument}: unknown name(s) {unknown or [text]}; choose from {', '.join(allowed)}")
    return names


# --------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------

def cmd_doctor(args) -> int:
    from equivtool import _env
    problems = []
    print(f"equivtool doctor (Python {platform.python_version()}, {platform.machine()})")
    try:
        versions = _env.check_versions()
        print(f"  tensorflow      {versions.tensorflow}")
        print(f"  tf-keras        {versions.tf_keras}")
        print(f"  tf-slim         {versions.tf_slim or 'not installed'}")
        print(f"  numpy           {versions.numpy}")
        if versions.tf_slim is None:
            problems.append("tf-slim is not installed: pip install tf-slim==1.1.0")
    except _env.EquivtoolEnvironmentError as exc:
        problems.append(str(exc))
    legacy = _env.legacy_keras_active()
    print(f"  legacy Keras    {'active (tf.keras is tf-keras)' if legacy else 'NOT active'}")
    if not legacy:
        problems.append("tf.keras is not tf-keras: set TF_USE_LEGACY_KERAS=1 before importing TensorFlow")
    slim_state = _env.slim_fix_state()
    print(f"  tf-slim fix     {slim_state}")
    if slim_state == "broken":
        problems.append("tf_keras.legacy_tf_layers cannot be resolved: slim.batch_norm will fail")
    from equivtool import _compat
    for repair in _compat.repairs(import_libraries=True):
        print(f"  {repair.library} repair  {repair.name}: {repair.state}" + (f" ({repair.detail})" if repair.detail else ""))
        if repair.state == "failed":
            problems.append(f"{repair.library} repair failed: {repair.name} ({repair.detail})")
    try:
        import tensorflow as tf
        print(f"  shim            track_tf1_style_variables "
              f"{'available' if hasattr(tf.compat.v1.keras.utils, 'track_tf1_style_variables') else 'MISSING'}")
        devices = [f"{d.device_type}:{d.name.split(':')[-1]}" for d in tf.config.list_physical_devices()]
        print(f"  devices         {', '.join(devices)}")
        build = tf.sysconfig.get_build_info()
        print(f"  TF built with   CUDA {build.get('cuda_version', 'none')}, cuDNN {build.get('cudnn_version', 'none')}")
    except Exception as exc:  # report, don't crash: this is the diagnostic command
        problems.append(f"TensorFlow failed: {exc}")
    try:
        from equivtool.ops import op_status
        status = op_status()
        if status.get("built") and not status.get("error"):
            state = f"built for TF {status.get('built_for_tf')} ({'CPU + CUDA' if status.get('cuda') else 'CPU'}) at {status.get('path')}"
        else:
            state = f"NOT usable: {status.get('error') or 'not built'} (run: equivtool build-ops)"
        print(f"  xent op         {state}")
    except Exception as exc:
        print(f"  xent op         unknown ({exc})")
    if problems:
        print("\nProblems:")
        for problem in problems:
            print(f"  - {problem}")
        return EXIT_DIFFERENT
    print("\nThe environment can run equivtool.")
    return EXIT_OK


def cmd_check(args) -> int:
    import equivtool
    from equivtool._progress import print_progress, write_reports
    tf1_fn = load_target(args.tf1_fn, "TF1_FN")
    tf2_factory = load_target(args.tf2_factory, "TF2_FACTORY")
    shape = parse_shape(args.input_shape)
    steps = split_names(args.steps, equivtool.STEPS, "--steps")
    modes = split_names(args.mode, ("constant", "num_random_ops"), "--mode") or ("constant", "num_random_ops")
    import numpy as np
    inputs = np.random.RandomState(args.seed).standard_normal(shape).astype(np.float32)
    start = time.perf_counter()
    print(f"equivtool check {args.tf1_fn} vs {args.tf2_factory}, input {shape}", flush=True)
    try:
        report = equivtool.check_equivalence(
            tf1_fn, tf2_factory, inputs, steps=steps, modes=modes, tf_function=args.tf_function,
            seed=args.seed, progress=print_progress(start),
            meta={"tf1_fn": args.tf1_fn, "tf2_factory": args.tf2_factory})
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    print()
    print(report)
    write_reports(report, args.json, args.html)
    return EXIT_OK if report.passed else EXIT_DIFFERENT


def cmd_demo(args) -> int:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if repo not in sys.path:
        sys.path.insert(0, repo)
    try:
        from examples.inception_resnet_v2 import parity
    except ModuleNotFoundError as exc:
        raise UsageError("equivtool demo runs examples/inception_resnet_v2 from a source checkout "
                         f"(editable install or the repository as current directory): {exc}") from None
    return parity.main(args.demo_args)


def cmd_audit(args) -> int:
    from equivtool.determinism import audit_main
    if args.runs < 2:
        raise UsageError(f"--runs: expected an int >= 2 (a single run cannot be compared), got {args.runs}")
    try:
        return audit_main(args.target, args.runs, json_path=args.json, html_path=args.html)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_build_ops(args) -> int:
    from equivtool.ops import build_ops
    path = build_ops(verbose=args.verbose)
    print(f"built {path}")
    return EXIT_OK


# --------------------------------------------------------------------------
# parser
# --------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="equivtool", description="Prove a TF1 model migrated to TF2 computes the same numbers.")
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = sub.add_parser("doctor", help="check that this environment can run equivtool")
    doctor.set_defaults(run=cmd_doctor)

    check = sub.add_parser("check", help="run check_equivalence on MODULE:TF1_FN and MODULE:TF2_FACTORY")
    check.add_argument("tf1_fn", metavar="MODULE:TF1_FN", help="tf1_fn(inputs, training) -> outputs")
    check.add_argument("tf2_factory", metavar="MODULE:TF2_FACTORY", help="zero-argument factory of the TF2 layer")
    check.add_argument("--input-shape", required=True, help="e.g. 1,299,299,3 (float32, standard normal)")
    check.add_argument("--steps", default=None, help="comma-separated steps (default: all but optimizer/checkpoint)")
    check.add_argument("--mode", default=None, help="comma-separated random-tool modes")
    check.add_argument("--tf-function", action="store_true", help="call the TF2 layer inside tf.function")
    check.add_argument("--seed", type=int, default=42, help="input and random-tool seed")
    check.add_argument("--html", default=None, help="write an HTML report here")
    check.add_argument("--json", default=None, help="write a JSON report here")
    check.set_defaults(run=cmd_check)

    sub.add_parser("demo", help="Inception-ResNet-v2 proven equivalent (options: equivtool demo --help)")

    audit = sub.add_parser("audit", help="is MODULE:FN bitwise reproducible?")
    audit.add_argument("target", metavar="MODULE:FN")
    audit.add_argument("--runs", type=int, default=3)
    audit.add_argument("--html", default=None)
    audit.add_argument("--json", default=None)
    audit.set_defaults(run=cmd_audit)

    build = sub.add_parser("build-ops", help="(re)build the cross-entropy op against the installed TensorFlow")
    build.add_argument("--verbose", action="store_true")
    build.set_defaults(run=cmd_build_ops)
    return parser


def main(argv=None) -> int:
    import warnings
    warnings.filterwarnings("ignore", message=r".*(is deprecated and will be removed|will be removed in a future version)",
                            category=UserWarning)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] not in ("-h", "--help"):
        from equivtool._quiet import import_tensorflow_quietly
        import_tensorflow_quietly()
    if argv[:1] == ["demo"]:  # everything after "demo" belongs to the demo's own parser
        rest = argv[1:]
        rest = rest[1:] if rest[:1] == ["--"] else rest
        try:
            return cmd_demo(argparse.Namespace(demo_args=rest))
        except UsageError as exc:
            print(f"equivtool demo: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except SystemExit as exc:
            return int(exc.code or 0)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    try:
        return args.run(args)
    except UsageError as exc:
        print(f"equivtool {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
