"""``equivtool`` command line: doctor | check | demo | audit | build-ops | convert-checkpoint | tf1-env.

Exit codes (all commands):

* 0: success (environment fine, models EQUIVALENT, run reproducible);
* 1: the check ran and did not pass: a difference, an error inside a step, or
  an INCONCLUSIVE verdict (nothing that could differ was compared), or
  ``doctor`` found a problem;
* 2: bad usage: bad arguments, a target that cannot be loaded (its module
  raises, has a syntax error or calls ``sys.exit`` at import), an audit target
  that raises or needs arguments, a report path that cannot be written, a
  failed ``build-ops``. Always one line on stderr, never a traceback;
* 130: interrupted (Ctrl-C): one line, ``interrupted``, on stderr.

Importing this module has no side effects; ``main`` silences TensorFlow's
start-up notices (``equivtool._platform.quiet``) before it imports TensorFlow.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import os
import pkgutil
import platform
import shlex
import sys
import tempfile
import time
import traceback
from typing import Callable, Iterator, Optional

from equivtool._platform import doctor as _doctor  # its checks import what they read when they run
from equivtool._platform.doctor import DOCTOR_CHECKS  # the list `equivtool doctor` runs (tests plant theirs)

EXIT_OK, EXIT_DIFFERENT, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C

# The largest --input-shape the command line allocates: 2**28 float32 values (1 GiB).
MAX_INPUT_ELEMENTS = 2 ** 28
# numpy.random.RandomState accepts seeds in [0, 2**32).
MAX_SEED = 2 ** 32 - 1


class UsageError(ValueError):
    """A bad argument or target: printed as one line, exit code 2."""


# --------------------------------------------------------------------------
# loading MODULE:ATTR
# --------------------------------------------------------------------------

@contextlib.contextmanager
def importable_cwd() -> Iterator[None]:
    """Make the current directory importable for the duration of a command.

    It is appended to ``sys.path``, so an installed dependency wins over a
    file of the same name in the current directory (``matplotlib.py``), and
    removed again on the way out.
    """
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.append(cwd)
    try:
        yield
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(cwd)


def _where(exc: BaseException) -> str:
    """" (at path:line)" for the innermost frame of ``exc``'s traceback, or for a SyntaxError its line."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (at {exc.filename}:{exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _import_module(module_name: str, argument: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UsageError(f"{argument}: cannot import module {module_name!r} ({exc})") from None
        raise UsageError(f"{argument}: cannot import module {module_name!r}: importing it raised "
                         f"ModuleNotFoundError: {exc}{_where(exc)}") from None
    except SystemExit as exc:
        raise UsageError(f"{argument}: cannot import module {module_name!r}: it called "
                         f"sys.exit({exc.code!r}) while being imported") from None
    except Exception as exc:  # noqa: BLE001 - SyntaxError, or anything the module's code raises
        raise UsageError(f"{argument}: cannot import module {module_name!r}: importing it raised "
                         f"{type(exc).__name__}: {exc}{_where(exc)}") from None


