"""``equivtool check MODULE:TF1_FN MODULE:TF2_FACTORY``: :func:`equivtool.check_equivalence`
from the command line, and the command that re-runs its failing steps localized."""

from __future__ import annotations

import os
import shlex
import time

from equivtool.cli.common import (MAX_SEED, EXIT_DIFFERENT, EXIT_OK, UsageError, check_no_arguments,
                                  check_output_path, check_seed, importable_cwd, inputs_of, load_object, load_target,
                                  split_names)


def run(args) -> int:
    from equivtool.cli.progress import print_progress, write_reports
    from equivtool.engine.registry import MODES, STEPS

    seed = check_seed(args.seed)
    steps = split_names(args.steps, STEPS, "--steps")
    modes = split_names(args.mode, MODES, "--mode") or MODES
    check_output_path(args.json, "--json")
    check_output_path(args.html, "--html")
    outputs = [p for text in args.outputs for p in text.split(",") if p] if args.outputs else None
    inputs, shape = inputs_of(args, seed)
    if args.map and args.rename:
        raise UsageError("--map and --rename: give one (--map proposes the mapping by role; --rename names rules "
                         "or a VariableMapping of your own)")
    if bool(args.tf1_optimizer) != bool(args.tf2_optimizer):
        raise UsageError(f"{'--tf1-optimizer' if args.tf1_optimizer else '--tf2-optimizer'}: give both "
                         "--tf1-optimizer MODULE:FN and --tf2-optimizer MODULE:FN (zero-argument factories of the "
                         "two optimizers)")
    if args.train_steps is not None and args.train_steps < 1:
        raise UsageError(f"--train-steps: expected a whole number >= 1, got {args.train_steps}")
    if args.checkpoint and args.checkpoint != "write" and not (
            os.path.isdir(args.checkpoint) or os.path.exists(args.checkpoint + ".index")):
        raise UsageError(f"--checkpoint: no TF1 checkpoint at {args.checkpoint!r}; expected the prefix Saver.save "
                         "returned (next to PREFIX.index), its folder, or 'write'")
    if (args.map or args.rename) and args.tf1_python:
        raise UsageError(f"{'--map' if args.map else '--rename'}: not with --tf1-python (a mapping is made and "
                         "applied in this interpreter's TF1 build); run the check in process to map variables")
    tolerance = None
    if args.atol or args.rtol:
        from equivtool.comparison.tolerance import tolerance_spec
        try:
            tolerance = tolerance_spec(args.atol, args.rtol)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if set(tolerance) == {"*"}:
            tolerance = tolerance["*"]
    if args.workers >= 2 and not args.tf1_python:
        # the workers import TensorFlow while this process does and loads the targets
        from equivtool.engine.workers import start_workers
        start_workers(args.workers - 1)
    from equivtool import check_equivalence
    with importable_cwd():
        # --tf1-python: MODULE:TF1_FN is imported in that interpreter, not here
        tf1_fn = args.tf1_fn if args.tf1_python else load_target(args.tf1_fn, "TF1_FN")
        tf2_factory = load_target(args.tf2_factory, "TF2_FACTORY")
        check_no_arguments(tf2_factory, args.tf2_factory, "TF2_FACTORY",
                            "def make_layer(): return MyLayer(units=...)")
        rename = load_object(args.rename, "--rename") if args.rename else None
        training = _training_options(args)
        start = time.perf_counter()
        print(f"equivtool check {args.tf1_fn} vs {args.tf2_factory}, input {shape}", flush=True)
        if args.map:
            rename = _proposed_mapping(tf1_fn, tf2_factory, inputs)
        try:
            report = check_equivalence(
                tf1_fn, tf2_factory, inputs, tolerance=tolerance, steps=steps, modes=modes,
                tf_function=args.tf_function,
                graph_rewrites=args.graph_rewrites, seed=seed, progress=print_progress(start),
                localize="all" if args.localize_all else args.localize,
                workers=args.workers, outputs=outputs, strict_tolerances=args.strict_tolerances,
                strict_intermediates=args.strict_intermediates, rename=rename, **training,
                meta={"tf1_fn": args.tf1_fn, "tf2_factory": args.tf2_factory},
                **({"tf1_python": args.tf1_python, "tf1_path": args.tf1_path or ()} if args.tf1_python else {}),
                **({"kernel_floor": True} if args.kernel_floor else {}))
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from None
    print()
    print(report)
    rerun = localize_command(args, report)
    if rerun:
        print(f"\nTo find the first op whose output differs, re-run localized:\n  {rerun}")
    write_reports(report, args.json, args.html)
    return EXIT_OK if report.passed else EXIT_DIFFERENT


