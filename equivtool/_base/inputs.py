"""The inputs of ``equivtool check``: one structure, passed to both sides as the Python API does.

Exactly one of:

``--input-shape 2,8,8,3``
    one float32 array, standard normal.
``--inputs file.npz``
    the arrays of a ``.npz`` file: keys ``arr_0 .. arr_N`` (as ``np.savez(path,
    a, b)`` writes them) give a list in that order, ``arr_0`` alone gives that
    array, other keys give a dict (``np.savez(path, input_ids=..., mask=...)``).
``--input NAME:SHAPE:DTYPE[:LO,HI]`` (repeatable)
    a dict of generated arrays: ``input_ids:2,128:int32:0,30521`` draws
    integers uniformly from ``[LO, HI]`` (default ``[0, 1]``), a float dtype
    draws uniformly from ``[LO, HI)`` or, without a range, standard normal;
    ``bool`` draws True/False and takes no range.

One rule for range ends, here and in ``equivtool compare --val-range``
(:func:`check_range`): integers include HI, floats exclude it; a range the
dtype cannot hold (int8 ``0,1000``, uint8 ``-5,5``, float16 ``0,1e5``) or
that is not finite is refused, never wrapped or overflowed.
"""

from __future__ import annotations

import os
import re

import numpy as np

_SPEC = re.compile(r"^(?P<name>[^:]+):(?P<shape>[^:]+):(?P<dtype>[^:]+)(?::(?P<range>[^:]+))?$")
_FORM = "NAME:SHAPE:DTYPE[:LO,HI], e.g. input_ids:2,128:int32:0,30521 or x:2,8:float32"
RANGE_RULE = "integers are drawn from [LO, HI] (HI included), floats from [LO, HI) (HI excluded)"
_ARRAY_KEY = re.compile(r"^arr_(\d+)$")


class InputError(ValueError):
    """A bad input option: the message names the option and the expected form."""


def _shape(text: str, option: str) -> tuple:
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise InputError(f"{option}: SHAPE must be comma-separated positive integers like 2,128, got {text!r}")
    return shape


def _dtype(text: str, option: str) -> np.dtype:
    try:
        dtype = np.dtype(text)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind not in "fiub":
        raise InputError(f"{option}: DTYPE must be a float, integer or bool dtype (float32, int32, int64, "
                         f"bool ...), got {text!r}")
    return dtype


def check_range(dtype: np.dtype, low: float, high: float, option: str) -> None:
    """Refuse (:class:`InputError`, naming ``option``) a range ``dtype`` cannot
    draw from under the one rule (:data:`RANGE_RULE`): not finite, empty, an
    integer range with fractional ends or outside the dtype's limits, a float
    range beyond the dtype's largest value, or any range for ``bool``."""
    text = f"{low},{high}" if dtype.kind in "iu" else f"{low:g},{high:g}"
    if dtype.kind == "b":
        raise InputError(f"{option}: a bool input takes no LO,HI range (it draws False and True), got {text}")
    if not (np.isfinite(low) and np.isfinite(high)):
        raise InputError(f"{option}: LO,HI must be finite numbers, got {text}")
    if dtype.kind in "iu":
        if low != int(low) or high != int(high):
            raise InputError(f"{option}: an integer DTYPE needs integer LO,HI, got {text}")
        if not low <= high:
            raise InputError(f"{option}: LO,HI must be two numbers with LO <= HI (HI included for integers), "
                             f"got {text}")
        info = np.iinfo(dtype)
        if low < info.min or high > info.max:
            raise InputError(f"{option}: {dtype.name} holds {info.min}..{info.max}; LO,HI {text} "
                             "is outside it (values would wrap)")
        return
    if not low < high:
        raise InputError(f"{option}: LO,HI must be two numbers with LO < HI (HI excluded for floats), got {text}")
    largest = float(np.finfo(dtype).max)
    if max(abs(low), abs(high)) > largest or not np.isfinite(high - low):
        raise InputError(f"{option}: {dtype.name} holds at most {largest:g} in magnitude (and HI - LO must be "
                         f"finite); LO,HI {text} would overflow to inf")