def load_target(spec: str, argument: str) -> Callable:
    """The callable named by ``MODULE:ATTR`` (``ATTR`` may be dotted: ``obj.method``).

    Resolved with :func:`pkgutil.resolve_name`; call it inside
    :func:`importable_cwd` to import from the current directory, as
    ``python -m`` would. Every failure is a :class:`UsageError` naming
    ``argument``.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr or ":" in attr:
        raise UsageError(f"{argument}: expected MODULE:NAME (e.g. my_models:tf1_forward), got {spec!r}")
    if module_name.startswith("."):
        raise UsageError(f"{argument}: relative module names are not supported, got {spec!r}; "
                         "write the module's full name (e.g. my_package.models:tf1_forward)")
    _import_module(module_name, argument)
    try:
        target = pkgutil.resolve_name(spec)
    except AttributeError:
        raise UsageError(f"{argument}: module {module_name!r} has no attribute {attr!r}") from None
    except ValueError:
        raise UsageError(f"{argument}: expected MODULE:NAME (e.g. my_models:tf1_forward), got {spec!r}") from None
    if not callable(target):
        raise UsageError(f"{argument}: {spec} is a {type(target).__name__}, expected a callable")
    return target


# --------------------------------------------------------------------------
# checking arguments
# --------------------------------------------------------------------------

def parse_shape(text: str) -> tuple:
    expected = "expected comma-separated positive integers like 1,299,299,3"
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UsageError(f"--input-shape: {expected}, got {text!r}") from None
    if not shape or any(d <= 0 for d in shape):
        raise UsageError(f"--input-shape: {expected}, got {text!r}")
    size = 1
    for d in shape:
        size *= d
    if size > MAX_INPUT_ELEMENTS:
        raise UsageError(f"--input-shape: {text} holds {size} values; the command line allocates at most "
                         f"{MAX_INPUT_ELEMENTS} (1 GiB of float32). Use a smaller batch or check_equivalence.")
    return shape


def check_seed(seed: int) -> int:
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"--seed: expected an integer from 0 to {MAX_SEED}, got {seed}")
    return seed


def split_names(text: Optional[str], allowed, argument: str):
    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise UsageError(f"{argument}: unknown name(s) {unknown or [text]}; choose from {', '.join(allowed)}")
    return names


def check_output_path(path: Optional[str], argument: str) -> None:
    """Fail now, before the run, if a report cannot be written to ``path``."""
    if path is None:
        return
    full = os.path.abspath(path)
    folder = os.path.dirname(full)
    if os.path.isdir(full):
        raise UsageError(f"{argument}: {path!r} is a directory; expected a file path")
    if not os.path.isdir(folder):
        raise UsageError(f"{argument}: cannot write {path!r}: folder {folder!r} does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=".equivtool-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{argument}: cannot write {path!r}: {exc.strerror or exc}") from None
    if argument == "--html":
        from equivtool._base import render as _render
        try:
            _render.matplotlib_figure()
        except ImportError as exc:
            raise UsageError(f"--html: {exc}") from None


# --------------------------------------------------------------------------
# doctor: the checks live in equivtool._platform.doctor (each returns (ok, text))
# --------------------------------------------------------------------------

def cmd_doctor(args) -> int:
    _doctor.clear_cache()
    problems = []
    print(f"equivtool doctor (Python {platform.python_version()}, {platform.machine()})")
    checks = list(DOCTOR_CHECKS)
    if getattr(args, "tf1_python", None) is not None:
        checks += _doctor.tf1_python_checks(args.tf1_python)
    for label, check in checks:
        try:
            ok, text = check()
        except Exception as exc:  # noqa: BLE001 - report, don't crash: this is the diagnostic command
            ok, text = False, f"check failed: {type(exc).__name__}: {exc}"
        print(f"  {label:<15} {text}")
        if not ok:
            problems.append(f"{label}: {text}")
    if problems:
        print("\nProblems:")
        for problem in problems:
            print(f"  - {problem}")
        return EXIT_DIFFERENT
    print("\nThe environment can run equivtool.")
    return EXIT_OK


# --------------------------------------------------------------------------
# check, demo, audit, build-ops
# --------------------------------------------------------------------------

def cmd_check(args) -> int:
    from equivtool import check_equivalence
    from equivtool._base.progress import print_progress, write_reports
    from equivtool.engine.registry import MODES, STEPS

    seed = check_seed(args.seed)
    steps = split_names(args.steps, STEPS, "--steps")
    modes = split_names(args.mode, MODES, "--mode") or MODES
    check_output_path(args.json, "--json")
    check_output_path(args.html, "--html")
    outputs = [p for text in args.outputs for p in text.split(",") if p] if args.outputs else None
    if args.input_shape and not (args.inputs or args.input):
        shape = parse_shape(args.input_shape)
        import numpy as np
        try:
            inputs = np.random.RandomState(seed).standard_normal(shape).astype(np.float32)
        except (MemoryError, ValueError) as exc:
            raise UsageError(f"--input-shape: cannot allocate an input of shape {shape}: "
                             f"{type(exc).__name__}: {exc}") from None
    else:
        from equivtool._base.cli_inputs import InputError, cli_inputs
        try:
            inputs, shape = cli_inputs(args.input_shape, args.inputs, args.input, seed, MAX_INPUT_ELEMENTS)
        except InputError as exc:
            raise UsageError(str(exc)) from None
    tolerance = None
    if args.atol or args.rtol:
        from equivtool._base.cli_tolerances import tolerance_spec
        try:
            tolerance = tolerance_spec(args.atol, args.rtol)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if set(tolerance) == {"*"}:
            tolerance = tolerance["*"]
    with importable_cwd():
        # --tf1-python: MODULE:TF1_FN is imported in that interpreter, not here
        tf1_fn = args.tf1_fn if args.tf1_python else load_target(args.tf1_fn, "TF1_FN")
        tf2_factory = load_target(args.tf2_factory, "TF2_FACTORY")
        _check_no_arguments(tf2_factory, args.tf2_factory, "TF2_FACTORY",
                            "def make_layer(): return MyLayer(units=...)")
        start = time.perf_counter()
        print(f"equivtool check {args.tf1_fn} vs {args.tf2_factory}, input {shape}", flush=True)
        try:
            report = check_equivalence(
                tf1_fn, tf2_factory, inputs, tolerance=tolerance, steps=steps, modes=modes,
                tf_function=args.tf_function,
                graph_rewrites=args.graph_rewrites, seed=seed, progress=print_progress(start),
                localize="all" if args.localize_all else args.localize,
                workers=args.workers, outputs=outputs, strict_tolerances=args.strict_tolerances,
                strict_intermediates=args.strict_intermediates,
                meta={"tf1_fn": args.tf1_fn, "tf2_factory": args.tf2_factory},
                **({"tf1_python": args.tf1_python, "tf1_path": args.tf1_path or ()} if args.tf1_python else {}))
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from None
    print()
    print(report)
    rerun = "" if args.tf1_python else localize_command(args, report)  # (not yet localized in the TF1 interpreter)
    if rerun:
        print(f"\nTo find the first op whose output differs, re-run localized:\n  {rerun}")
    write_reports(report, args.json, args.html)
    return EXIT_OK if report.passed else EXIT_DIFFERENT


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
    words.append("--localize")
    return " ".join(shlex.quote(w) for w in words)


def _input_words(args) -> list:
    """The inputs options of this run, to repeat them."""
    if getattr(args, "inputs", None):
        return ["--inputs", args.inputs]
    if getattr(args, "input", None):
        return [word for spec in args.input for word in ("--input", spec)]
    return ["--input-shape", args.input_shape]


def cmd_demo(args) -> int:
    """``equivtool demo``: the Inception-ResNet-v2 parity demo; with ``--exported`` the
    same model exported as SavedModels and compared (``examples/exported/export.py``);
    with ``--tf1-python PATH`` a tf.contrib model run in that TensorFlow 1.15
    interpreter against its TF2 rewrite (``examples/contrib_tf1/parity.py``)."""
    rest = list(args.demo_args)
    exported = "--exported" in rest
    if exported:
        rest.remove("--exported")
    contrib = any(arg == "--tf1-python" or arg.startswith("--tf1-python=") for arg in rest)
    module = _example("exported.export" if exported else
                      "contrib_tf1.parity" if contrib else "inception_resnet_v2.parity")
    return module.main(rest)


def _example(name: str):
    """The example module ``name``: an installed equivtool ships the examples as
    ``equivtool.examples``; a source checkout has them as the repository's ``examples/``."""
    import importlib
    import importlib.util
    if importlib.util.find_spec("equivtool.examples") is not None:
        return importlib.import_module(f"equivtool.examples.{name}")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    added = repo not in sys.path
    if added:
        sys.path.append(repo)
    try:
        return importlib.import_module(f"examples.{name}")
    except ModuleNotFoundError as exc:
        raise UsageError("equivtool demo needs the examples: install equivtool, or run it "
                         f"from a source checkout: {exc}") from None
    finally:
        if added:
            with contextlib.suppress(ValueError):
                sys.path.remove(repo)