def _training_options(args) -> dict:
    """``optimizers``, ``loss_fn``, ``train_steps`` and ``checkpoint`` from their
    options; under ``--tf1-python`` the TF1 halves stay names, imported there."""
    options = {}
    old_side = bool(args.tf1_python)
    if args.tf1_optimizer:
        tf1 = args.tf1_optimizer if old_side else load_target(args.tf1_optimizer, "--tf1-optimizer")
        options["optimizers"] = (tf1, load_target(args.tf2_optimizer, "--tf2-optimizer"))
    if args.loss:
        options["loss_fn"] = args.loss if old_side else load_target(args.loss, "--loss")
    if args.train_steps is not None:
        options["train_steps"] = args.train_steps
    if args.checkpoint:
        options["checkpoint"] = True if args.checkpoint == "write" else args.checkpoint
    return options


def _proposed_mapping(tf1_fn, tf2_factory, inputs):
    """``--map``: :func:`equivtool.map_variables`' mapping, said in one line; an
    incomplete one is refused with the ``resolve()`` call that completes it."""
    from equivtool import map_variables

    try:
        mapping = map_variables(tf1_fn, tf2_factory, inputs)
        mapping.require_complete("--map")
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc).replace("pass the completed mapping as --map=",
                                          "pass the completed mapping with --rename MODULE:OBJ")) from None
    renamed = sum(tf1 != tf2 for tf1, tf2 in mapping.pairs.items())
    extra = [f"{len(mapping.transforms)} with a declared transform"] if mapping.transforms else []
    extra += [f"{len(mapping.by_order)} paired by creation order"] if mapping.by_order else []
    print(f"--map: {len(mapping.pairs)} variables paired by role and structure ({renamed} renamed"
          + "".join(f", {x}" for x in extra) + "); print(equivtool.map_variables(...)) shows the rules", flush=True)
    return mapping


def localize_command(args, report) -> str:
    """The ``equivtool check`` command that localizes this run's failed forward-pass
    steps ("" when it ran localized or none failed)."""
    from equivtool.localize.result import is_localizable
    if args.localize or getattr(args, "localize_all", False):
        return ""
    failed = [s.name for s in report.steps if s.status == "failed" and is_localizable(s.name)]
    if not failed:
        return ""
    steps = ",".join(dict.fromkeys(name.split("/", 1)[0] for name in failed))
    words = ["equivtool", "check", args.tf1_fn, args.tf2_factory, *_input_words(args),
             "--steps", steps, "--seed", str(args.seed)]
    if getattr(args, "map", False):
        words.append("--map")
    if getattr(args, "rename", None):
        words += ["--rename", args.rename]
    modes = sorted({name.split("/")[1] for name in failed if name.startswith("random/")})
    if modes:
        words += ["--mode", ",".join(modes)]
    if args.tf_function:
        words.append("--tf-function")
    if args.graph_rewrites != "as_written":
        words += ["--graph-rewrites", args.graph_rewrites]
    words += [word for text in getattr(args, "outputs", None) or () for word in ("--outputs", text)]
    for flag in ("atol", "rtol"):
        words += [word for text in getattr(args, flag, None) or () for word in (f"--{flag}", text)]
    if getattr(args, "tf1_python", None):  # localized in the TF1 interpreter too
        words += ["--tf1-python", args.tf1_python]
        words += [word for folder in getattr(args, "tf1_path", None) or () for word in ("--tf1-path", folder)]
    words.append("--localize")
    return " ".join(shlex.quote(w) for w in words)


def _input_words(args) -> list:
    """The inputs options of this run, to repeat them."""
    if getattr(args, "inputs", None):
        return ["--inputs", args.inputs]
    if getattr(args, "input", None):
        return [word for spec in args.input for word in ("--input", spec)]
    return ["--input-shape", args.input_shape]


