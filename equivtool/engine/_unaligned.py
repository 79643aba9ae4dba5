""""weights not aligned": why a native rewrite checked with rename rules alone fails.

A native rewrite's initializers (tf-keras' own counter, Keras 3's seeds, other
initializer classes) draw other numbers than the TF1 graph's, even under the
random tool. Rename rules say which variable is which, but only a
:class:`~equivtool.VariableMapping` (``rename=map_variables(...)``) makes both
sides start from the same values (``equivtool.engine.align``). Checked
with rules alone, every step run from initial values then fails whatever the
arithmetic, and a bare NOT EQUIVALENT would send the user after a bug that is
not there.

The training-mode forward step compares every variable after one training
pass; a pass updates no weight but the moving statistics, so a differing
weight (not ``moving_mean``/``moving_variance``) there differed from the start.
:func:`unaligned_note` then says so, names them and what aligns them. The
verdict is not changed: the step still fails, as it must (the sides did
compute different numbers).
"""

from __future__ import annotations

__all__ = ["unaligned_note"]

_MOVING = ("moving_mean", "moving_variance")
_SHOWN = 3


def unaligned_note(result, aligned) -> str | None:
    """The note for a training-mode forward step ``result`` whose weights differ
    without having been updated, when the check did not align them (``aligned``
    is the options' alignment, None for rules alone); else None."""
    if aligned:
        return None
    differing = [leaf.name.split("/", 1)[1] for comparison in result.comparisons if comparison.name == "variables"
                 for leaf in comparison.leaves if not leaf.ok and "/" in leaf.name]
    weights = [name for name in differing if name.rsplit("/", 1)[-1] not in _MOVING]
    if not weights:
        return None
    shown = ", ".join(repr(name) for name in weights[:_SHOWN]) + (", ..." if len(weights) > _SHOWN else "")
    return (f"weights not aligned: {len(weights)} variables differ although the training-mode pass updates none "
            f"of them ({shown}): the two sides started from different initial values (a native rewrite's "
            "initializers draw other numbers than TF1's), so every step run from initial values fails whatever "
            "the arithmetic. Rename rules only name the pairs; to start both sides from the same values pass "
            "rename=equivtool.map_variables(tf1_fn, tf2_factory, inputs) (completed with mapping.resolve({...}) "
            "where it is ambiguous)")
