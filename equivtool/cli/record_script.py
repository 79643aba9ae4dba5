"""``equivtool record-script``: print the golden-record writer to run in an old TensorFlow
(1.15 and later): a self-contained script, TensorFlow 1.x API and NumPy only."""

from __future__ import annotations

import sys

from equivtool.cli.common import EXIT_OK


def run(args) -> int:
    from equivtool.exported import recorder_source
    sys.stdout.write(recorder_source())
    return EXIT_OK


def add_parser(subparsers) -> None:
    record = subparsers.add_parser(
        "record-script", help="print the golden-record writer to run in an old TensorFlow (1.15+) environment",
        description="Print a self-contained script (TensorFlow 1.15 API and NumPy only): "
                    "python record.py MODEL OUT.npz [--signature S] [--tags T] [--graph-inputs ...] "
                    "[--graph-outputs ...] [--inputs FILE.npz] [--input-shapes ...] [--seed N] [--intermediates]")
    record.set_defaults(run=run)
