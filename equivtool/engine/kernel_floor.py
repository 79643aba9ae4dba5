"""A kernel floor: the TF1 side run again with rounding injected at every op.

Why it exists: with ``tf1_python`` the TF1 side runs in TensorFlow 1.15,
whose kernels (convolutions, fused batch norm, reductions) round differently
from this TensorFlow's by a few units in the last place (ULPs) at every op;
depth and batch norm over few values amplify that, so a faithful rewrite can
miss the guide's tolerance across versions by orders of magnitude (the zoo's
inception_v1 and resnet_v1_50, benchmarks/RESULTS.md). The noise floor
(:mod:`equivtool.engine.noise_floor`) moves only the *start* state by one ULP,
which under-models a kernel that rounds differently at every op; widening a
tolerance by hand is a guess. This floor is measured instead.

How: with ``kernel_floor=True`` each step that compares computed values
(:data:`STEPS`) runs its TF1 side a second time in the TF1 interpreter, on a
shadow engine of its own (the same steps in the same order, so its state
follows the reference's), whose graphs have every float32/float64 output of
every compute op moved one ULP towards +inf or -inf, forward, gradient and
optimizer-update ops alike (``perturb_ops`` in the old-side program: the
direction per element from its own lowest mantissa bit and the op's index,
no random op; zeros and non-finite values kept). Not perturbed, and counted
by reason in the report: state (variables, their reads, constants,
placeholders), ops in v1 control-flow contexts, random draws, ops that are
exact in every version (reshapes, concatenations, ReLU, max pooling), and
ref-typed outputs (a ref variable's update: the optimizer kernel's own
rounding is what the noise floor models, hence the optimizer step's larger
of the two).

The **kernel floor** of a leaf is the largest absolute difference between
the reference TF1 run and the perturbed one; the judgement is the noise
floor's (:func:`equivtool.engine.noise_floor.judge`, same multiple): a leaf
that failed only by size passes as "consistent with kernel rounding" when
its TF1-vs-TF2 difference is within ``noise_floor_multiple`` times its
kernel floor; a floor of 0 or NaN widens nothing; nothing compared never
passes. A step whose values depend on random ops in a TF1 while loop is not
widened (its draws cannot be aligned). Only sides in the TF1 interpreter
can do this: in-process both sides share one TensorFlow's kernels, so
``kernel_floor`` is refused there.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from equivtool.comparison import Comparison
from equivtool.engine import noise_floor
from equivtool.report import StepResult

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.run import Engine

__all__ = ["KERNEL", "KEY", "STEPS", "PERTURBATION", "close", "floors_by_name", "judge_optimizer", "judge_pairs", "measured", "rejudged",
           "second_run", "unmeasured_note"]

#: The steps whose TF1 side runs again with rounding injected (those that compare computed values).
STEPS = frozenset({"fixed_weights", "gradients", "optimizer",
                   *(f"random/{mode}/{what}" for mode in ("constant", "num_random_ops")
                     for what in ("inference", "training"))})
KEY = "kernel_floor_run"  # the TF1 capture's key for the second run
PERTURBATION = ("one ULP towards +inf or -inf (per element, from its lowest mantissa bit and the op's index) "
                "at every floating-point output of every compute op")
KERNEL = noise_floor.FloorWording("kernel floor", "TF1 run again in the TF1 interpreter with", PERTURBATION,
                                  "kernel rounding")


# --------------------------------------------------------------------------
# the second run
# --------------------------------------------------------------------------

def _shadow(engine: "Engine") -> "Engine":
    """The engine whose TF1 sides open their graphs with rounding injected, sharing the
    TF1 interpreter (made on first use; no noise floor, no localization there)."""
    found = getattr(engine, "kernel_shadow", None)
    if found is None:  # (the reference side ran first: the interpreter has started)
        options = dataclasses.replace(engine.options, noise_floor=False, localize=False,
                                      strict_intermediates=False, progress=None, kernel_floor=False)
        found = type(engine)(options)
        found.kernel_floor_run = True
        found.old_program = engine.old_program
        engine.kernel_shadow = found
    return found


def second_run(engine: "Engine", step, outcome: tuple, run_tf1: Callable[["Engine"], Any],
               attempt: Callable[[Callable[[], Any]], tuple]) -> tuple:
    """``outcome`` (the TF1 side's, see :mod:`equivtool.engine.run`), its capture
    holding under :data:`KEY` the kernel-floor run of the same TF1 function
    (``run_tf1(shadow engine)``, run through ``attempt``, the engine's
    ``run.attempt``): ``{"run": capture, "ops": counts}``, or ``{"error":
    message}`` when it could not run (then nothing is widened). Unchanged
    without ``kernel_floor``, for other steps, or when the side failed."""
    if not engine.options.kernel_floor or step.name not in STEPS or outcome[0] != "ok":
        return outcome
    shadow = _shadow(engine)
    if not step.shared:
        shadow.release_pair()
    found = attempt(lambda: run_tf1(shadow))
    capture = dict(outcome[1])
    if found[0] == "ok":
        ops = shadow.old_program.kernel_ops
        capture[KEY] = {"run": found[1], "ops": {**ops, "skipped": dict(ops.get("skipped", {}))}}
    else:
        capture[KEY] = {"error": found[1]}
    return ("ok", capture, outcome[2] + found[-1])


def close(engine: "Engine") -> None:
    """Drop the shadow engine's graphs there (the interpreter is the engine's to stop)."""
    shadow = getattr(engine, "kernel_shadow", None)
    if shadow is not None:
        engine.kernel_shadow = None
        shadow.release_pair()


# --------------------------------------------------------------------------
# the judgement
# --------------------------------------------------------------------------

def _ops_note(ops: Mapping) -> str:
    skipped = ops.get("skipped") or {}
    reasons = "; ".join(f"{reason}: {count}" for reason, count in sorted(skipped.items(), key=lambda x: -x[1]))
    return (f"kernel floor: {ops.get('perturbed_ops', 0)} ops perturbed ({ops.get('perturbed_outputs', 0)} "
            f"outputs) in the TF1 interpreter's graphs built for it so far; {sum(skipped.values())} skipped"
            + (f" ({reasons})" if reasons else ""))


def _unmeasured(tf1: Mapping) -> str | None:
    """Why no kernel floor applies to this capture, or None when one does."""
    found = tf1.get(KEY)
    if found is None:
        return ""
    if "error" in found:
        return f"kernel floor: not measured ({found['error']}): nothing is widened"
    if tf1.get("loops"):
        return ("kernel floor: not applied: values depend on random ops in a TF1 while loop, whose draws "
                "cannot be aligned")
    return None


def floors_by_name(found: StepResult) -> dict:
    """``{comparison name: {leaf name: largest difference (NaN: nothing compared)}}`` of a
    step compared as a floor run (its differences are the floors)."""
    return {c.name: {leaf.name: (leaf.max_abs if leaf.values_compared else math.nan) for leaf in c.leaves}
            for c in found.comparisons}


def rejudged(result: StepResult, judged: noise_floor.FloorJudgement, notes: Sequence[str], data: Mapping) -> StepResult:
    """``result`` with ``judged``'s comparisons (status recomputed), its notes and ``data``
    added; the step's own message kept while its status is unchanged."""
    again = StepResult.from_comparisons(result.name, result.title, judged.comparisons, seconds=result.seconds,
                                        notes=tuple(result.notes) + tuple(judged.notes) + tuple(notes),
                                        data={**result.data, **data})
    if again.status == result.status and result.message:
        again = dataclasses.replace(again, message=result.message)
    return again


