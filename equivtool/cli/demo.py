"""``equivtool demo``: the Inception-ResNet-v2 parity demo (``--exported``: the same
model as exported SavedModels, with a planted fault localized). Everything after
``demo`` belongs to the demo's own parser."""

from __future__ import annotations

import contextlib
import os
import sys

from equivtool.cli.common import UsageError


def run(args) -> int:
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
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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


def add_parser(subparsers) -> None:
    # Listed for --help only: main() hands everything after "demo" to the demo's own parser.
    subparsers.add_parser("demo", help="Inception-ResNet-v2 proven equivalent (options: equivtool demo --help); "
                                "--exported: the same as exported SavedModels, and a planted fault localized; "
                                "--tf1-python PATH: a tf.contrib model run in that TensorFlow 1.15")
