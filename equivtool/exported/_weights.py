"""A Keras 3 ``.weights.h5`` file as a side of ``compare``: weights without a model.

``model.save_weights("model.weights.h5")`` stores a Keras 3 model's weight
arrays, not its architecture, so the file alone cannot run. ``compare`` takes
it with a model factory (``factory=`` in :func:`equivtool.compare_models`,
``--factory MODULE:FUNCTION`` on the command line): a zero-argument callable
that builds the Keras 3 model (a functional or ``Sequential`` one, with
inputs: its inputs name the side's inputs); the weights are loaded into it and
its inference forward pass is the side.

Keras 3 matches a file's arrays to the model's variables by the layers'
structure, not by name, and may leave a variable it finds no array for at its
fresh value with only a warning: so the file's arrays are counted first and a
model whose weight count differs is refused, naming both counts. Every error
is one line naming the file or the factory.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

from equivtool._base.errors import short
from equivtool.exported._errors import ModelLoadError

__all__ = ["SUFFIX", "is_weights_file", "check_factory", "load_weights_side"]

#: The name Keras 3 gives a weights-only file (``save_weights`` refuses any other).
SUFFIX = ".weights.h5"


def is_weights_file(path) -> bool:
    return isinstance(path, (str, os.PathLike)) and os.fspath(path).lower().endswith(SUFFIX)


def check_factory(factory: Optional[Callable], old, new) -> None:
    """Before any work: a ``.weights.h5`` side needs ``factory``, and ``factory``
    needs a ``.weights.h5`` side (``ModelLoadError``, one line)."""
    sides = [(which, side) for which, side in (("OLD", old), ("NEW", new)) if is_weights_file(side)]
    if factory is None:
        if sides:
            which, side = sides[0]
            raise ModelLoadError(f"{which}: {os.fspath(side)} holds weights only (a Keras 3 {SUFFIX} file); give "
                                 "the factory that builds its model: factory= (CLI: --factory MODULE:FUNCTION)")
        return
    if not callable(factory):
        raise ModelLoadError(f"--factory: expected a zero-argument callable returning a Keras 3 model, got "
                             f"{type(factory).__name__}")
    if not sides:
        raise ModelLoadError(f"--factory: applies to a Keras 3 {SUFFIX} side; neither OLD nor NEW is one")
    for which, side in sides:
        if not os.path.isfile(os.fspath(side)):
            raise ModelLoadError(f"{which}: {os.fspath(side)!r} does not exist; expected a Keras 3 {SUFFIX} file")


def _arrays(path: str) -> int:
    """How many weight arrays the Keras 3 weights file holds (datasets under ``vars`` groups)."""
    import h5py
    count = 0

    def visit(name, item):
        nonlocal count
        if isinstance(item, h5py.Dataset) and name.rsplit("/", 2)[-2:-1] == ["vars"]:
            count += 1
    try:
        with h5py.File(path, "r") as handle:
            handle.visititems(visit)
    except OSError as exc:
        raise ModelLoadError(f"{path}: not a readable HDF5 file (a Keras 3 {SUFFIX} from save_weights): "
                             f"{short(exc)}") from None
    return count


def load_weights_side(path, factory: Callable, graph_rewrites):
    """The model ``factory()`` builds, with ``path``'s weights, as a side."""
    from equivtool.exported._sides import keras_model_side
    from equivtool.variables.flavour import is_keras3
    path = os.fspath(path)
    stored = _arrays(path)
    name = getattr(factory, "__qualname__", type(factory).__name__)
    try:
        model = factory()
    except Exception as exc:  # noqa: BLE001 - whatever the user's code raises
        raise ModelLoadError(f"--factory: {name}() raised {type(exc).__name__}: {short(exc)}") from None
    import keras  # the factory ran; a Keras 3 model imports Keras 3
    if not (is_keras3(model) and isinstance(model, keras.Model)):
        raise ModelLoadError(f"--factory: {name}() returned {type(model).__module__}.{type(model).__name__}; "
                             "expected a Keras 3 keras.Model")
    if not getattr(model, "inputs", None):
        raise ModelLoadError(f"--factory: {name}() returned a model without inputs (a subclassed model?); return "
                             "a functional or Sequential keras.Model built on keras.Input")
    if stored != len(model.weights):
        raise ModelLoadError(f"{path}: holds {stored} weight arrays, the model {name}() builds has "
                             f"{len(model.weights)} weights: not this model's file (or not this factory)")
    try:
        model.load_weights(path)
    except Exception as exc:  # noqa: BLE001 - shape mismatches, a file of another layout ...
        raise ModelLoadError(f"{path}: the weights do not load into the model {name}() builds: "
                             f"{short(exc)}") from None
    return keras_model_side(model, path, graph_rewrites)
