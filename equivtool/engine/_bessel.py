"""A moving-variance difference explained by Bessel's correction: said, not hidden.

TensorFlow's fused batch norm (tf-slim's default for 4-D inputs, tf-keras'
``fused=True``) updates the moving variance with the *unbiased* batch variance
(the biased one times ``n / (n - 1)``, ``n`` the values per channel: batch
size times spatial positions); Keras 3's ``BatchNormalization`` (and the
unfused TF1 batch norm) with the *biased* one. Both normalise the batch with
the biased variance, so the outputs agree and only the moving variance
differs after a training pass: by ``(1 - momentum) * var / (n - 1)``, more
than the default tolerance on a small test batch.

The difference is real (a rewrite trained with small batches drifts from the
original), so the verdict stays NOT EQUIVALENT; this module only recognises it
and words the note. The test is numerical, per moving-variance variable, from
its value ``o`` before the training pass (equal on both sides) and after it,
``p`` (TF1) and ``q`` (TF2), over its channels ``i``. If TF1 used
``c * b_i`` where TF2 used ``b_i`` (``c = n / (n - 1)``) with one momentum
``m = 1 - k``, then ``p_i - m*o_i = c * (q_i - m*o_i)``: the two updates'
ratio is ``c``. Written as ``p_i - q_i = (c - 1) * (q_i - o_i) + (c - 1) * k * o_i``
it is linear in ``c - 1`` and ``(c - 1) * k``; a least-squares fit over the
channels must give ``n = c / (c - 1)`` within 1% of a multiple of the batch
size, a momentum in ``[0, 1)`` with ``k`` clearly above zero, and residuals at
float32 rounding, or no note is written. A momentum slip (both sides biased,
``p_i - o_i = (k1 / k2) * (q_i - o_i)``) fits with ``k = 0`` and gets none.

The ``optimizer`` and ``resume`` steps apply the same test to their first
training step: one step is one training pass with the same weights on both
sides, so the update is the same formula; later steps are not fitted. The
``resume`` step starts both sides from the checkpoint's moving variances;
the ``optimizer`` step starts after the pair's training pass, one update
with the same batch variance already apart, and the two differences fit
with one momentum and one ``n`` (:func:`_explained_after_one`).

NumPy only: the starts are captured by the steps' side functions
(:func:`moving_start`, :func:`moving_of`), the note is made in the judge.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

__all__ = ["moving_start", "moving_of", "is_moving_variance", "bessel_notes", "first_step_notes"]

_SUFFIX = "moving_variance"


def moving_start(half) -> dict | None:
    """The moving variances ``half`` holds before its training pass (None when
    that pass already ran: its start is gone)."""
    half.inference_pass()  # initialised (TF1) or built (TF2); changes no moving statistic
    if half.ran("training"):
        return None
    return half.side.read_variables(wanted=is_moving_variance)  # only these fetched: not the whole model


def is_moving_variance(key: str) -> bool:
    """Whether ``key`` names a moving variance (what the Bessel test reads)."""
    return key.rsplit("/", 1)[-1] == _SUFFIX


def moving_of(values: Mapping) -> dict:
    """The moving variances among ``values`` (``{key: array}``): a training run's
    start, for the ``optimizer`` and ``resume`` steps' first step."""
    return {k: v for k, v in values.items() if is_moving_variance(k)}


def _batch_size(inputs) -> int | None:
    leaves = inputs.values() if isinstance(inputs, Mapping) else (
        inputs if isinstance(inputs, (list, tuple)) else [inputs])
    for leaf in leaves:
        shape = np.shape(leaf)
        if shape:
            return int(shape[0])
    return None


def _explained(old: np.ndarray, tf1: np.ndarray, tf2: np.ndarray, batch: int) -> tuple | None:
    """``(n, factor, momentum)`` when Bessel's correction explains ``tf1`` vs ``tf2``, else None."""
    o, p, q = (np.asarray(v, np.float64).ravel() for v in (old, tf1, tf2))
    y, x = p - q, q - o
    if o.size < 2 or not np.any(y) or np.ptp(x) == 0:
        return None
    (alpha, beta), *_ = np.linalg.lstsq(np.stack([x, o], axis=1), y, rcond=None)
    if not alpha > 0:
        return None
    estimate = 1.0 + 1.0 / alpha
    n = int(round(estimate / batch)) * batch
    if n < 2 or abs(estimate - n) > 0.01 * n:
        return None
    k = beta / alpha
    if not 1e-4 <= k <= 1.0:  # k = 1 - momentum; ~0 is a momentum slip's fit
        return None
    # the exact factor of that n, and k refit for it: every channel within rounding
    alpha = 1.0 / (n - 1)
    k = float(np.dot(y - alpha * x, o) / (alpha * np.dot(o, o))) if np.dot(o, o) else 0.0
    residual = np.abs(y - alpha * x - alpha * k * o)
    scale = np.maximum.reduce([np.abs(o), np.abs(p), np.abs(q)])
    if not 1e-4 <= k <= 1.0 or np.any(residual > 8 * np.finfo(np.float32).eps * scale + 1e-12):
        return None
    if residual.max() > 0.01 * np.abs(y).max():
        return None
    return n, n / (n - 1), 1.0 - k


