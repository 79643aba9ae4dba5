"""The engine: a loop over the selected steps, and the one path a step takes.

Every step runs as :func:`run_side` for the TF1 side, then for the TF2 side,
then :func:`judge` on their outcomes, whether both sides run in this process
(:meth:`Engine.run_step`) or in worker processes (:mod:`equivtool.engine.workers`).
A side's outcome is a tuple::

    ("ok", capture, seconds) | ("skip", reason, seconds) | ("error", message, traceback, seconds)
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from typing import Any, Callable, Iterable, Mapping

import tensorflow as tf

from equivtool._base.errors import full_traceback, one_line, unfiltered_tracebacks
from equivtool._base.memory import StepMemory, collections_skip_older_objects
from equivtool.variables.mapping import fresh_layer_numbering
from equivtool.comparison import Comparison, compare
from equivtool.coverage import output_levels
from equivtool.engine import output_filter
from equivtool.engine import registry as _steps
from equivtool.engine import signals as _signals
from equivtool.engine.options import Options
from equivtool.engine.outputs import align_output_keys, split_outputs
from equivtool.engine.pair import TF1Half, TF2Half
from equivtool.engine.registry import SkipStep, Step
from equivtool.engine.sides import refusal
from equivtool.engine.sides.tf1_side import TF1Side
from equivtool.engine.sides.tf2_side import TF2Side, restore_snapshot, snapshot_layer
from equivtool.report import StepResult


def attempt(call: Callable[[], Any]) -> tuple:
    """``call()``'s outcome: ``("ok", value, s)``, ``("skip", reason, s)`` when it
    raises :class:`SkipStep`, ``("error", message, traceback, s)`` for any other
    exception (a step that crashes is reported; the others still run)."""
    started = time.perf_counter()
    try:
        with unfiltered_tracebacks():  # keep tf-slim's and the user's frames
            value = call()
    except SkipStep as skip:
        return ("skip", str(skip), time.perf_counter() - started)
    except Exception as exc:
        return ("error", one_line(exc), full_traceback(exc), time.perf_counter() - started)
    return ("ok", value, time.perf_counter() - started)


def run_side(engine: "Engine", step: Step, side: str, tf1_capture=None) -> tuple:
    """One side of ``step`` in this process: its outcome, the capture whole (keys
    starting with ``_`` hold in-process objects; the workers drop them). When
    either side refuses a capability the step needs, the step is skipped with
    that side's reason, before anything is built."""
    reason = engine.refusal(step)
    if reason is not None:
        return ("skip", reason, 0.0)
    split = step.runner()
    params = dict(step.params)
    if side == "tf1":
        tf1 = engine.side_class("tf1").step_side(step) or split.tf1
        outcome = attempt(lambda: tf1(engine, **params))
        if engine.options.kernel_floor:  # the same TF1 side again, rounding injected (engine.kernel_floor)
            from equivtool.engine import kernel_floor
            outcome = kernel_floor.second_run(engine, step, outcome, lambda shadow: tf1(shadow, **params), attempt)
        return outcome
    return attempt(lambda: split.tf2(engine, tf1_capture if split.tf2_needs_tf1 else None, **params))


def after_wanted(engine: "Engine", step: Step) -> bool:
    """Whether ``step``'s TF1 side has a second half to run for ``engine`` (a runner without
    ``SplitStep.tf1_after`` has none)."""
    wanted = getattr(step.runner(), "after_wanted", None)
    return wanted is not None and wanted(engine)


def run_after(engine: "Engine", step: Step, tf1: tuple, tf2: tuple | None) -> tuple:
    """The TF1 outcome after its second half (``SplitStep.tf1_after``, which needs the TF2
    capture), where the step has one for this engine and both sides ran: its capture
    extended, its seconds added. A second half that fails ends the step as a side that
    fails does."""
    if tf1[0] != "ok" or tf2 is None or tf2[0] != "ok" or not after_wanted(engine, step):
        return tf1
    found = attempt(lambda: step.runner().tf1_after(engine, tf1[1], tf2[1]))
    return (found[0], *found[1:-1], tf1[-1] + found[-1])


