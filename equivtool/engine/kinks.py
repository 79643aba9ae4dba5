"""Kinks: gradients that part because an element lies on opposite sides of a ReLU's 0
or of a max-pool window's tie in the two TensorFlows (issue 37).

Why it exists: the gradient of a net with ReLUs and max pooling is a discontinuous
function of its forward values. With ``tf1_python`` the TF1 side runs TensorFlow
1.15's kernels, which round differently from this TensorFlow's; an element whose
ReLU input is within that rounding of 0 can be positive on one side and not on the
other, and the gradient there is then the whole incoming value on one side and 0
on the other. From there the difference spreads to every earlier layer
(benchmarks/RESULTS.md, "inception_v1 against TensorFlow 1.15, op by op": 13
elements of 10 batch norms, the stem's gradient 0.25 apart). The kernel floor
(:mod:`equivtool.engine.kernel_floor`) models the smooth part of kernel rounding;
whether its own perturbed run flips the same kinks is chance, so it cannot judge
this. Widening a floor until the step passes would be a guess.

How, with ``kernel_floor=True`` (no strategy): the ``gradients`` and ``optimizer``
steps' TF2 training calls run with an op callback recording, in program order, the
input of every ReLU, ReLU6, leaky ReLU and max pool (:class:`KinkTap`); the TF1
interpreter builds the same gradients a second time with those ops' gradient
kernels fed a stand-in for their forward input, in its reference graph and in the
kernel floor's perturbed one. After the TF2 side, where the step fails as computed,
the TF1 side's lane sends the TF2 inputs there (ops aligned by order, type and shape; :func:`route_gradients`) and
gets back the TF1 gradients *routed as the TF2 side's forward values route them*,
the gradients as computed again (which must reproduce the step's bit for bit), and
each kink's TF1 input. A step that failed passes only when both hold
(:func:`judge_gradients`):

1. every element on opposite sides of a kink (ReLU: the sign; ReLU6: inside (0, 6);
   max pool: which element is the window's maximum) is within ``noise_floor_multiple``
   times that op's *forward kernel floor* of it: the gap (ReLU: ``|x1 - x2|``, which
   bounds both sides' distances to the kink; max pool: how far each side's chosen
   element is below its own maximum) at most the multiple times the largest
   difference the injected rounding made in that op's input;
2. the routed TF1 gradients agree with the TF2 gradients within tolerance or
   ``noise_floor_multiple`` times their own kernel floor (the reference's routed
   gradients against the perturbed run's, routed by the same TF2 values: a floor of
   smooth rounding alone, with no kink of its own flipped).

Otherwise the verdict stands and the notes say which kink or leaf is beyond its
floor. A flip at an op whose gradient cannot be routed (overridden, in a v1 control
flow context, a dynamic shape) is never explained. No flip at all explains nothing.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from equivtool.engine import kernel_floor, noise_floor
from equivtool.report import StepResult

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.options import Options
    from equivtool.engine.run import Engine

__all__ = ["KINK_TYPES", "KEY", "KinkTap", "flipped", "judge_gradients", "route_gradients", "routed_on", "wanted"]

#: The op types whose gradient is chosen by comparing forward values (the TF1 program's list too).
KINK_TYPES = ("Relu", "Relu6", "LeakyRelu", "MaxPool")
KEY = "kink_route"  # the TF1 capture's key for the routed run
KINK = noise_floor.FloorWording(
    "kernel floor", "the TF1 gradients routed at the TF2 side's kinks, run again in the TF1 interpreter with",
    kernel_floor.PERTURBATION, "kernel rounding at the kinks")


def wanted(o: "Options", kernel_floor_on: bool | None = None) -> bool:
    """Whether kinks are routed (in the ``gradients`` and ``optimizer`` steps): the kernel
    floor on (``kernel_floor_on``: the shadow engine's own flag), the TF1 side in the TF1
    interpreter and no strategy (each replica would route its own part of the batch)."""
    on = o.kernel_floor if kernel_floor_on is None else kernel_floor_on
    return bool(on and o.tf1_python is not None and o.strategy is None)


def tap(o: "Options") -> KinkTap:
    """A tap for the TF2 side's training call (sinks in a traced graph only with
    ``graph_rewrites="as_written"``: see :class:`KinkTap`)."""
    return KinkTap(sinks=o.graph_rewrites == "as_written")


def routed_on(e: "Engine") -> bool:
    """:func:`wanted` for an engine (the kernel floor's shadow engine included)."""
    return wanted(e.options, e.options.kernel_floor or getattr(e, "kernel_floor_run", False))


# --------------------------------------------------------------------------
# the TF2 side: the kinks' inputs, as its training call runs them
# --------------------------------------------------------------------------

class KinkTap:
    """An op callback (install it with ``tf2_side.run_tapped``) keeping the input of
    every op of :data:`KINK_TYPES` that runs on the installing thread, in program
    order: an eager op's as it runs; an op of a ``tf.function`` being traced through a
    ``numpy_function`` sink that keeps it when the function runs (numbered in trace
    order, which is program order, whatever order the sinks run in). A sink is one
    more consumer of the op's input: with ``graph_rewrites="tensorflow_default"`` a
    graph rewrite could fuse differently because of it, so there (``sinks=False``)
    traced kinks are only noted, not kept."""

    def __init__(self, sinks: bool = True):
        self.thread = threading.get_ident()
        self.sinks = sinks
        self.records: list = []   # (op type, input as NumPy), eager
        self.traced: list = []    # op types, traced
        self.sunk: dict = {}      # trace number -> input as NumPy, once the function ran
        self.busy = False

    def __call__(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        if threading.get_ident() != self.thread or self.busy:
            return None
        if isinstance(op_type, bytes):  # eager execution passes the type as bytes
            op_type = op_type.decode("utf-8")
        if op_type not in KINK_TYPES:
            return None
        if graph is None:
            self.records.append((op_type, inputs[0].numpy()))
            return None
        number = len(self.traced)
        self.traced.append(op_type)
        if self.sinks:
            import tensorflow as tf

            def sink(value, number=number):
                self.sunk[number] = np.array(value)
                return np.zeros((), np.int8)
            self.busy = True  # (the sink is an op too)
            try:
                tf.numpy_function(sink, [inputs[0]], tf.int8, stateful=True, name="equivtool_kink_sink")
            finally:
                self.busy = False
        return None

    def capture(self) -> dict:
        """``{"types": [...], "inputs": [...]}``, or ``{"error": why}``."""
        if self.traced and self.records:
            return {"error": "the TF2 call ran kinks both eagerly and in a traced graph"}
        if self.traced:
            if not self.sinks:
                return {"error": "under tf.function with graph_rewrites='tensorflow_default' a kink's input is not "
                                 "kept (a sink could change how the graph is rewritten)"}
            if sorted(self.sunk) != list(range(len(self.traced))):
                return {"error": f"the traced function ran {len(self.sunk)} of its {len(self.traced)} kink sinks"}
            return {"types": list(self.traced), "inputs": [self.sunk[i] for i in range(len(self.traced))]}
        return {"types": [t for t, _ in self.records], "inputs": [x for _, x in self.records]}


# --------------------------------------------------------------------------
# the TF1 side's lane, after the TF2 side: the routed run
# --------------------------------------------------------------------------

def _aligned(specs: Sequence[Mapping], tf2: Mapping) -> str:
    """Why the TF2 side's kinks cannot stand in for the TF1 side's (empty when they can)."""
    if "error" in tf2:
        return tf2["error"]
    types, inputs = tf2["types"], tf2["inputs"]
    if len(types) != len(specs):
        return (f"the TF1 loss is computed from {len(specs)} ReLU/max-pool ops, the TF2 training call ran "
                f"{len(types)}")
    for i, (spec, kind, value) in enumerate(zip(specs, types, inputs)):
        if spec["type"] != kind or list(spec["shape"] or []) != list(np.shape(value)):
            return (f"kink {i}: TF1 {spec['name']} ({spec['type']}, {spec['shape']}) against a TF2 {kind} "
                    f"of shape {list(np.shape(value))}: the ops do not align in order")
    return ""


def _not_routed(e: "Engine", tf1: Mapping, tf2: Mapping, steps: Sequence[Mapping]) -> str | None:
    """Why the step's kinks are not routed ("": not asked for; None: they are), ``steps``
    being the TF2 side's kink captures (one per training step)."""
    if not routed_on(e) or "kinks" not in tf1 or "kinks" not in tf2:
        return ""
    if not kernel_floor.measured(tf1):
        return "no kernel floor was measured for the step"
    for step, found in enumerate(steps):
        why = _aligned(tf1["kinks"], found)
        if why:
            return why if len(steps) == 1 else f"step {step + 1}: {why}"
    if not tf1["kinks"]:
        return "the loss is computed from no ReLU or max-pool op"
    return None


def route_gradients(e: "Engine", tf1: dict, tf2: dict) -> dict:
    """``tf1`` (the ``gradients`` step's TF1 capture) with :data:`KEY` added: the TF1
    gradients routed at the TF2 side's kinks in the reference graph and in the kernel
    floor's (``{"ref": ..., "floor": ...}``, each :meth:`OldTF1Side.route`'s answer),
    or ``{"error": why}``. Runs on the TF1 side's lane, after the TF2 side and before
    the next step's TF1 side; unchanged where kinks are not routed."""
    why = _not_routed(e, tf1, tf2, [tf2.get("kinks")])
    if why is not None:
        return {**tf1, KEY: {"error": why}} if why else tf1
    values = {i: value for i, (spec, value) in enumerate(zip(tf1["kinks"], tf2["kinks"]["inputs"]))
              if not spec["unroutable"]}
    found = {"ref": e.tf1_half.route_kinks(values), "floor": e.kernel_shadow.tf1_half.route_kinks(values)}
    return {**tf1, KEY: found}


def route_optimizer(e: "Engine", tf1: dict, tf2: dict) -> dict:
    """As :func:`route_gradients` for the ``optimizer`` step: its training steps run again
    from the same start with the kinks routed by the TF2 side's inputs at each step
    (:meth:`OldTF1Half.route_training`), in the reference graph and the kernel floor's."""
    why = _not_routed(e, tf1, tf2, tf2.get("kinks") or [])
    if why is not None:
        return {**tf1, KEY: {"error": why}} if why else tf1
    values = {(step, i): value for step, found in enumerate(tf2["kinks"])
              for i, (spec, value) in enumerate(zip(tf1["kinks"], found["inputs"])) if not spec["unroutable"]}
    steps = len(tf2["kinks"])
    shadow = tf1[kernel_floor.KEY]["run"]
    found = {"ref": e.tf1_half.route_training(tf1["_kink_training"], tf1["_kink_start"], steps, values),
             "floor": e.kernel_shadow.tf1_half.route_training(shadow["_kink_training"], shadow["_kink_start"],
                                                              steps, values)}
    return {**tf1, KEY: found}


# --------------------------------------------------------------------------
# the judgement (NumPy)
# --------------------------------------------------------------------------

def _windows(x: np.ndarray, attrs: Mapping) -> np.ndarray:
    """Every max-pool window of a 4-D ``x`` as ``[..., window elements]`` (SAME: padded with -inf)."""
    nhwc = attrs.get("data_format", "NHWC") == "NHWC"
    ksize, strides = list(attrs["ksize"]), list(attrs["strides"])
    if not nhwc:  # NCHW -> NHWC
        x, ksize, strides = np.moveaxis(x, 1, -1), [ksize[i] for i in (0, 2, 3, 1)], [strides[i] for i in (0, 2, 3, 1)]
    if x.ndim != 4 or ksize[0] != 1 or ksize[3] != 1 or strides[0] != 1 or strides[3] != 1:
        raise ValueError(f"max pool with ksize {attrs['ksize']} and strides {attrs['strides']}: only spatial "
                         "windows are routed")
    (kh, kw), (sh, sw) = ksize[1:3], strides[1:3]
    if attrs.get("padding") == "SAME":
        pads = []
        for size, k, s in ((x.shape[1], kh, sh), (x.shape[2], kw, sw)):
            out = -(-size // s)
            total = max((out - 1) * s + k - size, 0)
            pads.append((total // 2, total - total // 2))
        x = np.pad(x.astype(np.float64), [(0, 0), pads[0], pads[1], (0, 0)], constant_values=-np.inf)
    views = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))[:, ::sh, ::sw]
    return views.reshape(views.shape[:4] + (kh * kw,))


def flipped(spec: Mapping, x1: np.ndarray, x2: np.ndarray) -> np.ndarray:
    """The gaps at the elements (max pool: the windows) that lie on opposite sides of
    ``spec``'s kink in ``x1`` (TF1's input to the op) and ``x2`` (TF2's): see the
    module docstring; NaN where a value is not finite."""
    x1, x2 = np.asarray(x1, np.float64), np.asarray(x2, np.float64)
    kind = spec["type"]
    if kind == "MaxPool":
        w1, w2 = _windows(x1, spec["attrs"]), _windows(x2, spec["attrs"])
        a1, a2 = np.argmax(w1, axis=-1)[..., None], np.argmax(w2, axis=-1)[..., None]
        at = a1[..., 0] != a2[..., 0]
        gap1 = (np.take_along_axis(w1, a1, -1) - np.take_along_axis(w1, a2, -1))[..., 0]
        gap2 = (np.take_along_axis(w2, a2, -1) - np.take_along_axis(w2, a1, -1))[..., 0]
        with np.errstate(invalid="ignore"):
            return np.maximum(gap1, gap2)[at]
    if kind == "Relu6":
        side1, side2 = (x1 > 0) & (x1 < 6), (x2 > 0) & (x2 < 6)
    else:
        side1, side2 = x1 > 0, x2 > 0
    at = (side1 != side2) | ~np.isfinite(x1) | ~np.isfinite(x2)
    return np.abs(x1 - x2)[at]


def _forward_floor(x1: np.ndarray | None, x1p: np.ndarray | None) -> float:
    """The largest difference the injected rounding made in a kink's input (NaN: none measured)."""
    if x1 is None or x1p is None or np.shape(x1) != np.shape(x1p):
        return math.nan
    a, b = np.asarray(x1, np.float64), np.asarray(x1p, np.float64)
    finite = np.isfinite(a) & np.isfinite(b)
    return float(np.max(np.abs(a - b)[finite])) if finite.any() else math.nan


@dataclasses.dataclass(frozen=True)
class Flip:
    """The elements of one kink op on opposite sides of its kink."""

    op: str
    type: str
    count: int
    largest_gap: float
    floor: float
    explained: bool
    why: str = ""  # when not explained


def flips(specs: Sequence[Mapping], ref_inputs: Sequence, floor_inputs: Sequence, tf2_inputs: Sequence,
          multiple: float) -> list[Flip]:
    """Every kink op with an element on opposite sides in TF1 and TF2, judged (see the module docstring)."""
    found = []
    for spec, x1, x1p, x2 in zip(specs, ref_inputs, floor_inputs, tf2_inputs):
        try:
            gaps = flipped(spec, x1, x2)
        except ValueError as exc:
            found.append(Flip(spec["name"], spec["type"], 0, math.nan, math.nan, False, str(exc)))
            continue
        if gaps.size == 0:
            continue
        floor = _forward_floor(x1, x1p)
        largest = float(np.max(gaps)) if np.all(np.isfinite(gaps)) else math.nan
        why = ""
        if spec["unroutable"]:
            why = f"its gradient cannot be routed: {spec['unroutable']}"
        elif not math.isfinite(largest):
            why = "a value there is not finite"
        elif not (math.isfinite(floor) and floor > 0):
            why = "the injected rounding did not move its input (a forward kernel floor of 0)"
        elif largest > multiple * floor:
            why = f"gap {largest:.3g} beyond {multiple:g} x its forward kernel floor {floor:.3g}"
        found.append(Flip(spec["name"], spec["type"], int(gaps.size), largest, floor, not why, why))
    return found


def _same_bits(a: Mapping, b: Mapping) -> bool:
    return set(a) == set(b) and all(
        np.shape(a[k]) == np.shape(b[k]) and np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in a)


def _noted(result: StepResult, note: str, summary: Mapping | None = None) -> StepResult:
    data = result.data if summary is None else {**result.data, "kink_floor": dict(summary)}
    return dataclasses.replace(result, notes=result.notes + (note,), data=data)


def _flips_judged(e: "Engine", result: StepResult, tf1: Mapping, ref_steps, floor_steps, tf2_steps):
    """``(summary, lead note, finished result or None)``: the flips of every step (each a
    list of kink inputs) judged; a result when the judgement ends there (no flip, or one
    that rounding does not explain), the step's verdict unchanged."""
    multiple = e.options.noise_floor_multiple
    specs = tf1["kinks"]
    found, per_step = [], []
    for number, (ref, floor, tf2) in enumerate(zip(ref_steps, floor_steps, tf2_steps), start=1):
        step = flips(specs, ref, floor, tf2, multiple)
        per_step.append(sum(f.count for f in step))
        found += [dataclasses.replace(f, op=f"step {number}: {f.op}") for f in step] if len(ref_steps) > 1 else step
    counted = sum(f.count for f in found)
    summary = {"kink_ops": len(specs), "flipped_ops": len({f.op.rpartition(": ")[2] for f in found}),
               "flipped_elements": counted,
               "flips": [[f.op, f.type, f.count, _number(f.largest_gap), _number(f.floor), f.explained]
                         for f in found]}
    if len(per_step) > 1:
        summary["flipped_elements_per_step"] = per_step
    if not found:
        return summary, "", _noted(result, (
            f"kink floor: none of the {len(specs)} ReLU/max-pool ops has an element on opposite sides of its kink in "
            "TF1 and TF2: the difference is not there"), summary)
    unexplained = [f for f in found if not f.explained]
    worst = max(found, key=lambda f: f.largest_gap / f.floor if f.floor and math.isfinite(f.floor) else math.inf)
    lead = (f"kink floor: {counted} element(s) of {summary['flipped_ops']} of the {len(specs)} ReLU/max-pool ops lie "
            f"on opposite sides of the kink in TF1 and TF2 (largest gap {worst.largest_gap:.3g} at {worst.op}, its "
            f"forward kernel floor {worst.floor:.3g})")
    if unexplained:
        names = "; ".join(f"{f.op}: {f.why}" for f in unexplained[:5])
        return summary, lead, _noted(
            result, f"{lead}; not explained by kernel rounding at {len(unexplained)} op(s): {names}", summary)
    return summary, lead + f", each within {multiple:g} x its forward kernel floor", None


def _routed_judged(e: "Engine", result: StepResult, comparisons: Sequence, floors: Sequence, summary: dict,
                   lead: str) -> StepResult:
    """``result`` passed on the routed ``comparisons`` where each is within tolerance or the
    multiple of its routed kernel floor (``floors``, per comparison ``{leaf: floor}``);
    unchanged, with a note, where one is not."""
    multiple = e.options.noise_floor_multiple
    judged = noise_floor.judge(comparisons, floors, multiple, None, KINK)
    summary["routed"] = judged.data
    if not all(c.ok for c in judged.comparisons):
        return _noted(result, f"{lead}; but routed alike the values still differ beyond their floor: "
                      + "; ".join(judged.notes), summary)
    before = sum(1 for c in result.comparisons for leaf in c.leaves if not leaf.ok)
    notes = [f"{lead}; as computed {before} leaf/leaves failed; the TF1 side routed at those kinks as the TF2 "
             f"side's forward values route them agrees within tolerance or {multiple:g} x its own kernel floor (the "
             "comparisons below are the routed ones)"]
    return kernel_floor.rejudged(result, judged, notes, {"kink_floor": summary})


def _preamble(result: StepResult, tf1: Mapping) -> StepResult | Mapping:
    """The routed runs, or the result to return as it is (not routed, not failed, an error)."""
    found = tf1.get(KEY)
    if found is None or result.status != "failed":
        return result
    if "error" in found:
        return _noted(result, f"kink floor: not applied ({found['error']})")
    return found


def judge_gradients(e: "Engine", result: StepResult, tf1: Mapping, tf2: Mapping) -> StepResult:
    """``result`` (the ``gradients`` step judged against its kernel floor) judged again
    at its kinks where it failed (see the module docstring); unchanged where kinks are
    not routed or the step did not fail."""
    found = _preamble(result, tf1)
    if isinstance(found, StepResult):
        return found
    ref, floor_run = found["ref"], found["floor"]
    run = tf1[kernel_floor.KEY]["run"]
    if not (_same_bits(ref["gradients"], tf1["gradients"]) and _same_bits(floor_run["gradients"], run["gradients"])):
        return _noted(result, "kink floor: not applied (the TF1 interpreter's re-run did not reproduce the step's "
                              "gradients bit for bit)")
    summary, lead, done = _flips_judged(e, result, tf1, [ref["inputs"]], [floor_run["inputs"]],
                                        [tf2["kinks"]["inputs"]])
    if done is not None:
        return done
    keys = list(tf1["gradients"])
    routed = {k: ref["routed"][k] for k in keys if k in ref["routed"]}
    loss = ("loss", np.float32(tf1["loss"]), np.float32(tf2["loss"]))
    again = e.compare_step(result.name, [loss, ("gradients", routed, tf2["gradients"])])
    floors = e.compare_step(result.name, [("loss", np.float32(tf1["loss"]), np.float32(run["loss"])),
                                          ("gradients", routed, {k: floor_run["routed"][k] for k in keys
                                                                 if k in floor_run["routed"]})])
    by_name = kernel_floor.floors_by_name(floors)
    return _routed_judged(e, result, again.comparisons, [by_name.get(c.name, {}) for c in again.comparisons],
                          summary, lead)


def judge_optimizer(e: "Engine", result: StepResult, tf1: Mapping, tf2: Mapping, expected) -> StepResult:
    """``result`` (the ``optimizer`` step) judged again with its kinks routed where it
    failed: every step's flips explained by kernel rounding, and every step's loss and
    variables of the routed TF1 run within tolerance or the multiple of their routed
    kernel floor against the TF2 side's. ``expected(loss, values, tf2 values)`` is the
    step's TF1 structure as it compares it."""
    found = _preamble(result, tf1)
    if isinstance(found, StepResult):
        return found
    ref, floor_run = found["ref"], found["floor"]
    run = tf1[kernel_floor.KEY]["run"]
    first = (np.float32(ref["losses"][0]) == np.float32(tf1["losses"][0])
             and np.float32(floor_run["losses"][0]) == np.float32(run["losses"][0]))
    if not first:
        return _noted(result, "kink floor: not applied (the TF1 interpreter's re-run did not start from the step's "
                              "state: its first loss differs)")
    summary, lead, done = _flips_judged(e, result, tf1, ref["inputs"], floor_run["inputs"],
                                        [step["inputs"] for step in tf2["kinks"]])
    if done is not None:
        return done
    comparisons, floors = [], []
    for step, (loss, values, floor_loss, floor_values, tf2_loss, tf2_values) in enumerate(zip(
            ref["losses"], ref["variables"], floor_run["losses"], floor_run["variables"], tf2["losses"],
            tf2["variables"])):
        name = f"step_{step + 1}"
        comparisons.append(e.compare("optimizer", expected(loss, values, tf2_values),
                                     {"loss": np.float32(tf2_loss), "variables": tf2_values}, name=name, index=step))
        floors.append(noise_floor.measure(expected(loss, values, tf2_values),
                                          expected(floor_loss, floor_values, tf2_values), name))
    return _routed_judged(e, result, comparisons, floors, summary, lead)


def _number(x: float) -> Any:
    return None if not math.isfinite(x) else float(x)
