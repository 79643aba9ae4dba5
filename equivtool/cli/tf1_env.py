"""``equivtool tf1-env DIR [--python PY]``: create or reuse a TensorFlow 1.15 environment for the old side."""

from __future__ import annotations

import shlex

from equivtool.cli.common import EXIT_OK, UsageError


def run(args) -> int:
    from equivtool._platform import tf1_python as _tf1
    try:
        found, created = _tf1.create_env(args.dir, args.python, log=lambda text: print(text, flush=True))
    except _tf1.Tf1PythonError as exc:
        raise UsageError(str(exc)) from None
    print(f"{'created' if created else 'reused'} {found}")
    python = shlex.quote(found.path)
    print(f"old side: equivtool check MODULE:TF1_FN MODULE:TF2_FACTORY ... --tf1-python {python}")
    print(f"          equivtool compare --old-python {python} OLD NEW")
    return EXIT_OK


def add_parser(subparsers) -> None:
    tf1_env = subparsers.add_parser(
        "tf1-env", help="create (or reuse) a TensorFlow 1.15 environment in DIR for the old side",
        description="Create a virtual environment in DIR with TensorFlow 1.15 (tensorflow-cpu==1.15.0, "
                    "numpy<1.19, protobuf<3.21) from a Python 3.6 or 3.7 (--python, else pyenv's, else "
                    "python3.7/python3.6 on PATH). A complete one is reused. Prints the interpreter to pass "
                    "as --old-python / --tf1-python.")
    tf1_env.add_argument("dir", metavar="DIR")
    tf1_env.add_argument("--python", default=None, metavar="PY", help="the Python 3.6/3.7 to build it from")
    tf1_env.set_defaults(run=run)
