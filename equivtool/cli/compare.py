"""``equivtool compare OLD NEW``: :func:`equivtool.compare_models` from the command line.

Exit codes: 0 equivalent, 1 not equivalent or inconclusive, 2 a usage, load or
format error, printed as one line (never a traceback).
"""

from __future__ import annotations

import os
import sys

from equivtool._base.errors import short
from equivtool.cli.common import EXIT_DIFFERENT, EXIT_OK, EXIT_USAGE, check_output_path, importable_cwd, load_target


def add_parser(subparsers) -> None:
    compare = subparsers.add_parser(
        "compare", help="compare two exported models (SavedModel, frozen .pb, .keras or .h5 file of either Keras, golden record)",
        description="Compare two exported models output by output (and, with --localize, node by node). "
                    "OLD and NEW are each a SavedModel folder (TF1 or TF2), a frozen graph .pb, a tf-keras "
                    ".h5/.keras file, or a golden record .npz.",
        epilog="Exit codes: 0 equivalent, 1 not equivalent or inconclusive, 2 usage, load or format error.")
    compare.add_argument("old", metavar="OLD")
    compare.add_argument("new", metavar="NEW")
    compare.add_argument("--signature", default="serving_default",
                         help="signature name of both sides (default serving_default)")
    compare.add_argument("--tags", default="serve", help="MetaGraph tags of both sides, comma-separated "
                                                         "(default serve)")
    compare.add_argument("--old-signature", default=None, metavar="NAME", help="OLD's signature (else --signature)")
    compare.add_argument("--new-signature", default=None, metavar="NAME", help="NEW's signature (else --signature)")
    compare.add_argument("--old-tags", default=None, metavar="TAGS", help="OLD's MetaGraph tags (else --tags)")
    compare.add_argument("--new-tags", default=None, metavar="TAGS", help="NEW's MetaGraph tags (else --tags)")
    compare.add_argument("--graph-inputs", action="append", default=None, metavar="NAME=TENSOR,...",
                         help="a .pb side's input tensors, with the names used for matching")
    compare.add_argument("--graph-outputs", action="append", default=None, metavar="NAME=TENSOR,...")
    compare.add_argument("--input-shapes", action="append", default=None, metavar="NAME:D,D,...",
                         help="shape of an input with unknown dimensions (else they are 1); repeatable")
    compare.add_argument("--val-range", action="append", default=None, metavar="NAME:LO,HI",
                         help="range of generated values (default 0,1): integers from [LO, HI] (HI included), "
                              "floats from [LO, HI) (HI excluded), as check --input; a range the dtype cannot "
                              "hold is refused; repeatable")
    compare.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (default 0)")
    compare.add_argument("--inputs", default=None, metavar="FILE.npz",
                         help="inputs: one array per input name (not with --data-loader, --input-shapes, "
                              "--val-range)")
    compare.add_argument("--data-loader", default=None, metavar="FILE.py:FN",
                         help="FN() yields dicts input name -> array, one per batch (not with --inputs, "
                              "--input-shapes, --val-range)")
    compare.add_argument("--batches", type=int, default=1, help="batches to generate or load (default 1)")
    compare.add_argument("--map-inputs", action="append", default=None, metavar="OLD=NEW,...")
    compare.add_argument("--map-outputs", action="append", default=None, metavar="OLD=NEW,...")
    compare.add_argument("--atol", action="append", default=None, metavar="[OUT:]V", help="repeatable")
    compare.add_argument("--rtol", action="append", default=None, metavar="[OUT:]V", help="repeatable")
    compare.add_argument("--strict-tolerances", action="store_true",
                         help="an OUT of --atol/--rtol that matches no compared output is an error (exit 2), "
                              "not a note")
    compare.add_argument("--outputs", action="append", default=None, metavar="PATTERNS",
                         help="compare only the outputs these comma-separated patterns match ('logits', "
                              "'pool*'; '!aux*' leaves out); a pattern matching no output is an error; "
                              "repeatable")
    compare.add_argument("--localize", action="store_true",
                         help="find the first node, in topological order, whose output differs")
    compare.add_argument("--strict-intermediates", action="store_true",
                         help="with --localize: fail when the outputs agree but an intermediate node differs "
                              "beyond tolerance (by default the verdict line names it)")
    compare.add_argument("--save-outputs", default=None, metavar="FILE.npz",
                         help="write OLD's golden record (inputs, outputs; intermediates with --localize), "
                              "atomically; never over OLD or NEW")
    compare.add_argument("--overwrite", action="store_true", help="replace an existing --save-outputs file")
    compare.add_argument("--load-op-library", action="append", default=[], metavar="PATH",
                         help="a custom-op library the models need; repeatable")
    compare.add_argument("--graph-rewrites", choices=("as_written", "tensorflow_default"), default="as_written",
                         help="as_written (default): Grappler's numerics-changing passes off in both sides' "
                              "sessions; tensorflow_default: TensorFlow's defaults (the verdict may depend on the CPU)")
    compare.add_argument("--old-python", default=None, metavar="PATH",
                         help="run OLD (a TF1 SavedModel or .pb) in this interpreter, e.g. a TensorFlow 1.15 "
                              "one made by `equivtool tf1-env DIR`, with the record-script recorder")
    compare.add_argument("--factory", default=None, metavar="MODULE:FUNCTION",
                         help="for a Keras 3 .weights.h5 side: the zero-argument function building its model")
    compare.add_argument("--json", default=None, help="write a JSON report here")
    compare.add_argument("--html", default=None, help="write an HTML report here")
    compare.set_defaults(run=run)



