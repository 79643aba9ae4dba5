"""``load_side``: the side an artifact's path names (see :mod:`._sides` and :mod:`._record`)."""

from __future__ import annotations

import os
from typing import Mapping, Optional, Sequence

from equivtool.exported._record import RecordSide
from equivtool.exported._sides import (ModelLoadError, Side, load_keras, load_tf1, load_tf2,
                                       detect_kind)


def load_side(path: str, *, signature: str = "serving_default", tags: Sequence[str] = ("serve",),
              graph_inputs: Optional[Mapping[str, str]] = None,
              graph_outputs: Optional[Mapping[str, str]] = None, graph_rewrites: str = "as_written") -> Side:
    """Load one side of a comparison from an artifact.

    ``path`` is a SavedModel folder (TF1 or TF2, told apart by its contents), a
    frozen GraphDef ``.pb`` (with ``graph_inputs``/``graph_outputs``: name ->
    tensor name), a tf-keras ``.h5``/``.keras`` file, or a golden record
    ``.npz``. ``graph_rewrites`` ("as_written", the default, or
    "tensorflow_default") says which Grappler passes the side's session runs
    (:mod:`equivtool._platform.graph_rewrites`). Errors are :class:`ModelLoadError` (a
    ``ValueError``) with one line.
    """
    from equivtool._platform import graph_rewrites as _graph_rewrites
    try:
        _graph_rewrites.check_graph_rewrites(graph_rewrites, "--graph-rewrites")
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    path = os.fspath(path)
    if isinstance(tags, str):
        tags = tuple(t for t in tags.split(",") if t)
    if path.lower().endswith(".weights.h5"):  # no architecture to load: compare_models pairs it with a factory
        raise ModelLoadError(f"{path}: a Keras 3 .weights.h5 holds weights only; compare it with "
                             "compare_models(..., factory=<the function building its model>) "
                             "(CLI: --factory MODULE:FUNCTION)")
    kind = detect_kind(path)
    if kind in ("tf1-saved-model", "frozen-graph"):
        graph_inputs = {k: v if ":" in v else v + ":0" for k, v in (graph_inputs or {}).items()}
        graph_outputs = {k: v if ":" in v else v + ":0" for k, v in (graph_outputs or {}).items()}
        return load_tf1(path, kind, signature, tags, graph_inputs, graph_outputs, graph_rewrites)
    if kind == "tf2-saved-model":
        return load_tf2(path, signature, tags, graph_rewrites)
    if kind == "keras":
        return load_keras(path, graph_rewrites)
    return RecordSide(path)
