"""``equivtool build-ops``: (re)build the cross-entropy op against the installed TensorFlow."""

from __future__ import annotations

import sys

from equivtool.cli.common import EXIT_OK, UsageError


def run(args) -> int:
    from equivtool.ops import build_ops
    from equivtool.ops import BuildError
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


def add_parser(subparsers) -> None:
    build = subparsers.add_parser("build-ops", help="(re)build the cross-entropy op against the installed TensorFlow")
    build.add_argument("--verbose", action="store_true")
    build.set_defaults(run=run)