def judge(engine: "Engine", step: Step, tf1: tuple, tf2: tuple | None, seconds: float) -> StepResult:
    """The step's result from its sides' outcomes (the TF1 side's first, as it ran
    first); ``seconds`` is the time the sides took, the judgement's is added."""
    for outcome in (tf1, tf2):
        if outcome is not None and outcome[0] != "ok":
            return outcome_result(engine, step, outcome, seconds)
    params = dict(step.params)
    judged = attempt(lambda: step.runner().judge(engine, tf1[1], tf2[1], **params))
    if judged[0] != "ok":
        return outcome_result(engine, step, judged, seconds)
    return dataclasses.replace(judged[1], seconds=seconds + judged[-1])


def outcome_result(engine: "Engine", step: Step, outcome: tuple, seconds: float) -> StepResult:
    """The result of a step whose side or judgement was skipped or raised."""
    if outcome[0] == "skip":
        return StepResult(step.name, step.title, "skipped", seconds, message=outcome[1])
    return StepResult(step.name, step.title, "error", seconds, message=outcome[1],
                      notes=step.runner().error_notes(engine), data={"traceback": outcome[2]})



class Engine:
    def __init__(self, options: Options, workdir: str | None = None):
        self.options = options
        layer = options.tf2_layer
        self.user_layer = layer if isinstance(layer, tf.Module) else None
        self.factory = None if self.user_layer is not None else layer
        self._user_layer_used = False
        self.layer_names: set = set()  # the TF2 layers' names: their name scopes may prefix end-point keys
        self._halves: dict = {}        # "tf1" / "tf2" -> the pair's half, or the error that stopped its build
        self._workdir = workdir
        self._tempdir = None
        self.results: dict[str, StepResult] = {}
        self.jobs: list = []           # with workers > 1: the worker jobs (see workers.run_parallel)
        self.give_back_memory = StepMemory()  # between steps, once the process has grown enough
        self._tolerance_keys: dict = {}  # argument -> (its keys seen by a comparison, those a leaf matched)
        self.side_classes = {"tf1": TF1Side, "tf2": TF2Side}  # see engine/sides: what each can do
        self.old_program = None        # with tf1_python: the TF1 side's program (engine/sides/old_python)
        self.old_program_own = None    # and with workers: a second, for steps with models of their own
        self.old_ran_under = self.old_interpreter = None
        if options.tf1_python is not None:
            from equivtool.engine.sides.old_python import OldTF1Side
            self.side_classes["tf1"] = OldTF1Side

    # -- sides -------------------------------------------------------------

    def side_class(self, side: str) -> type:
        """The kind of side (a :class:`~equivtool.engine.sides.Side` class) that runs ``side``."""
        return self.side_classes[side]

    def refusal(self, step: Step) -> str | None:
        """Why ``step`` cannot run on these sides (the TF1 side's reason first), or None."""
        for side in ("tf1", "tf2"):
            reason = refusal(self.side_class(side), step.needs)
            if reason is not None:
                return reason
        return None

    # -- layers ------------------------------------------------------------

    def new_layer(self):
        if self.factory is not None:
            # A VariableMapping's rules name the layers as map_variables saw them.
            with fresh_layer_numbering() if self.options.aligned else contextlib.nullcontext():
                layer = self.factory()
            if not callable(layer):
                raise TypeError(f"tf2_layer: the factory returned {type(layer).__name__}, expected a Keras layer")
            self.layer_names.add(getattr(layer, "name", None))
            return layer
        if self._user_layer_used:
            raise SkipStep("tf2_layer is a layer instance, which can be created only once; pass a "
                           "zero-argument factory (e.g. lambda: MyLayer()) to run this step on a fresh layer")
        self._user_layer_used = True
        self.layer_names.add(getattr(self.user_layer, "name", None))
        return self.user_layer

    # -- the constant-mode pair, one half per side ---------------------------

    def _half(self, side: str, build: Callable):
        """The pair's ``side`` half; a failure to build it is reported once, by the first step."""
        found = self._halves.get(side)
        if isinstance(found, str):
            raise SkipStep(f"not run: building the models failed in an earlier step ({found})")
        if found is None:
            try:
                found = self._halves[side] = build()
            except Exception as exc:
                self._halves[side] = f"{type(exc).__name__}: {exc}"[:300]
                raise
        return found

    @property
    def tf1_half(self) -> TF1Half:
        if self.options.tf1_python is not None:
            from equivtool.engine.sides.old_python import OldTF1Half
            return self._half("tf1", lambda: OldTF1Half(self))
        return self._half("tf1", lambda: TF1Half(self.options))

    @property
    def tf2_half(self) -> TF2Half:
        # A layer instance built before the check got its initial values
        # elsewhere: it receives the TF1 graph's instead (noted in the steps).
        prebuilt = self.user_layer is not None and bool(getattr(self.user_layer, "built", False))
        initial = (lambda: self.tf1_half.side.read_variables()) if prebuilt else None
        return self._half("tf2", lambda: TF2Half(self.options, self.new_layer, initial))

    def release_pair(self, give_back: bool = True) -> None:
        """Close the shared sessions and drop the shared graphs and layer (layers and
        graphs hold reference cycles, hence the collection, once the process has grown
        enough to be worth one: see :class:`~equivtool._base.memory.StepMemory`; not
        with ``give_back=False``, when nothing would reuse the memory)."""
        tf1 = self._halves.get("tf1")
        if not isinstance(tf1, (str, type(None), TF2Half)):  # a TF1Half, or the old interpreter's
            tf1.close()
        if self._halves:
            self._halves.clear()
            if give_back:
                self.give_back_memory()  # cycles collected and heap pages handed back, if grown by STEP_GROWTH

    def workdir(self) -> str:
        """A temporary folder for files a step writes (a TF1 checkpoint), removed by :meth:`close`."""
        if self._workdir is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="equivtool-")
            self._workdir = self._tempdir.name
        return self._workdir

    def close(self) -> None:
        try:
            self.release_pair()
            if getattr(self, "kernel_shadow", None) is not None:
                from equivtool.engine import kernel_floor
                kernel_floor.close(self)
        finally:
            for attribute in ("old_program", "old_program_own"):
                found = getattr(self, attribute)
                if found is not None and not isinstance(found, str):
                    found.close()  # the TF1 interpreter stopped, its folder removed
                if self.options.tf1_python is not None:  # none starts after this (a TF1 thread still running)
                    setattr(self, attribute, "the check ended")
        if self._tempdir is not None:
            self._tempdir.cleanup()
            self._tempdir = self._workdir = None

    # -- bookkeeping -------------------------------------------------------

    def record(self, result: StepResult) -> None:
        self.results[result.name] = result
        if self.options.progress is not None:
            self.options.progress(result)

    def run_step(self, step: Step) -> None:
        """Both sides of ``step`` in this process, judged; the result is recorded."""
        start = time.perf_counter()
        tf1 = run_side(self, step, "tf1")
        tf2 = run_side(self, step, "tf2", tf1[1]) if tf1[0] == "ok" else None
        tf1 = run_after(self, step, tf1, tf2)
        result = judge(self, step, tf1, tf2, 0.0)
        self.record(dataclasses.replace(result, seconds=time.perf_counter() - start))

    def compare(self, step: str, expected, actual, name: str, index: int | None = None) -> Comparison:
        """``compare`` with ``step``'s tolerance, noting which of its keys matched a leaf."""
        spec = self.options.tolerances.get(step, index)
        comparison = compare(expected, actual, spec, name=name)
        if isinstance(spec, Mapping):
            keys = {key for key in spec if key != "*"}
            seen, matched = self._tolerance_keys.setdefault(self.options.tolerances.source(step), (set(), set()))
            seen.update(keys)
            matched.update(keys - set(comparison.unmatched_tolerance_keys))
        return comparison

    def unmatched_tolerance_keys(self) -> list[str]:
        """Tolerance keys that matched no leaf in any comparison they were given to, as
        ``argument[key]`` (e.g. ``step_tolerances['fixed_weights']['logits']``): a typo
        there drops a tolerance silently."""
        return [f"{source}[{key!r}]" for source, (seen, matched) in self._tolerance_keys.items()
                for key in sorted(seen - matched)]

    def compare_step(self, name, pairs: Iterable[tuple], notes=(), data=None) -> StepResult:
        """The step judged on ``pairs`` of ``(label, tf1 value, tf2 value)``: label
        ``"outputs"`` (renamed, split into end points and filtered by ``outputs=``),
        ``"variables"`` (values after a training-mode call) and ``"gradients"`` also
        enter the coverage ledger (``data["proves"]``, see :mod:`equivtool.coverage`)."""
        comparisons = []
        notes = list(notes)
        proves = dict((data or {}).get("proves") or {})
        for label, expected, actual in pairs:
            if label in ("variables", "gradients"):  # the keys both sides hold
                proves["values" if label == "variables" else "gradients"] = [
                    key for key in expected if key in actual]
            if label == "outputs":
                first = len(comparisons)
                expected, actual, stripped = align_output_keys(expected, actual, self.options.renamer,
                                                                 self.layer_names)
                if stripped:
                    notes.append(f"end-point keys: the TF2 layer's own name scope {stripped!r} removed "
                                 "(the only difference from the TF1 keys)")
                names = []
                for sub_label, sub_expected, sub_actual in split_outputs(expected, actual):
                    names += output_filter.leaf_names(sub_expected, sub_label)
                    names += output_filter.leaf_names(sub_actual, sub_label)
                    part = output_filter.select(sub_expected, sub_actual, sub_label, self.options.outputs)
                    if part is not None:
                        comparisons.append(self.compare(name, *part, sub_label))
                unmatched = output_filter.unmatched_note(names, self.options.outputs)
                if unmatched:
                    notes.append(unmatched)
                one_side = output_filter.one_side_note([leaf for c in comparisons for leaf in c.leaves],
                                                       self.options.tf_function)
                if one_side:
                    notes.append(one_side)
                proves["outputs"] = output_levels(comparisons[first:])
            else:
                comparisons.append(self.compare(name, expected, actual, label))
        if proves:
            data = {**(data or {}), "proves": proves}
        below = [leaf for leaf, level in proves.get("outputs", {}).items() if level == "below_atol"]
        if below and len(below) < len(proves["outputs"]):  # the others passing do not speak for them
            notes.append(f"{len(below)} of {len(proves['outputs'])} output leaves are below atol on both sides, "
                         f"so no difference could show in them here: {', '.join(below[:5])}"
                         + (f" (+{len(below) - 5} more)" if len(below) > 5 else ""))
        return StepResult.from_comparisons(name, _steps.title(name), comparisons, notes=notes, data=data)

    def localized(self, result: StepResult, tf1, tf1_outputs, call_tf2: Callable[[Any], Any],
                  state=None) -> StepResult:
        """With ``localize=True``: ``result`` with the first divergent op attached as
        ``data["localization"]`` (see :mod:`equivtool.localize`); its numbers and
        status are left as they are. ``call_tf2(tap)`` runs the TF2 pass with the op
        tap installed; ``state`` (a context-manager factory) puts back what the
        localization pass changed."""
        if not self.options.localize:
            return result
        from equivtool.localize import localize_on_step
        from equivtool.localize.result import strict_intermediates
        strict = self.options.strict_intermediates  # passing steps are localized to be judged
        found = localize_on_step(result, tf1, tf1_outputs, call_tf2, self.options.tolerances.get(result.name),
                                 state=state, strategy=self.options.strategy,
                                 only_failed=self.options.localize != "all" and not strict)
        return strict_intermediates(found) if strict else found

    # -- the loop ----------------------------------------------------------

    def run(self, parallel: Callable[["Engine", int], list] | None = None) -> list[StepResult]:
        """Every selected step, in run order; the results in report order.

        ``parallel(engine, workers)`` (:func:`equivtool.engine.workers.run_parallel`),
        when given, runs the steps with their sides in worker processes and
        returns the jobs it ran. SIGTERM stops it as Ctrl-C does: the ``finally`` runs
        (see :mod:`equivtool.engine.signals`)."""
        with _signals.sigterm_unwinds(), collections_skip_older_objects():
            return self._run(parallel)

    def _run(self, parallel) -> list[StepResult]:
        snapshot = None
        if self.user_layer is not None and getattr(self.user_layer, "built", False):
            snapshot = snapshot_layer(self.user_layer)
        try:
            if parallel is not None:
                self.jobs = parallel(self, self.options.workers)
            else:
                for step in _steps.run_order(self.options.steps, self.options.modes):
                    if not step.shared:
                        self.release_pair()  # steps that build their own models: free its memory first
                    self.run_step(step)
                    if not step.shared:  # its own graph and layer are gone: their memory back too
                        self.give_back_memory()
        finally:
            with _signals.shielded():
                self.close()
                if snapshot is not None:
                    restore_snapshot(snapshot)
        return [self.results[name] for name in _steps.report_order(self.results)]