def judge_pairs(e: "Engine", result: StepResult, tf1: Mapping, floor_pairs: Callable[[Mapping], list]) -> StepResult:
    """``result`` (``e.compare_step(name, pairs)``) judged against the kernel floor:
    ``floor_pairs(capture)`` gives the pairs the step compared, with the TF1 capture
    first and ``capture`` (the kernel-floor run's) second, so that the floor's leaves
    are named, renamed and filtered as the step's are."""
    why = _unmeasured(tf1)
    if why is not None:
        return dataclasses.replace(result, notes=result.notes + (why,)) if why else result
    run = tf1[KEY]
    found = e.compare_step(result.name, floor_pairs(run["run"]))
    by_name = floors_by_name(found)
    floors = [by_name.get(c.name, {}) for c in result.comparisons]
    judged = noise_floor.judge(result.comparisons, floors, e.options.noise_floor_multiple, None, KERNEL)
    return rejudged(result, judged, [_ops_note(run["ops"])], {"kernel_floor": {**judged.data, "ops": run["ops"]}})


def judge_optimizer(e: "Engine", comparisons: Sequence[Comparison], references: Sequence[Any],
                    noise_runs: Sequence[Any] | None, kernel_runs: Sequence[Any], tf1: Mapping):
    """The optimizer step's comparisons judged against, per leaf, the larger of its noise
    floor (``noise_runs``: the runs from one ULP away; None without one) and its kernel
    floor (``kernel_runs``): ``(FloorJudgement, notes)``, the notes saying how many leaves
    took which floor and what was perturbed. ``references[i]``, ``noise_runs[i]`` and
    ``kernel_runs[i]`` are step ``i``'s captures in the structure compared."""
    o = e.options
    kernel = [noise_floor.measure(ref, run, c.name) for c, ref, run in zip(comparisons, references, kernel_runs)]
    if noise_runs is None:
        judged = noise_floor.judge(comparisons, kernel, o.noise_floor_multiple, None, KERNEL)
        return judged, [_ops_note(tf1[KEY]["ops"])]
    noise = [noise_floor.measure(ref, run, c.name) for c, ref, run in zip(comparisons, references, noise_runs)]
    floors, larger = [], {"kernel": 0, "noise": 0}
    for by_kernel, by_noise in zip(kernel, noise):
        merged = {}
        for name in set(by_kernel) | set(by_noise):
            k, n = by_kernel.get(name, math.nan), by_noise.get(name, math.nan)
            finite = [x for x in (k, n) if math.isfinite(x)]
            merged[name] = max(finite) if finite else math.nan  # neither measured: widens nothing
            if finite and max(finite) > 0:  # (both 0: neither widens anything)
                larger["kernel" if math.isfinite(k) and not (math.isfinite(n) and n > k) else "noise"] += 1
        floors.append(merged)
    wording = noise_floor.FloorWording(
        "floor", "the larger per leaf of the kernel floor (TF1 run again in the TF1 interpreter with "
        f"{PERTURBATION}) and the noise floor (TF1 run again from the same start with",
        f"{noise_floor.PERTURBATION}, seed {o.seed})", "rounding")
    judged = noise_floor.judge(comparisons, floors, o.noise_floor_multiple, None, wording)
    notes = [f"floor per leaf: the kernel floor for {larger['kernel']} leaf-steps, the noise floor for "
             f"{larger['noise']} (the larger of the two)", _ops_note(tf1[KEY]["ops"])]
    return judged, notes


def measured(tf1: Mapping) -> bool:
    """Whether the TF1 capture holds a kernel-floor run to judge against."""
    found = tf1.get(KEY)
    return found is not None and "run" in found and not tf1.get("loops")


def unmeasured_note(tf1: Mapping) -> list:
    """The note saying why a kernel floor was asked for but not applied (empty otherwise)."""
    why = _unmeasured(tf1)
    return [why] if why else []
