"""Propose the variable mapping from a TF1 checkpoint alone: :func:`map_checkpoint`.

Why: a team converting a trained model often has the checkpoint and the new
Keras model, not the old code in a state that still builds. The checkpoint
says enough to pair variables the way :func:`equivtool.map_variables` pairs
them from a graph: every variable's name, shape and dtype. What it does not
store is trainability, which the pairing keys on (a batch norm's
``moving_mean`` and ``beta`` have the same shape): a variable that has
optimizer slots was trained; with no slots anywhere (a checkpoint saved
without its optimizer) the moving statistics are the non-trainable ones, by
their role. Slots (``<variable>/<slot>``, a child of another saved
variable) and the optimizer's own counters are not model variables and are
left out of the mapping; :func:`equivtool.convert_checkpoint` finds them.
"""

from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from equivtool.checkpoints.convert import checkpoint_path, open_tf1_checkpoint
from equivtool.variables import VariableInfo, VariableSet
from equivtool.variables.mapping import VariableMapping, check_inputs, fresh_layer_numbering, make_layer, propose

__all__ = ["map_checkpoint"]

#: Saved by TF1 optimizers beside the model (not slots of a variable).
OPTIMIZER_COUNTERS = frozenset({"global_step", "beta1_power", "beta2_power"})
#: Leaf names of variables no optimizer trains (a batch norm's statistics).
STATISTICS = frozenset({"moving_mean", "moving_variance"})


def checkpoint_variables(tf1_checkpoint) -> VariableSet:
    """The model variables a TF1 checkpoint holds, in name order, with the
    trainability its slots imply (see the module docstring)."""
    path = checkpoint_path(tf1_checkpoint)
    _, shapes, dtypes = open_tf1_checkpoint(path)
    slots = {key for key in shapes if key.rpartition("/")[0] in shapes}
    with_slots = {key.rpartition("/")[0] for key in slots}
    model = [key for key in sorted(shapes) if key not in slots and key not in OPTIMIZER_COUNTERS]
    if not model:
        raise ValueError(f"tf1_checkpoint: {path!r} holds no model variables")

    def trainable(key: str) -> bool:
        if with_slots:
            return key in with_slots
        return key.rsplit("/", 1)[-1] not in STATISTICS
    return VariableSet(tuple(VariableInfo(key, tuple(shapes[key]), dtypes[key].base_dtype.name, trainable(key))
                             for key in model), "tf1")


def map_checkpoint(tf1_checkpoint, tf2_layer: Callable | Any, inputs) -> VariableMapping:
    """Propose the mapping from a TF1 checkpoint's variables to a TF2 layer's.

    Args:
      tf1_checkpoint: the TF1 checkpoint's prefix (``model.ckpt-1000``) or its folder.
      tf2_layer: a zero-argument factory returning the TF2 layer (made with
        fresh layer numbering, so the rules hold for the layer
        :func:`equivtool.convert_checkpoint` makes again), or a layer instance.
      inputs: a NumPy array (or nested structure) the layer is called on once.

    Returns a :class:`~equivtool.VariableMapping`, as :func:`equivtool.map_variables`
    does: pass it as ``convert_checkpoint(..., rename=mapping)`` (or
    ``check_equivalence(..., rename=mapping)``); an incomplete one is refused
    there with the ``mapping.resolve(...)`` call that completes it.
    """
    tf1 = checkpoint_variables(tf1_checkpoint)
    check_inputs(inputs)
    with fresh_layer_numbering():  # (a layer instance is only called)
        layer = make_layer(tf2_layer)
        layer(tf.nest.map_structure(tf.convert_to_tensor, inputs), training=False)
    return propose(tf1, VariableSet.from_layer(layer))
