"""Rows a sparse gradient holds more than once: TF1 squares their sum, Keras 3 each one.

Why it exists: the gradient of an embedding lookup is a ``tf.IndexedSlices``
holding one row per *occurrence* of an index, so a token id that appears
``k`` times in the batch is there ``k`` times. TF1's optimizers sum a row's
occurrences before applying them (``Optimizer._apply_sparse_duplicate_indices``;
tf-keras' optimizers do the same), so Adam's second moment of that row grows
by ``(1 - beta_2) * (g_1 + ... + g_k) ** 2``, the square of the row's
gradient. Keras 3's optimizers square the ``IndexedSlices`` values one
occurrence at a time and add them afterwards: ``g_1 ** 2 + ... + g_k ** 2``.
Slots that are linear in the gradient (momentum, Adam's ``m``) agree; the
squared ones (Adam's and AdamW's velocity, RMSprop's, Adagrad's
accumulator) and then the variable differ in exactly those rows, by the
size of the gradient, not of rounding (docs/keras3.md has the numbers).

The difference is real, so the verdict stays NOT EQUIVALENT; this module
only recognises it and words the note. The rule, at the first training step
that fails (the later ones inherit its difference): the TF2 optimizer is a
Keras 3 one that squares the gradient; every failing leaf there is a
variable whose TF2 gradient was sparse with repeated indices, or one of its
slots; and every element out of tolerance in them lies in a repeated row.
A slip that touches anything else (an ``epsilon``, a ``beta_2``, a learning
rate: every row, every variable) gets no note.

NumPy only: the repeated rows are found by the TF2 side
(:func:`repeated_rows`), the note is made in the judge.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["SQUARING", "squaring_kind", "repeated_rows", "sparse_square_notes"]

# Keras 3 optimizers whose update squares (or otherwise bends) the gradient element-wise.
SQUARING = ("Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta", "Lamb")


def squaring_kind(optimizer: Any) -> str | None:
    """The Keras 3 class (``"Adam"``, ...) of :data:`SQUARING` that ``optimizer``
    is or derives from; None for any other (tf-keras sums repeated rows first)."""
    for cls in type(optimizer).__mro__:
        if cls.__module__.split(".")[0] == "keras" and cls.__name__ in SQUARING:
            return cls.__name__
    return None


def repeated_rows(indices: Any) -> list[int]:
    """The indices that a sparse gradient's ``indices`` hold more than once, sorted."""
    values, counts = np.unique(np.asarray(indices).ravel(), return_counts=True)
    return [int(v) for v in values[counts > 1]]


def _variable_of(leaf: str, step: str, repeated: Mapping[str, Sequence[int]]) -> str | None:
    """The variable key a leaf ``step_N/variables/<key>`` or ``step_N/slots/<key>/<slot>`` belongs to."""
    rest = leaf[len(step) + 1:] if leaf.startswith(step + "/") else None
    if rest is None:
        return None
    if rest.startswith("variables/") and rest[len("variables/"):] in repeated:
        return rest[len("variables/"):]
    if rest.startswith("slots/"):
        key = rest[len("slots/"):].rpartition("/")[0]
        return key if key in repeated else None
    return None


def _leaf_value(tree: Mapping, leaf: str, step: str):
    node: Any = tree
    for part in (leaf[len(step) + 1:].split("/", 1)):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def sparse_square_notes(comparisons: Sequence, expected: Sequence[Mapping], actual: Sequence[Mapping],
                        repeated: Mapping[str, Sequence[int]], kind: str | None, tf1_optimizer: str) -> list:
    """The note (a one-element list) when the first failing step's difference is
    Keras 3 squaring repeated rows one occurrence at a time (module docstring);
    ``[]`` otherwise. ``comparisons[i]`` compared ``expected[i]`` with
    ``actual[i]`` (``{"variables": {key: array}, "slots": {key/slot: array}, ...}``)
    under the name ``step_{i+1}``; ``repeated`` maps a variable key to the rows its
    TF2 gradient held more than once; ``kind`` is :func:`squaring_kind`'s answer."""
    repeated = {key: rows for key, rows in repeated.items() if len(rows)}
    if kind is None or not repeated:
        return []
    first = next((i for i, c in enumerate(comparisons) if not c.ok), None)
    if first is None or first >= len(expected) or first >= len(actual):
        return []
    step = comparisons[first].name
    failing = [leaf for leaf in comparisons[first].leaves if not leaf.ok]
    if not failing:
        return []
    explained: dict[str, set] = {}
    largest = 0.0
    for leaf in failing:
        key = _variable_of(leaf.name, step, repeated)
        if key is None or leaf.shape_mismatch or not leaf.values_compared or leaf.compared == 0:
            return []  # something else differs too: not this cause alone
        want, got = _leaf_value(expected[first], leaf.name, step), _leaf_value(actual[first], leaf.name, step)
        if want is None or got is None or np.shape(want) != np.shape(got) or not np.ndim(want):
            return []
        want, got = np.asarray(want, np.float64), np.asarray(got, np.float64)
        far = ~leaf.tolerance.close(want, got)
        rows = {int(r) for r in np.nonzero(far.reshape(far.shape[0], -1).any(axis=1))[0]}
        if not rows or not rows <= set(repeated[key]):
            return []  # a row the batch holds once differs: another cause
        explained.setdefault(key, set()).update(rows)
        largest = max(largest, float(np.max(np.abs(want - got))))
    notes = []
    for key, rows in explained.items():
        shown = sorted(rows)
        notes.append(
            f"{key}: only rows {shown[:10]}{' ...' if len(shown) > 10 else ''} differ at {step} (largest "
            f"difference {largest:.3g}, in the variable or its slots), and each appears more than once in the "
            f"batch's sparse gradient (tf.IndexedSlices, e.g. a token id repeated in an embedding lookup; "
            f"repeated rows: {list(repeated[key])[:10]}{' ...' if len(repeated[key]) > 10 else ''}): TF1's "
            f"{tf1_optimizer} sums a row's occurrences before squaring the gradient ((g1 + g2)**2), Keras 3's "
            f"{kind} squares each occurrence and adds them (g1**2 + g2**2), so its second-moment slot and then "
            "the variable differ there. The rewrite differs from the original here (not rounding); to train "
            "as the original did, sum the repeated rows before the optimizer sees them (apply "
            "tf.convert_to_tensor(gradient) to a tf.IndexedSlices gradient in the training step)")
    return notes