def add_parser(subparsers) -> None:
    check = subparsers.add_parser("check", help="run check_equivalence on MODULE:TF1_FN and MODULE:TF2_FACTORY")
    check.add_argument("tf1_fn", metavar="MODULE:TF1_FN", help="tf1_fn(inputs, training) -> outputs")
    check.add_argument("tf2_factory", metavar="MODULE:TF2_FACTORY", help="zero-argument factory of the TF2 layer")
    check.add_argument("--input-shape", default=None, help="e.g. 1,299,299,3 (float32, standard normal)")
    check.add_argument("--inputs", default=None, metavar="FILE.npz",
                       help="inputs from np.savez: keys arr_0..arr_N give a list, other keys a dict")
    check.add_argument("--input", action="append", default=None, metavar="NAME:SHAPE:DTYPE[:LO,HI]",
                       help="one generated input of a dict (repeatable), e.g. input_ids:2,128:int32:0,30521: "
                            "integers from [LO, HI] (HI included, default 0,1), floats from [LO, HI) (HI "
                            "excluded; without a range standard normal), bool takes no range; a range the "
                            "dtype cannot hold is refused (as compare --val-range)")
    check.add_argument("--outputs", action="append", default=None, metavar="PATTERNS",
                       help="compare only these output leaves: comma-separated patterns, '!' excludes "
                            "(e.g. '!*/depthwise_output'); repeatable")
    check.add_argument("--steps", default=None, help="comma-separated steps (default: all but optimizer/checkpoint)")
    check.add_argument("--mode", default=None, help="comma-separated random-tool modes")
    check.add_argument("--tf-function", action="store_true", help="call the TF2 layer inside tf.function")
    check.add_argument("--tf1-optimizer", default=None, metavar="MODULE:FN",
                       help="zero-argument factory of the TF1 optimizer; with --tf2-optimizer adds the "
                            "optimizer step (and the resume step's optimizers)")
    check.add_argument("--tf2-optimizer", default=None, metavar="MODULE:FN",
                       help="zero-argument factory of the TF2 optimizer (the TF1 one's counterpart)")
    check.add_argument("--train-steps", type=int, default=None, metavar="N",
                       help="optimizer steps of the optimizer and resume steps (default 3)")
    check.add_argument("--loss", default=None, metavar="MODULE:FN",
                       help="loss_fn(outputs, regularization_loss) used on both sides (default: mean of squares "
                            "of the primary output plus the regularization loss)")
    check.add_argument("--checkpoint", default=None, metavar="PATH|write",
                       help="a TF1 checkpoint loaded into both sides (adds the checkpoint step; with --steps ...,resume "
                            "and the optimizers, training resumes from it), or 'write' to have the TF1 side "
                            "write one")
    check.add_argument("--map", action="store_true",
                       help="pair the variables by role and structure (equivtool.map_variables), for a native "
                            "rewrite whose variable names differ; an incomplete mapping is refused with the "
                            "resolve() call that completes it")
    check.add_argument("--rename", default=None, metavar="MODULE:OBJ",
                       help="rename rules (TF2 name -> TF1 name) or a VariableMapping, as rename= takes them")
    check.add_argument("--graph-rewrites", choices=("as_written", "tensorflow_default"), default="as_written",
                       help="as_written (default): Grappler's numerics-changing passes off on both sides, "
                            "so the verdict does not depend on the CPU; tensorflow_default: prove the "
                            "fused graphs TensorFlow deploys")
    check.add_argument("--localize", action="store_true",
                       help="for failing forward-pass steps, find the first TF op whose output differs")
    check.add_argument("--localize-all", action="store_true",
                       help="--localize for every forward-pass step, passing ones included")
    check.add_argument("--strict-intermediates", action="store_true",
                       help="with --localize: fail a step whose outputs pass while an intermediate op differs "
                            "beyond tolerance")
    check.add_argument("--workers", type=int, default=1,
                       help="processes running the TF1 and TF2 sides of each step, this one included (default 1: this process only)")
    check.add_argument("--seed", type=int, default=42, help=f"input and random-tool seed (0 to {MAX_SEED})")
    check.add_argument("--atol", action="append", default=None, metavar="[OUTPUT:]VALUE",
                       help="absolute tolerance, for every leaf or for the output leaves OUTPUT matches "
                            "(a name or pattern, e.g. 'end_points/logits'); repeatable; default the guide's 1e-5")
    check.add_argument("--rtol", action="append", default=None, metavar="[OUTPUT:]VALUE",
                       help="relative tolerance, as --atol; default the guide's 1e-6")
    check.add_argument("--strict-tolerances", action="store_true",
                       help="an OUTPUT of --atol/--rtol that matches no output leaf is an error (exit 2), "
                            "not a warning")
    check.add_argument("--tf1-python", default=None, metavar="PATH",
                       help="run the TF1 side in this TensorFlow 1.x interpreter (equivtool tf1-env DIR); "
                            "MODULE:TF1_FN is imported there")
    check.add_argument("--tf1-path", action="append", default=None, metavar="DIR",
                       help="with --tf1-python: a folder on that interpreter's sys.path (repeatable; the "
                            "current folder is always on it)")
    check.add_argument("--kernel-floor", action="store_true",
                       help="with --tf1-python: run the TF1 side again there with one ULP of rounding injected "
                            "at every op, and judge each compared leaf against that kernel floor "
                            "(docs/noise-floor.md)")
    check.add_argument("--html", default=None, help="write an HTML report here")
    check.add_argument("--json", default=None, help="write a JSON report here")
    check.set_defaults(run=run)