def _check_runs(runs) -> int:
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise UsageError(f"--runs: expected an int >= 2 (a single run cannot be compared), got {runs!r}")
    return runs


def _check_no_arguments(fn: Callable, target: str, argument: str = "MODULE:FN",
                        wrap: str = "def step(): return fn(batch)") -> None:
    """A :class:`UsageError` naming the first parameter ``fn`` needs, unless it can be called with none."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read: let the call decide
        return
    try:
        signature.bind()
    except TypeError:
        required = [name for name, p in signature.parameters.items() if p.default is p.empty
                    and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        raise UsageError(f"{argument}: {target} takes arguments {signature}; parameter {required[0]!r} has no "
                         f"default; expected a zero-argument callable (wrap it: {wrap})") from None


def audit_main(target: str, runs: int, json_path: Optional[str] = None, html_path: Optional[str] = None) -> int:
    """``equivtool audit MODULE:FN --runs N``: print the report; 0 if it passed, 1 if not.

    ``MODULE:FN`` names a zero-argument callable (a plain function, a
    ``tf.function``, or any attribute path ``MODULE:obj.method``) that performs
    the step and returns its tensors; it is imported from the current
    directory too. The state to restore is found as
    :func:`equivtool.audit_determinism` finds it (what FN captures, its
    tf.function graph, a captured session); FN may say more with attributes:

    ``FN.audit_variables``
        the variables (or a zero-argument callable returning them);
    ``FN.audit_endpoints``
        the ``endpoints`` argument (a key of FN's returned dict, or a callable).

    A bad target (its module cannot be imported, unknown attribute, not
    callable, needs arguments, raises when run) raises :class:`UsageError`
    (a ``ValueError``) with a one-line message: the CLI exits with code 2.
    """
    from equivtool._base.progress import write_reports
    from equivtool._base.stack import innermost_user_frame
    from equivtool.determinism import audit_determinism

    runs = _check_runs(runs)
    check_output_path(json_path, "--json")
    check_output_path(html_path, "--html")
    with importable_cwd():
        fn = load_target(target, "MODULE:FN")
        _check_no_arguments(fn, target)
        variables = getattr(fn, "audit_variables", None)
        if callable(variables) and not hasattr(variables, "variables"):
            variables = variables()
        endpoints = getattr(fn, "audit_endpoints", None)
        try:
            report = audit_determinism(fn, runs=runs, variables=variables, endpoints=endpoints)
        except Exception as exc:  # noqa: BLE001 - the target's own failure, as one line
            where = innermost_user_frame(traceback.extract_tb(exc.__traceback__))
            raise UsageError(f"MODULE:FN: auditing {target} failed: {type(exc).__name__}: {exc}"
                             + (f" (at {where})" if where else "")) from None
    print(report)
    write_reports(report, json_path, html_path)
    return EXIT_OK if report.passed else EXIT_DIFFERENT


def cmd_audit(args) -> int:
    return audit_main(args.target, args.runs, json_path=args.json, html_path=args.html)


def cmd_tf1_env(args) -> int:
    from equivtool._platform import tf1_python as _tf1
    try:
        found, created = _tf1.create_env(args.dir, args.python, log=lambda text: print(text, flush=True))
    except _tf1.Tf1PythonError as exc:
        raise UsageError(str(exc)) from None
    print(f"{'created' if created else 'reused'} {found}")
    print(f"old side: equivtool compare --old-python {shlex.quote(found.path)} OLD NEW")
    return EXIT_OK


def cmd_build_ops(args) -> int:
    from equivtool.ops import build_ops
    from equivtool.ops._build import BuildError
    try:
        path = build_ops(verbose=args.verbose)
    except (BuildError, OSError) as exc:
        text = str(exc)
        if args.verbose:
            print(text, file=sys.stderr)
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        hint = "" if args.verbose else "; run `equivtool build-ops --verbose` for the compiler's output"
        raise UsageError(f"building the op failed: {first}{hint}") from None
    print(f"built {path}")
    return EXIT_OK


# --------------------------------------------------------------------------
# parser
# --------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are one line pointing to ``--help`` (exit 2), not its usage block.
    Subcommands' parsers are of the same class (``add_subparsers`` uses the parent's)."""

    def error(self, message: str):
        print(f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="equivtool", description="Prove a TF1 model migrated to TF2 computes the same numbers.",
        epilog="Exit codes: 0 passed, 1 not passed (different, error or inconclusive), 2 bad usage.")
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = sub.add_parser("doctor", help="check that this environment can run equivtool")
    doctor.add_argument("--tf1-python", default=None, metavar="PATH",
                        help="also check an old interpreter: its Python, TensorFlow 1.x and tf.contrib")
    doctor.set_defaults(run=cmd_doctor)

    tf1_env = sub.add_parser(
        "tf1-env", help="create (or reuse) a TensorFlow 1.15 environment in DIR for the old side",
        description="Create a virtual environment in DIR with TensorFlow 1.15 (tensorflow-cpu==1.15.0, "
                    "numpy<1.19, protobuf<3.21) from a Python 3.6 or 3.7 (--python, else pyenv's, else "
                    "python3.7/python3.6 on PATH). A complete one is reused. Prints the interpreter to pass "
                    "as --old-python / --tf1-python.")
    tf1_env.add_argument("dir", metavar="DIR")
    tf1_env.add_argument("--python", default=None, metavar="PY", help="the Python 3.6/3.7 to build it from")
    tf1_env.set_defaults(run=cmd_tf1_env)

    check = sub.add_parser("check", help="run check_equivalence on MODULE:TF1_FN and MODULE:TF2_FACTORY")
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
    check.add_argument("--html", default=None, help="write an HTML report here")
    check.add_argument("--json", default=None, help="write a JSON report here")
    check.set_defaults(run=cmd_check)

    sub.add_parser("demo", help="Inception-ResNet-v2 proven equivalent (options: equivtool demo --help); "
                                "--exported: the same as exported SavedModels, and a planted fault localized; "
                                "--tf1-python PATH: a tf.contrib model run in that TensorFlow 1.15")

    audit = sub.add_parser("audit", help="is MODULE:FN bitwise reproducible?")
    audit.add_argument("target", metavar="MODULE:FN")
    audit.add_argument("--runs", type=int, default=3)
    audit.add_argument("--html", default=None)
    audit.add_argument("--json", default=None)
    audit.set_defaults(run=cmd_audit)

    build = sub.add_parser("build-ops", help="(re)build the cross-entropy op against the installed TensorFlow")
    build.add_argument("--verbose", action="store_true")
    build.set_defaults(run=cmd_build_ops)
    from equivtool.exported import _cli as exported_cli  # compare, record-script
    exported_cli.add_parsers(sub, check_output_path)

    from equivtool.checkpoints import _cli as convert_cli  # its own module; imports no TF
    convert_cli.add_parser(sub, sys.modules[__name__])
    return parser


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def main(argv=None) -> int:
    """The ``equivtool`` command; returns its exit code. Ctrl-C prints one line and returns 130."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def _main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # TensorFlow is imported (quietly) only once a command will run: --help and
    # usage errors answer without it (building the parser imports no TensorFlow).
    from equivtool._platform.quiet import quiet_command
    if argv[:1] == ["demo"]:  # everything after "demo" belongs to the demo's own parser
        quiet_command()
        rest = argv[1:]
        rest = rest[1:] if rest[:1] == ["--"] else rest
        try:
            return cmd_demo(argparse.Namespace(demo_args=rest))
        except UsageError as exc:
            print(f"equivtool demo: error: {_one_line(exc)}", file=sys.stderr)
            return EXIT_USAGE
        except SystemExit as exc:
            return int(exc.code or 0)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    try:
        # Help and argparse's usage errors above answer without TensorFlow; a
        # command that checks more of its arguments first starts it itself.
        if not getattr(args, "starts_tensorflow", False):
            quiet_command()
        return args.run(args)
    except UsageError as exc:
        print(f"equivtool {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
