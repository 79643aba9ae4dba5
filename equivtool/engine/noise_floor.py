"""A measured noise floor for the steps that train for several steps (NumPy only).

Why it exists: training is chaotic. After a few optimizer steps with batch
norm in training mode, a faithful TF2 rewrite drifts from TF1 by more than
the guide's tolerance, and so does TF1 against *itself* when every value it
starts from is one unit in the last place (ULP) away. A tolerance stated by
hand for that drift ("atol 2e-4, cause not found") is a guess that also lets
real faults of that size through; the floor replaces the guess by a
measurement made in the same run.

How: the step runs its TF1 side a second time from the same start state,
with every floating-point variable (model, optimizer slots, step powers and
moving statistics alike) moved one ULP towards +inf or -inf, the direction
drawn per element by a seeded generator (:class:`Perturbed`); zeros and
non-finite values are left as they are (a zero's ULP is a subnormal that
flush-to-zero arithmetic reads as 0, and a negative one would make a
non-negative accumulator negative). The **floor** of a leaf at a step is the
largest absolute difference between the two TF1 runs there
(:func:`measure`). This is one sample of Monte Carlo arithmetic's idea
(perturb the rounding, watch the spread), taken at the start state only, so
it costs exactly one extra TF1 run.

Judgement (:func:`judge`): a leaf that passed its tolerance is untouched. A
leaf that failed it, with finite values of the same shape and dtype on both
sides, passes as **consistent with rounding** when its largest absolute
TF1-vs-TF2 difference is at most ``multiple`` times its floor; a note gives
both numbers. Everything else stays as it was: a floor of exactly 0 (or one
that could not be measured) widens nothing, and a leaf that compared
nothing (inconclusive, missing, NaN on one side) is never turned into a
pass. The default multiple, :data:`DEFAULT_MULTIPLE`, is 10: one decimal
digit above a single sample of the spread, which covers the spread of that
estimate and the fact that TF2 rounds differently at every op of every
step, not once at the start; a wrong learning rate or batch-norm epsilon
lands several orders of magnitude above it (docs/noise-floor.md has the
measured ratios).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import zlib
from typing import Any, Mapping, Sequence

import numpy as np

from equivtool.comparison import Comparison, LeafComparison, Tolerance, compare

__all__ = ["DEFAULT_MULTIPLE", "FloorJudgement", "FloorWording", "NOISE", "check_multiple", "judge", "judge_runs",
           "measure", "Perturbed"]

DEFAULT_MULTIPLE = 10.0
PERTURBATION = "one ULP towards +inf or -inf (seeded, per element) in every float variable"


@dataclasses.dataclass(frozen=True)
class FloorWording:
    """How :func:`judge`'s notes name a floor: ``label`` ("noise floor"), ``run`` (how
    the TF1 side was run again, followed by ``perturbation``, then ``"(seed N)"``
    where there is one), and ``verdict`` (what a widened leaf is "consistent
    with"). The kernel floor (:mod:`equivtool.engine.kernel_floor`) judges with
    its own words."""

    label: str
    run: str
    perturbation: str
    verdict: str


NOISE = FloorWording("noise floor", "TF1 run again from the same start with", PERTURBATION, "rounding")


def check_multiple(multiple: Any, argument: str = "noise_floor_multiple") -> float:
    """``multiple`` as a float, or a ValueError naming ``argument`` and the expected form."""
    if isinstance(multiple, (bool, np.bool_)) or not isinstance(multiple, (int, float, np.integer, np.floating)):
        raise TypeError(f"{argument}: expected a number >= 1 (how many times the measured noise floor a "
                        f"training difference may reach), got {multiple!r}")
    value = float(multiple)
    if not (math.isfinite(value) and value >= 1.0):
        raise ValueError(f"{argument}: expected a finite number >= 1, got {multiple!r}")
    return value


def _one_ulp(value: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    array = np.asarray(value)
    if not np.issubdtype(array.dtype, np.floating) and "float" not in array.dtype.name:
        return array  # integers, bools, strings: no rounding to model
    towards = np.where(rng.random(array.shape) < 0.5, -np.inf, np.inf).astype(array.dtype)
    moved = np.nextafter(array, towards)
    keep = (array == 0) | ~np.isfinite(array.astype(np.float64))
    return np.where(keep, array, moved).astype(array.dtype)


class Perturbed(collections.abc.Mapping):
    """``values`` with every floating-point array one ULP away, computed per key
    when asked (a side loading a chunk at a time holds one chunk, not a second
    copy of the model). The direction of each element comes from a generator
    seeded by ``seed`` and the key, so it does not depend on the order keys
    are read in."""

    def __init__(self, values: Mapping[str, Any], seed: int):
        self._values = values
        self._seed = int(seed) % (1 << 64)

    def __getitem__(self, key: str) -> np.ndarray:
        rng = np.random.default_rng([self._seed, zlib.crc32(str(key).encode("utf-8"))])
        return _one_ulp(self._values[key], rng)

    def __contains__(self, key) -> bool:
        return key in self._values

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)


def measure(reference: Any, perturbed_run: Any, name: str) -> dict[str, float]:
    """``{leaf name: floor}``: the largest absolute difference between the
    reference TF1 capture and the perturbed one, leaf by leaf, named as
    :func:`equivtool.comparison.compare` names them under ``name`` (so they
    match the TF1-vs-TF2 comparison of the same structure). A leaf whose
    values could not be compared has a NaN floor, which widens nothing."""
    found = compare(reference, perturbed_run, Tolerance.exact(), name=name)
    return {leaf.name: (leaf.max_abs if leaf.values_compared else math.nan) for leaf in found.leaves}


def _widenable(leaf: LeafComparison) -> bool:
    """A failed leaf whose failure is only a size of difference (same shape and
    dtype, finite on both sides where it differs, something compared)."""
    return (leaf.failed and leaf.values_compared and leaf.compared > 0 and not leaf.shape_mismatch
            and not leaf.dtype_mismatch and not leaf.nan_mismatch and not leaf.inf_mismatch
            and math.isfinite(leaf.max_abs))


def _number(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


@dataclasses.dataclass(frozen=True)
class FloorJudgement:
    """The comparisons after the floor, what the report says about it, and the
    per-step, per-leaf numbers (``data``: ``{"multiple", "seed", "perturbation",
    "largest_floor", "consistent_with_rounding", "steps": [{leaf: [difference,
    floor]}, ...]}``)."""

    comparisons: tuple[Comparison, ...]
    notes: tuple[str, ...]
    data: Mapping[str, Any]


def judge(comparisons: Sequence[Comparison], floors: Sequence[Mapping[str, float]], multiple: float,
          seed: int | None, wording: FloorWording = NOISE) -> FloorJudgement:
    """Judge each step's TF1-vs-TF2 comparison against that step's floor (see
    the module docstring); ``floors[i]`` is :func:`measure`'s result for
    ``comparisons[i]``; ``seed`` None: a floor measured without one."""
    if len(comparisons) != len(floors):
        raise ValueError(f"floors: expected one per compared step ({len(comparisons)}), got {len(floors)}")
    judged, rows, rounding, beyond = [], [], [], []
    largest = (0.0, "", 0)
    for step, (comparison, floor) in enumerate(zip(comparisons, floors), start=1):
        leaves, row = [], {}
        for leaf in comparison.leaves:
            level = floor.get(leaf.name, math.nan)
            row[leaf.name] = [_number(leaf.max_abs), _number(level)]
            if math.isfinite(level) and level > largest[0]:
                largest = (level, leaf.name, step)
            if _widenable(leaf) and math.isfinite(level) and level > 0:
                if leaf.max_abs <= multiple * level:
                    text = (f"consistent with {wording.verdict}: max abs diff {leaf.max_abs:.3g} is within "
                            f"{multiple:g} x the {wording.label} {level:.3g}")
                    leaf = dataclasses.replace(leaf, ok=True, below_atol=False,
                                               note=f"{leaf.note}; {text}" if leaf.note else text)
                    rounding.append((leaf.name, leaf.max_abs, level))
                else:
                    beyond.append((leaf.name, leaf.max_abs, level))
            elif _widenable(leaf):
                beyond.append((leaf.name, leaf.max_abs, level))
            leaves.append(leaf)
        judged.append(dataclasses.replace(comparison, leaves=tuple(leaves)))
        rows.append(row)

    def listed(found: list) -> str:
        shown = ", ".join(f"{name} (diff {d:.3g}, floor {f:.3g})" for name, d, f in found[:5])
        return shown + (f" and {len(found) - 5} more" if len(found) > 5 else "")

    run = f"{wording.label}: {wording.run} {wording.perturbation}" + ("" if seed is None else f" (seed {seed})")
    if largest[0] > 0:
        summary = (f"{run}; largest floor {largest[0]:.3g} ({largest[1]}); a difference within {multiple:g} x a "
                   f"leaf's floor is consistent with {wording.verdict}")
    else:
        summary = f"{run} reproduced every value exactly (floor 0): nothing is widened"
    notes = [summary]
    if rounding:
        notes.append(f"above tolerance but consistent with {wording.verdict} ({len(rounding)}): {listed(rounding)}")
    if beyond:
        notes.append(f"beyond tolerance and beyond {multiple:g} x the {wording.label} ({len(beyond)}): "
                     f"{listed(beyond)}")
    data = {"multiple": multiple, "seed": seed, "perturbation": wording.perturbation,
            "largest_floor": largest[0], "consistent_with_rounding": [name for name, _, _ in rounding],
            "steps": rows}
    return FloorJudgement(tuple(judged), tuple(notes), data)


def judge_runs(comparisons: Sequence[Comparison], references: Sequence[Any], perturbed_runs: Sequence[Any],
               multiple: float, seed: int | None, wording: FloorWording = NOISE) -> FloorJudgement:
    """:func:`judge` with the floors measured here: ``references[i]`` and
    ``perturbed_runs[i]`` are the TF1 captures of step ``i`` in the structure
    that ``comparisons[i]`` compared as expected (so that leaf names match)."""
    if not len(comparisons) == len(references) == len(perturbed_runs):
        raise ValueError(f"perturbed_runs: expected one capture per compared step ({len(comparisons)}), got "
                         f"{len(references)} reference and {len(perturbed_runs)} perturbed")
    floors = [measure(reference, again, comparison.name)
              for comparison, reference, again in zip(comparisons, references, perturbed_runs)]
    return judge(comparisons, floors, multiple, seed, wording)
