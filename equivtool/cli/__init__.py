"""The ``equivtool`` command line: one module per command, one plug-in shape.

Each command module ``equivtool/cli/<command>.py`` has ``add_parser(subparsers)``,
which adds its parser and sets ``run``, and ``run(args) -> int``, which returns
the exit code. :data:`COMMANDS` lists them in ``--help`` order; a new command is
one module and one line there. What they share (exit codes, one-line usage
errors, ``MODULE:NAME`` loading, argument checks) is in
:mod:`equivtool.cli.common`.

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

Importing this package has no side effects and imports no TensorFlow: ``--help``
and usage errors answer without it; :func:`main` silences TensorFlow's start-up
notices (``equivtool._platform.quiet``) before a command imports it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from equivtool._base.errors import short
from equivtool.cli.common import (EXIT_DIFFERENT, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, Parser,  # noqa: F401
                                  UsageError)

__all__ = ["COMMANDS", "EXIT_DIFFERENT", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "UsageError",
           "build_parser", "main"]

# The modules of equivtool/cli/ that are commands, in --help order (the command is the name with '-').
COMMANDS = ("doctor", "tf1_env", "check", "demo", "audit", "build_ops", "compare", "record_script",
            "convert_checkpoint")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="equivtool", description="Prove a TF1 model migrated to TF2 computes the same numbers.",
        epilog="Exit codes: 0 passed, 1 not passed (different, error or inconclusive), 2 bad usage.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"equivtool.cli.{name}").add_parser(subparsers)
    return parser


def main(argv=None) -> int:
    """The ``equivtool`` command; returns its exit code. Ctrl-C prints one line and returns 130."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def _main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from equivtool._platform.quiet import quiet_command
    if argv[:1] == ["demo"]:  # everything after "demo" belongs to the demo's own parser
        from equivtool.cli import demo
        quiet_command()
        rest = argv[1:]
        rest = rest[1:] if rest[:1] == ["--"] else rest
        try:
            return demo.run(argparse.Namespace(demo_args=rest))
        except UsageError as exc:
            print(f"equivtool demo: error: {short(exc, None)}", file=sys.stderr)
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
        print(f"equivtool {args.command}: error: {short(exc, None)}", file=sys.stderr)
        return EXIT_USAGE