def _range(text: str | None, dtype: np.dtype, option: str) -> tuple | None:
    if text is None:
        return None
    parts = text.split(",")
    def number(part):  # integers exactly (int64's limits are not floats)
        try:
            return int(part) if dtype.kind in "iu" else float(part)
        except ValueError:
            return float(part)
    try:
        low, high = (number(p) for p in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        low = high = None
    if low is None:
        raise InputError(f"{option}: LO,HI must be two numbers like 0,100, got {text!r}")
    check_range(dtype, low, high, option)
    return low, high


def parse_input(text: str, max_elements: int) -> tuple:
    """``(name, shape, dtype, range or None)`` of one ``--input`` spec."""
    option = f"--input {text!r}"
    match = _SPEC.match(text)
    if match is None:
        raise InputError(f"--input: expected {_FORM}, got {text!r}")
    shape = _shape(match["shape"], option)
    dtype = _dtype(match["dtype"], option)
    size = int(np.prod(shape))
    if size > max_elements:
        raise InputError(f"{option}: {size} values; the command line generates at most {max_elements} per input")
    return match["name"], shape, dtype, _range(match["range"], dtype, option)


def generate(spec: tuple, rng: np.random.RandomState) -> np.ndarray:
    _, shape, dtype, bounds = spec
    if dtype.kind == "b":
        return rng.randint(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        low, high = (0, 1) if bounds is None else (int(bounds[0]), int(bounds[1]))
        if high + 1 > np.iinfo(np.int64).max:  # beyond int64: drawn in the dtype itself
            return rng.randint(low, high + 1, size=shape, dtype=dtype)
        return rng.randint(low, high + 1, size=shape, dtype=np.int64).astype(dtype)
    if bounds is None:
        return rng.standard_normal(shape).astype(dtype)
    value = rng.uniform(bounds[0], bounds[1], size=shape).astype(dtype)
    # rounding to a narrow dtype may reach HI (float16: 0.99995 -> 1.0); HI stays excluded
    return np.minimum(value, np.nextafter(dtype.type(bounds[1]), dtype.type(bounds[0])))


def load_npz(path: str):
    """The inputs held in a ``.npz`` file (see the module docstring for the structure)."""
    if not os.path.isfile(path):
        raise InputError(f"--inputs: expected a .npz file written by np.savez, {path!r} is not a file")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except Exception as exc:  # noqa: BLE001 - reported as a usage error
        raise InputError(f"--inputs: cannot read {path!r} as a .npz file (np.savez): "
                         f"{type(exc).__name__}: {exc}") from None
    if not arrays:
        raise InputError(f"--inputs: {path!r} holds no array")
    numbered = sorted((int(m[1]), key) for key in arrays if (m := _ARRAY_KEY.match(key)))
    if len(numbered) == len(arrays) and [i for i, _ in numbered] == list(range(len(numbered))):
        values = [arrays[key] for _, key in numbered]
        return values[0] if len(values) == 1 else values
    return arrays


def inputs_from_options(input_shape, inputs_file, input_specs, seed: int, max_elements: int):
    """``(inputs, description)`` from exactly one of the three options."""
    given = [name for name, value in (("--input-shape", input_shape), ("--inputs", inputs_file),
                                      ("--input", input_specs)) if value]
    if len(given) != 1:
        raise InputError("give the inputs with exactly one of --input-shape SHAPE, --inputs FILE.npz or "
                         f"--input {_FORM} (repeatable); got {', '.join(given) or 'none'}")
    if inputs_file:
        return load_npz(inputs_file), inputs_file
    rng = np.random.RandomState(seed)
    specs = [parse_input(text, max_elements) for text in input_specs]
    names = [spec[0] for spec in specs]
    if len(set(names)) != len(names):
        raise InputError(f"--input: each NAME once, got {names}")
    values = {spec[0]: generate(spec, rng) for spec in specs}
    return values, ", ".join(f"{n}{list(s)} {d}" for n, s, d, _ in specs)