def _factory(spec):
    """``--factory MODULE:FUNCTION`` as the callable it names (the current folder importable)."""
    if spec is None:
        return None
    with importable_cwd():
        return load_target(spec, "--factory")


def run(args) -> int:
    from equivtool.exported import compare_models
    try:
        check_output_path(args.json, "--json")
        check_output_path(args.html, "--html")
        print(f"equivtool compare {args.old} vs {args.new}", flush=True)
        report = compare_models(
            args.old, args.new, signature=args.signature, tags=args.tags, graph_inputs=args.graph_inputs,
            graph_outputs=args.graph_outputs, input_shapes=args.input_shapes, val_range=args.val_range,
            seed=args.seed, inputs=args.inputs, data_loader=args.data_loader, batches=args.batches,
            map_inputs=args.map_inputs, map_outputs=args.map_outputs, atol=args.atol, rtol=args.rtol,
            localize=args.localize, strict_intermediates=args.strict_intermediates,
            save_outputs=args.save_outputs, overwrite=args.overwrite,
            load_op_library=args.load_op_library, graph_rewrites=args.graph_rewrites, old_python=args.old_python,
            outputs=[p for text in args.outputs for p in text.split(",") if p] if args.outputs else None,
            strict_tolerances=args.strict_tolerances, old_signature=args.old_signature,
            new_signature=args.new_signature, old_tags=args.old_tags, new_tags=args.new_tags,
            factory=_factory(args.factory))
    except ValueError as exc:  # the CLI's UsageError included
        print(f"equivtool compare: error: {short(exc, None)}", file=sys.stderr)
        if getattr(exc, "stderr", None) and args.json:  # the old interpreter's whole output, kept
            _write_error_report(args, exc)
        return EXIT_USAGE
    print(report)
    for step in report.steps:  # a localization is in the details of failing steps; show it when passed too
        found = step.data.get("localization")
        if found is not None and step.passed:
            print(found)
    from equivtool.cli.progress import write_reports
    write_reports(report, args.json, args.html)
    return EXIT_OK if report.passed else EXIT_DIFFERENT


def _write_error_report(args, exc) -> None:
    """A JSON report of one errored step holding what the old interpreter wrote on stderr."""
    from equivtool.report import EquivalenceReport, StepResult
    step = StepResult(name="outputs", title="signature outputs", status="error", seconds=0.0,
                      message=short(exc, None), data={"old_interpreter_stderr": exc.stderr})
    report = EquivalenceReport((step,), {"command": "compare", "old": args.old, "new": args.new,
                                         "old_python": args.old_python})
    report.to_json(args.json)
    print(f"JSON report (the old interpreter's stderr): {os.path.abspath(args.json)}", file=sys.stderr)