def _explained_after_one(tf1_old: np.ndarray, old: np.ndarray, tf1: np.ndarray, tf2: np.ndarray,
                         batch: int) -> tuple | None:
    """:func:`_explained` for starts that already differ by one such update with the
    same batch variance ``b`` (the ``optimizer`` step starts after the pair's
    training pass): ``d = o1 - o2 = (c - 1) * k * b`` and, one step later,
    ``p - q = m * d + (c - 1) * k * b = (1 + m) * d``; with ``w = q - m * o2 = k * b``,
    ``d = (c - 1) * w``. ``m`` is fitted from the first, ``c`` from the second."""
    o1, o2, p, q = (np.asarray(v, np.float64).ravel() for v in (tf1_old, old, tf1, tf2))
    d = o1 - o2
    if o2.size < 2 or not np.dot(d, d):
        return None
    momentum = float(np.dot(p - q, d) / np.dot(d, d)) - 1.0
    if not 0.0 <= momentum <= 1.0 - 1e-4:
        return None
    w = q - momentum * o2
    if not np.dot(w, w) or not np.dot(d, w) > 0:
        return None
    estimate = 1.0 + np.dot(w, w) / np.dot(d, w)  # c / (c - 1), c - 1 = dot(d, w) / dot(w, w)
    n = int(round(estimate / batch)) * batch
    if n < 2 or abs(estimate - n) > 0.01 * n:
        return None
    # that n's exact factor; the momentum refit from d = (q - m * o2) / (n - 1), the better
    # conditioned of the two (w is small, so the first fit's rounding moves it by much)
    momentum = float(np.dot(q - d * (n - 1), o2) / np.dot(o2, o2)) if np.dot(o2, o2) else -1.0
    if not 0.0 <= momentum <= 1.0 - 1e-4:
        return None
    scale = np.maximum.reduce([np.abs(o1), np.abs(o2), np.abs(p), np.abs(q)])
    tolerance = 8 * np.finfo(np.float32).eps * scale + 1e-12
    if (np.any(np.abs(p - q - (1 + momentum) * d) > tolerance)
            or np.any(np.abs(d - (q - momentum * o2) / (n - 1)) > tolerance)):
        return None
    return n, n / (n - 1), momentum


def bessel_notes(start_tf1: Mapping | None, start_tf2: Mapping | None, tf1: Mapping, tf2: Mapping,
                 inputs, after_one_update: bool = False) -> list:
    """One note per moving variance whose TF1/TF2 difference after a training pass
    is Bessel's factor (see the module docstring); none where it is not, or
    where the starts are unknown or differ (unless ``after_one_update``: starts
    that differ by one such update, see :func:`_explained_after_one`)."""
    batch = _batch_size(inputs)
    if not start_tf1 or not start_tf2 or not batch:
        return []
    notes = []
    for key, old in start_tf1.items():
        if key not in start_tf2 or key not in tf1 or key not in tf2:
            continue
        if np.shape(old) != np.shape(start_tf2[key]):
            continue
        if np.shape(tf1[key]) != np.shape(old) or np.shape(tf2[key]) != np.shape(old):
            continue
        if np.array_equal(old, start_tf2[key]):
            found = _explained(old, tf1[key], tf2[key], batch)
        elif after_one_update:
            found = _explained_after_one(old, start_tf2[key], tf1[key], tf2[key], batch)
        else:
            continue  # other starts: the difference may come from there
        if found is None:
            continue
        n, factor, momentum = found
        notes.append(
            f"{key}: the TF1 moving variance was updated with the batch variance times n/(n-1) = {factor:.6g} "
            f"(Bessel's correction, n = {n} values per channel: batch {batch} x {n // batch} positions; "
            f"momentum {momentum:.4g} on both sides), the TF2 one with the uncorrected batch variance: "
            "TensorFlow's fused batch norm (tf-slim's default for 4-D inputs, tf-keras fused=True) corrects "
            "it, Keras 3's BatchNormalization does not. The rewrite differs from the original here: each "
            "update adds (n-1)/n of the original's, so training with small batches diverges (large batches "
            "barely notice)")
    return notes


def first_step_notes(start_tf1: Mapping | None, start_tf2: Mapping | None, tf1_steps, tf2_steps, inputs,
                     after_one_update: bool = False) -> list:
    """:func:`bessel_notes` for the first step of a training run: ``tf1_steps[0]``
    and ``tf2_steps[0]`` are each side's variables after it (``{key: array}``)."""
    if not tf1_steps or not tf2_steps:
        return []
    return bessel_notes(start_tf1, start_tf2, tf1_steps[0], tf2_steps[0], inputs, after_one_update)
