"""What every command shares: exit codes, one-line usage errors, loading ``MODULE:NAME``,
and the argument checks that run before any work starts (no TensorFlow here)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import os
import pkgutil
import sys
import tempfile
import traceback
from typing import Any, Callable, Iterator, Optional

from equivtool._base.errors import short

EXIT_OK, EXIT_DIFFERENT, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C

# The largest --input-shape the command line allocates: 2**28 float32 values (1 GiB).
MAX_INPUT_ELEMENTS = 2 ** 28
# numpy.random.RandomState accepts seeds in [0, 2**32).
MAX_SEED = 2 ** 32 - 1


class UsageError(ValueError):
    """A bad argument or target: printed as one line, exit code 2."""


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


def where(exc: BaseException) -> str:
    """" (at path:line)" for the innermost frame of ``exc``'s traceback, or for a SyntaxError its line."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (at {exc.filename}:{exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def import_module(module_name: str, argument: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UsageError(f"{argument}: cannot import module {module_name!r} ({exc})") from None
        raise UsageError(f"{argument}: cannot import module {module_name!r}: importing it raised "
                         f"ModuleNotFoundError: {exc}{where(exc)}") from None
    except SystemExit as exc:
        raise UsageError(f"{argument}: cannot import module {module_name!r}: it called "
                         f"sys.exit({exc.code!r}) while being imported") from None
    except Exception as exc:  # noqa: BLE001 - SyntaxError, or anything the module's code raises
        raise UsageError(f"{argument}: cannot import module {module_name!r}: importing it raised "
                         f"{type(exc).__name__}: {exc}{where(exc)}") from None


def load_object(spec: str, argument: str) -> Any:
    """The object ``MODULE:NAME`` names, callable or not (rename rules are a list)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"{argument}: expected MODULE:NAME (e.g. my_models:RENAME), got {spec!r}")
    import_module(module_name, argument)
    try:
        return pkgutil.resolve_name(spec)
    except (AttributeError, ValueError):
        raise UsageError(f"{argument}: module {module_name!r} has no attribute {attr!r}") from None


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
    import_module(module_name, argument)
    try:
        target = pkgutil.resolve_name(spec)
    except AttributeError:
        raise UsageError(f"{argument}: module {module_name!r} has no attribute {attr!r}") from None
    except ValueError:
        raise UsageError(f"{argument}: expected MODULE:NAME (e.g. my_models:tf1_forward), got {spec!r}") from None
    if not callable(target):
        raise UsageError(f"{argument}: {spec} is a {type(target).__name__}, expected a callable")
    return target


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


def check_no_arguments(fn: Callable, target: str, argument: str = "MODULE:FN",
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


class Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are one line pointing to ``--help`` (exit 2), not its usage block.
    Subcommands' parsers are of the same class (``add_subparsers`` uses the parent's)."""

    def error(self, message: str):
        print(f"{self.prog}: error: {short(message, None)} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def inputs_of(args, seed: int) -> tuple:
    """``(inputs, description)`` from the inputs options ``check`` and ``convert-checkpoint``
    share: ``--input-shape`` alone is one float32 array, standard normal from ``seed``;
    otherwise exactly one of the three options (:mod:`equivtool._base.inputs`)."""
    if args.input_shape and not (args.inputs or args.input):
        shape = parse_shape(args.input_shape)
        import numpy as np
        try:
            return np.random.RandomState(seed).standard_normal(shape).astype(np.float32), shape
        except (MemoryError, ValueError) as exc:
            raise UsageError(f"--input-shape: cannot allocate an input of shape {shape}: "
                             f"{type(exc).__name__}: {exc}") from None
    from equivtool._base.inputs import InputError, inputs_from_options
    try:
        return inputs_from_options(args.input_shape, args.inputs, args.input, seed, MAX_INPUT_ELEMENTS)
    except InputError as exc:
        raise UsageError(str(exc)) from None
