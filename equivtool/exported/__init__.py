"""Exported models as sides: ``equivtool compare OLD NEW`` for SavedModels, frozen graphs,
tf-keras files and golden records.

A migration often ends, or starts, with artifacts rather than source: the
TF1 SavedModel that serves today, the TF2 export meant to replace it, a frozen
graph, or a golden record written in an old TensorFlow 1.15 container by the
script ``equivtool record-script`` prints. This package loads each as a side
(:mod:`._sides`, :mod:`._record`), compares every signature output with
``equivtool.comparison.compare`` and its three-state verdicts
(:mod:`._compare`), and with ``localize=True`` finds the first node whose
output differs (:mod:`._localize`). With ``old_python=`` (``--old-python``) OLD
runs in another interpreter, a real TensorFlow 1.15, through that same
recorder (:mod:`._old_python`). The public names are exported from
``equivtool``: ``compare_models``, ``load_side``, ``ModelLoadError``.
"""

from __future__ import annotations

from equivtool._base.lazy import lazy_exports

# Imported on first use: the CLI registers its parsers from ._cli, and
# `equivtool ... --help` must answer without NumPy or TensorFlow.
_EXPORTS = {"compare_models": "_compare", "load_side": "_load", "ModelLoadError": "_sides",
            "recorder_source": "_record"}

__all__ = ["compare_models", "load_side", "ModelLoadError", "recorder_source"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
