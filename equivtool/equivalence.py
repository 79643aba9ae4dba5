"""The equivalence engine: TensorFlow's validation workflow as one call.

``check_equivalence(tf1_fn, tf2_layer, inputs)`` runs the steps of the guide
"Validating correctness & numerical equivalence" and returns an
:class:`~equivtool.report.EquivalenceReport`:

=====================  ==========================================================
``variables_once``     the TF2 layer's second call creates no variable
``parity``             same variable names, shapes, dtypes and trainability
``fixed_weights``      every variable set to a fixed non-random value: inference
                       outputs and regularization losses match
``random``             under :class:`DeterministicRandomTestTool` in each mode
                       (``constant``, ``num_random_ops``): inference and training
                       outputs and regularization losses match
``gradients``          gradients of a scalar loss w.r.t. every trainable variable,
                       matched by name (training mode, constant random mode)
``optimizer``          N optimizer steps (``tf.compat.v1.train`` optimizer against
                       its TF2 counterpart): per-step loss and every variable
``checkpoint``         a TF1 name-based checkpoint loaded into both sides:
                       inference outputs match
=====================  ==========================================================

How work is shared between steps, and why it changes no key, name or number:

* In ``constant`` mode every random op gets the same seeds whatever the order,
  so one TF1 build of the inference pass and one of the training pass (with
  its gradients) serve every constant-mode step; one TF2 layer serves both
  calls. Its second call is the ``variables_once`` check; its variables serve
  ``parity``. The training pass has a graph of its own, so every name scope,
  op name and name-scoped collection is that of a standalone build (built
  second in the inference graph it would see ``net_1/...``); its variables
  take the inference graph's values before it runs and hand them back after
  (batch-norm statistics), as shared variables would.
* ``fixed_weights``, ``optimizer`` and ``checkpoint`` run on that same pair,
  after the random-mode comparisons, and put the variables back afterwards.
* ``num_random_ops`` seeds depend on program order, so each of its inference
  and training comparisons gets a fresh graph and a fresh layer, as in the guide.

A stateful random op in a TF1 session moves along its random stream on every
``Session.run``, while an eager TF2 call creates a new op that starts at the
first draw. Optimizer steps therefore run in constant mode, each TF1 step in a
new session (variables carried over) and each TF2 step as a new eager call (or
a new trace with ``tf_function=True``): step *k* sees each random op's first
draw on both sides, and only the weights carry state from step to step.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import tempfile
import time
import warnings
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from equivtool import _execution, steps as _steps
from equivtool._errors import full_traceback, one_line, unfiltered_tracebacks
from equivtool._pair import TF1Half, TF2Half
from equivtool._step_runs import notes_on_error
from equivtool.comparison import Tolerance, compare
from equivtool.report import EquivalenceReport, StepResult
from equivtool._tree import flatten_tensors
from equivtool.runners import checkpoint_exists, restore_snapshot, snapshot_layer
from equivtool.steps import SkipStep, Step
from equivtool.variables import _make_renamer
from equivtool.checkpoints.mapping import aligned_weights, as_rename
from equivtool.checkpoints.mapping import as_rename

__all__ = ["check_equivalence", "STEPS", "MODES", "DEFAULT_STEPS"]

# Derived from the step registry (equivtool.steps), kept importable from here.
STEPS = _steps.STEPS
DEFAULT_STEPS = _steps.DEFAULT_STEPS
MODES = _steps.MODES


# --------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------

def _check_inputs(inputs) -> dict:
    """Refuse inputs that cannot be compared; return the header notes for the report
    (``non_finite_inputs`` when a leaf holds NaN or infinity)."""
    leaves = flatten_tensors(inputs)
    if not leaves:
        raise ValueError("inputs: expected an array (or a nested structure of arrays), got an empty structure")
    non_finite = []
    for i, leaf in enumerate(leaves):
        array = np.asarray(leaf)
        if array.dtype == object:
            raise TypeError(f"inputs: expected numeric arrays, got a leaf of type {type(leaf).__name__}")
        if array.size == 0:
            raise ValueError(
                f"inputs: leaf {i} has shape {list(array.shape)}, with no elements: both sides would "
                "return empty outputs and nothing could be compared; pass at least one example")
        if np.issubdtype(array.dtype, np.inexact) and not np.isfinite(array).all():
            counts = [(int(np.isnan(array).sum()), "NaN"), (int(np.isposinf(array).sum()), "+inf"),
                      (int(np.isneginf(array).sum()), "-inf")]
            found = ", ".join(f"{n} {what}" for n, what in counts if n)
            non_finite.append(f"leaf {i} (shape {list(array.shape)}): {found} of {array.size}")
    return {"non_finite_inputs": "; ".join(non_finite)} if non_finite else {}


def _check_tolerance_spec(spec, argument: str) -> None:
    if isinstance(spec, Tolerance):
        return
    if not isinstance(spec, Mapping):
        raise TypeError(f"{argument}: expected an equivtool.Tolerance or a {{output name or pattern: Tolerance}} "
                        f"mapping, got {type(spec).__name__}")
    for key, value in spec.items():
        if not isinstance(key, str) or not isinstance(value, Tolerance):
            raise TypeError(f"{argument}: expected {{output name or pattern (str): Tolerance}}, got the item "
                            f"{key!r}: {type(value).__name__}; write Tolerance(rtol=..., atol=...)")


def _step_keys() -> set:
    """What a ``step_tolerances`` key may be: a step, a sub-step, or a prefix of one."""
    keys = set(STEPS)
    for name in _steps.SUB_STEPS:
        parts = name.split("/")
        keys.update("/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
    return keys


class _StepTolerances:
    """``tolerance`` for every step, overridden per step by ``step_tolerances``."""

    def __init__(self, default, per_step: Mapping | None):
        self.default = Tolerance() if default is None else default
        _check_tolerance_spec(self.default, "tolerance")
        if per_step is not None and not isinstance(per_step, Mapping):
            raise TypeError("step_tolerances: expected a mapping {step name: Tolerance, {output: Tolerance} "
                            f"or a function of the optimizer step}}, got {type(per_step).__name__}")
        self.per_step = dict(per_step or {})
        known = _step_keys()
        for key, spec in self.per_step.items():
            if key not in known:
                raise ValueError(f"step_tolerances: unknown step {key!r}; expected one of {list(STEPS)} or "
                                 "a sub-step such as 'random/constant/training'")
            if not (callable(spec) and not isinstance(spec, (Tolerance, Mapping))):
                _check_tolerance_spec(spec, f"step_tolerances[{key!r}]")

    def get(self, step: str, index: int | None = None):
        spec = None
        parts = step.split("/")
        for depth in range(len(parts), 0, -1):
            key = "/".join(parts[:depth])
            if key in self.per_step:
                spec = self.per_step[key]
                break
        if spec is None:
            spec = self.default
        if callable(spec) and not isinstance(spec, (Tolerance, Mapping)):
            spec = spec(index if index is not None else 0)
        return spec


@dataclasses.dataclass(frozen=True)
class _Options:
    """``check_equivalence``'s arguments, checked and normalised, as the engine reads them."""

    tf1_fn: Callable
    tf2_layer: Any                    # a layer instance or a zero-argument factory
    inputs: Any
    steps: tuple
    modes: tuple
    tolerances: _StepTolerances
    loss_fn: Callable | None
    optimizers: tuple | None
    train_steps: int
    checkpoint: Any
    renamer: Callable[[str], str]
    tf_function: bool
    graph_rewrites: str               # "as_written" | "tensorflow_default" (equivtool._execution)
    seed: int
    progress: Callable[[StepResult], None] | None
    meta: Mapping
    strategy: Any
    localize: bool = False
    workers: int = 1
    in_process: str | None = None     # why workers > 1 still runs in one process
    aligned: str | None = None        # rename=VariableMapping: how both sides' weights are aligned

    @property
    def want_gradients(self) -> bool:
        return "gradients" in self.steps

    @classmethod
    def build(cls, tf1_fn, tf2_layer, inputs, *, steps, modes, tolerance, step_tolerances, loss_fn,
              optimizers, train_steps, checkpoint, rename, tf_function,
              graph_rewrites="as_written", seed=42, progress=None, meta=None, strategy=None, localize=False,
              workers=1, disable_arithmetic_optimization=None) -> "_Options":
        """Check every argument (raising an error that names it and the expected
        form) before any work starts."""
        if not callable(tf1_fn):
            raise TypeError(f"tf1_fn: expected a callable tf1_fn(inputs, training), got {type(tf1_fn).__name__}")
        if not callable(tf2_layer):
            raise TypeError("tf2_layer: expected a Keras layer or a zero-argument factory returning one, "
                            f"got {type(tf2_layer).__name__}")
        input_notes = _check_inputs(inputs)
        enabled = [name for name, given in (("optimizers", optimizers is not None),
                                            ("checkpoint", bool(checkpoint)),
                                            ("resume", optimizers is not None
                                             and isinstance(checkpoint, (str, os.PathLike)))) if given]
        selected = _steps.select_steps(steps, enabled)
        selected_modes = _steps.select_modes(modes)
        if "random" in selected and not selected_modes:
            raise ValueError(f"modes: the random step needs at least one mode from {list(MODES)}")
        _check_training(train_steps, optimizers, loss_fn)
        _check_run_options(tf_function, seed, progress, strategy)
        graph_rewrites = _graph_rewrites(graph_rewrites, disable_arithmetic_optimization)
        _check_checkpoint(checkpoint)
        if not isinstance(localize, bool):
            raise TypeError(f"localize: expected True or False, got {localize!r}")
        if isinstance(workers, (bool, np.bool_)) or not isinstance(workers, (int, np.integer)) or workers < 1:
            raise ValueError(f"workers: expected an int >= 1 (processes running the two sides), got {workers!r}")
        options = cls(tf1_fn=tf1_fn, tf2_layer=tf2_layer, inputs=inputs, steps=selected, modes=selected_modes,
                   tolerances=_StepTolerances(tolerance, step_tolerances), loss_fn=loss_fn,
                   optimizers=optimizers, train_steps=train_steps, checkpoint=checkpoint,
                   renamer=_make_renamer(as_rename(rename)), tf_function=bool(tf_function),
                   graph_rewrites=graph_rewrites, seed=int(seed),
                   progress=progress, meta={**input_notes, **_check_meta(meta)}, strategy=strategy,
                   localize=localize, workers=int(workers), aligned=aligned_weights(rename))
        if options.workers > 1:
            from equivtool import _workers
            reason = _workers.in_process_reason(options)
            if reason is None:
                _workers.check_sendable(options)
            options = dataclasses.replace(options, in_process=reason)
        return options


def _check_training(train_steps, optimizers, loss_fn) -> None:
    if isinstance(train_steps, bool) or not isinstance(train_steps, int) or train_steps < 1:
        raise ValueError(f"train_steps: expected an int >= 1, got {train_steps!r}")
    if optimizers is not None and not (isinstance(optimizers, (tuple, list)) and len(optimizers) == 2
                                       and all(callable(o) for o in optimizers)):
        raise TypeError("optimizers: expected a pair (make_tf1_optimizer, make_tf2_optimizer) of "
                        "zero-argument callables")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn: expected a callable loss_fn(outputs, regularization_loss), got {loss_fn!r}")


def _graph_rewrites(graph_rewrites, disable_arithmetic_optimization) -> str:
    """``graph_rewrites``, checked; the deprecated ``disable_arithmetic_optimization``
    (``True``: as written, ``False``: TensorFlow's defaults) still works, with a warning."""
    _execution.check_graph_rewrites(graph_rewrites)
    if disable_arithmetic_optimization is None:
        return graph_rewrites
    if not isinstance(disable_arithmetic_optimization, (bool, np.bool_)):
        raise TypeError(f"disable_arithmetic_optimization: expected True or False, "
                        f"got {disable_arithmetic_optimization!r}")
    implied = "as_written" if disable_arithmetic_optimization else "tensorflow_default"
    if graph_rewrites != "as_written" and graph_rewrites != implied:
        raise ValueError(f"disable_arithmetic_optimization={bool(disable_arithmetic_optimization)} "
                         f"contradicts graph_rewrites={graph_rewrites!r}: pass graph_rewrites alone")
    warnings.warn(f"disable_arithmetic_optimization is deprecated: pass graph_rewrites={implied!r} "
                  "(every numerics-changing Grappler pass, not only the arithmetic optimizer, is "
                  "off by default)", DeprecationWarning, stacklevel=4)
    return implied


def _check_run_options(tf_function, seed, progress, strategy) -> None:
    if not isinstance(tf_function, (bool, np.bool_)):
        raise TypeError(f"tf_function: expected True or False, got {tf_function!r}")
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed: expected an int (the random tool's global seed), got {seed!r}")
    if not -2 ** 63 <= int(seed) < 2 ** 63:
        raise ValueError(f"seed: expected an int that fits in 64 bits (-2**63 <= seed < 2**63), got {seed}")
    if progress is not None and not callable(progress):
        raise TypeError("progress: expected a callable progress(step_result) called after each step, "
                        f"got {type(progress).__name__}")
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"strategy: expected a tf.distribute.Strategy, got {type(strategy).__name__}")


def _check_checkpoint(checkpoint) -> None:
    if checkpoint is None or isinstance(checkpoint, bool):
        return
    if not isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError("checkpoint: expected a TF1 checkpoint path (str or os.PathLike), True to have "
                        f"the TF1 side write one, or None; got {type(checkpoint).__name__}")
    if not checkpoint_exists(checkpoint):
        raise ValueError(f"checkpoint: no TF1 checkpoint at {os.fspath(checkpoint)!r}; expected the prefix "
                         "Saver.save returned (e.g. 'model.ckpt', next to 'model.ckpt.index')")


def _check_meta(meta) -> dict:
    if meta is None:
        return {}
    if not isinstance(meta, Mapping):
        raise TypeError(f"meta: expected a mapping {{name (str): value}} to show in the report's header, "
                        f"got {type(meta).__name__}")
    bad = [key for key in meta if not isinstance(key, str)]
    if bad:
        raise TypeError(f"meta: expected str keys (they are the report header's labels), got {bad[0]!r}")
    return dict(meta)


# --------------------------------------------------------------------------
# The engine: a loop over the selected steps
# --------------------------------------------------------------------------

class _Engine:
    def __init__(self, options: _Options, workdir: str | None = None):
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
        self.jobs: list = []           # with workers > 1: the worker jobs (see _workers.run_parallel)

    # -- layers ------------------------------------------------------------

    def new_layer(self):
        if self.factory is not None:
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
        return self._half("tf1", lambda: TF1Half(self.options))

    @property
    def tf2_half(self) -> TF2Half:
        # A layer instance built before the check got its initial values
        # elsewhere: it receives the TF1 graph's instead (noted in the steps).
        prebuilt = self.user_layer is not None and bool(getattr(self.user_layer, "built", False))
        initial = (lambda: self.tf1_half.side.read_variables()) if prebuilt else None
        return self._half("tf2", lambda: TF2Half(self.options, self.new_layer, initial))

    def release_pair(self) -> None:
        """Close the shared sessions and drop the shared graphs and layer (layers and
        graphs hold reference cycles, hence the collection)."""
        tf1 = self._halves.get("tf1")
        if isinstance(tf1, TF1Half):
            tf1.close()
        if self._halves:
            self._halves.clear()
            gc.collect()

    def workdir(self) -> str:
        """A temporary folder for files a step writes (a TF1 checkpoint), removed by :meth:`close`."""
        if self._workdir is None:
            self._tempdir = tempfile.TemporaryDirectory(prefix="equivtool-")
            self._workdir = self._tempdir.name
        return self._workdir

    def close(self) -> None:
        self.release_pair()
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
        try:
            with unfiltered_tracebacks():  # keep tf-slim's and the user's frames
                result = step.runner()(self, **dict(step.params))
        except SkipStep as skip:
            result = skipped_result(step, str(skip), time.perf_counter() - start)
        except Exception as exc:  # a step that crashes is reported, the others still run
            result = error_result(self, step, one_line(exc), full_traceback(exc), time.perf_counter() - start)
        else:
            result = dataclasses.replace(result, seconds=time.perf_counter() - start)
        self.record(result)

    def compare_step(self, name, pairs: Iterable[tuple], notes=(), data=None) -> StepResult:
        spec = self.options.tolerances.get(name)
        comparisons = []
        notes = list(notes)
        for label, expected, actual in pairs:
            if label == "outputs":
                expected, actual, stripped = _align_output_keys(expected, actual, self.options.renamer,
                                                                 self.layer_names)
                if stripped:
                    notes.append(f"end-point keys: the TF2 layer's own name scope {stripped!r} removed "
                                 "(the only difference from the TF1 keys)")
                for sub_label, sub_expected, sub_actual in _split_outputs(expected, actual):
                    comparisons.append(compare(sub_expected, sub_actual, spec, name=sub_label))
            else:
                comparisons.append(compare(expected, actual, spec, name=label))
        return StepResult.from_comparisons(name, _steps.title(name), comparisons, notes=notes, data=data)

    def localized(self, result: StepResult, tf1, tf1_outputs, call_tf2: Callable[[], Any],
                  state=None) -> StepResult:
        """With ``localize=True``: ``result`` with the first divergent op attached as
        ``data["localization"]`` (see :mod:`equivtool.localize`); its numbers and
        status are left as they are. ``state`` (a context-manager factory) puts
        back what the localization pass changed."""
        if not self.options.localize:
            return result
        from equivtool.localize import localize_on_step
        return localize_on_step(result, tf1, tf1_outputs, call_tf2, self.options.tolerances.get(result.name),
                                state=state, strategy=self.options.strategy)

    # -- the loop ----------------------------------------------------------

    def run(self) -> list[StepResult]:
        snapshot = None
        if self.user_layer is not None and getattr(self.user_layer, "built", False):
            snapshot = snapshot_layer(self.user_layer)
        try:
            if self.options.workers > 1 and self.options.in_process is None:
                from equivtool._workers import run_parallel
                self.jobs = run_parallel(self, self.options.workers)
            else:
                for step in _steps.run_order(self.options.steps, self.options.modes):
                    if not step.shared:
                        self.release_pair()  # steps that build their own models: free its memory first
                    self.run_step(step)
        finally:
            self.close()
            if snapshot is not None:
                restore_snapshot(snapshot)
        return [self.results[name] for name in _steps.report_order(self.results)]


def skipped_result(step: Step, reason: str, seconds: float) -> StepResult:
    return StepResult(step.name, step.title, "skipped", seconds, message=reason)


def error_result(engine: _Engine, step: Step, message: str, traceback: str, seconds: float) -> StepResult:
    return StepResult(step.name, step.title, "error", seconds, message=message,
                      notes=notes_on_error(engine, step), data={"traceback": traceback})


def _split_outputs(expected, actual) -> list[tuple]:
    """Dicts of end points first (they are in forward order), then the other outputs.

    A slim model returns ``(logits, end_points)``; comparing ``end_points``
    first makes the first failing leaf the layer where divergence begins.
    """
    if isinstance(expected, Mapping):
        return [("end_points", expected, actual)]
    if (isinstance(expected, (tuple, list)) and isinstance(actual, (tuple, list))
            and len(expected) == len(actual)
            and any(isinstance(item, Mapping) for item in expected)):
        mappings = [i for i, item in enumerate(expected) if isinstance(item, Mapping)]
        others = [i for i in range(len(expected)) if i not in mappings]
        single = len(mappings) == 1
        parts = [("end_points" if single else f"end_points_{i}", expected[i], actual[i]) for i in mappings]
        parts += [(f"outputs/{i}", expected[i], actual[i]) for i in others]
        return parts
    return [("outputs", expected, actual)]


def _rename_keys(outputs, renamer):
    """``rename`` applied to every str key of the dicts in ``outputs`` (end points)."""
    if isinstance(outputs, Mapping):
        return {(renamer(k) if isinstance(k, str) else k): _rename_keys(v, renamer) for k, v in outputs.items()}
    if isinstance(outputs, (list, tuple)) and not hasattr(outputs, "_fields"):
        return type(outputs)(_rename_keys(v, renamer) for v in outputs)
    return outputs


def _align_output_keys(expected, actual, renamer, layer_names) -> tuple:
    """``(expected, actual, stripped prefix or None)`` with ``rename`` applied to
    output keys, and the TF2 layer's own name scope (``<layer name>/``) removed
    from the TF2 end-point keys when that is all that tells them apart."""
    expected, actual = _rename_keys(expected, renamer), _rename_keys(actual, renamer)
    stripped = []

    def walk(exp, act):
        if isinstance(exp, Mapping) and isinstance(act, Mapping):
            if set(exp) != set(act):
                for layer_name in sorted(n for n in layer_names if isinstance(n, str)):
                    prefix = layer_name + "/"
                    renamed = {(k[len(prefix):] if isinstance(k, str) and k.startswith(prefix) else k): v
                               for k, v in act.items()}
                    if len(renamed) == len(act) and set(renamed) == set(exp):
                        stripped.append(prefix)
                        act = renamed
                        break
            return exp, {k: walk(exp[k], v)[1] if k in exp else v for k, v in act.items()}
        if (isinstance(exp, (list, tuple)) and isinstance(act, (list, tuple)) and len(exp) == len(act)
                and not hasattr(act, "_fields")):
            return exp, type(act)(walk(e, a)[1] for e, a in zip(exp, act))
        return exp, act

    expected, actual = walk(expected, actual)
    return expected, actual, (stripped[0] if stripped else None)


def check_equivalence(
    tf1_fn: Callable,
    tf2_layer,
    inputs,
    *,
    steps: Sequence[str] | None = None,
    modes: Sequence[str] = MODES,
    tolerance: Tolerance | Mapping | None = None,
    step_tolerances: Mapping[str, Any] | None = None,
    loss_fn: Callable | None = None,
    optimizers: tuple | None = None,
    train_steps: int = 3,
    checkpoint: str | os.PathLike | bool | None = None,
    rename=None,
    tf_function: bool = False,
    graph_rewrites: str = "as_written",
    seed: int = 42,
    progress: Callable[[StepResult], None] | None = None,
    meta: Mapping[str, Any] | None = None,
    strategy: tf.distribute.Strategy | None = None,
    localize: bool = False,
    workers: int = 1,
    disable_arithmetic_optimization: bool | None = None,
) -> EquivalenceReport:
    """Run TensorFlow's equivalence workflow on a TF1 function and its TF2 layer.

    Args:
      tf1_fn: ``tf1_fn(inputs, training) -> outputs`` building the TF1 forward
        pass in the current graph (tf-slim, ``tf.compat.v1.layers``,
        ``get_variable``); outputs may be a tensor or a nested structure
        (a dict of end points in forward order localises divergence).
      tf2_layer: a zero-argument factory returning a fresh Keras layer (typically
        with a ``track_tf1_style_variables`` method), or a layer instance (then
        the ``num_random_ops`` steps, which need fresh layers, are skipped; its
        variable values are restored at the end). Called as
        ``layer(inputs, training=...)``; must return the same structure.
      inputs: a NumPy array (or nested structure of arrays) fed to both sides.
        A leaf with no elements is refused (nothing could be compared); NaN or
        infinite values are allowed and counted in the report's header
        (``non_finite_inputs``).
      steps: which of :data:`STEPS` to run (default :data:`DEFAULT_STEPS`, plus
        ``optimizer`` when ``optimizers`` is given and ``checkpoint`` when
        ``checkpoint`` is given).
      modes: random-tool modes for the ``random`` step.
      tolerance: default :class:`Tolerance` (the guide's ``rtol=1e-6,
        atol=1e-5``) or a ``{output name or pattern: Tolerance}`` mapping.
      step_tolerances: per-step overrides, e.g. ``{"gradients": Tolerance(atol=1e-4),
        "optimizer": lambda step: Tolerance(atol=1e-5 * 2 ** step)}``.
      loss_fn: ``loss_fn(outputs, regularization_loss) -> scalar`` built with
        TensorFlow ops (used on both sides); default: mean of squares of the first
        output plus the regularization loss.
      optimizers: ``(make_tf1_optimizer, make_tf2_optimizer)`` factories, e.g.
        ``(lambda: tf.compat.v1.train.AdamOptimizer(1e-3), lambda: tf.keras.optimizers.Adam(1e-3))``.
      train_steps: number of optimizer steps.
      checkpoint: a TF1 checkpoint path to load into both sides, or ``True`` to
        have the TF1 side write one.
      rename: rules mapping TF2 and TF1 variable names to one key (see
        :func:`equivtool.compare_variables`).
      tf_function: call the TF2 layer inside ``tf.function`` instead of eagerly.
      graph_rewrites: ``"as_written"`` (default): every graph a side runs (the
        TF1 session, and the TF2 layer's ``tf.function`` graphs) runs with the
        Grappler passes that can change a float result switched off (the
        remapper's fused kernels, the arithmetic optimizer, constant folding,
        layout and mixed-precision rewrites), so each side computes the ops the
        user wrote and the verdict does not depend on the CPU.
        ``"tensorflow_default"``: TensorFlow's defaults on both sides, to prove the
        deployed, fused graphs against each other; the report then says the
        verdict may depend on the CPU. See :mod:`equivtool._execution`.
      seed: the random tool's seed.
      progress: called with each :class:`StepResult` as soon as it is known.
      meta: extra information stored in the report (model name, ...).
      strategy: run the TF2 side under this ``tf.distribute`` strategy: the batch
        (a multiple of the replica count) is split across replicas, outputs are
        gathered, gradients all-reduced, and everything is compared with the
        single-device TF1 results. Per-replica batch statistics and dropout masks
        make training-mode outputs differ by design, so under a strategy the
        training-output steps are skipped with that reason and gradients and
        optimizer steps use ``training=False`` on both sides.
      localize: for the steps that compare forward outputs (``fixed_weights``,
        ``random/*``, ``checkpoint``), run the pass once more with every op's
        output captured on both sides and attach the first op whose output
        exceeds tolerance as ``step.data["localization"]`` (an
        :class:`equivtool.localize.Localization`); verdicts and numbers are those
        of the steps themselves. See :mod:`equivtool.localize`.
      workers: processes to run the check in, this one included. ``1`` runs
        everything here. With ``N > 1`` the TF1 side and the TF2 side of every
        step run in separate processes (this one and up to ``N - 1`` worker
        processes), and so do independent step groups (the constant-mode pair,
        each ``num_random_ops`` comparison); only the workers' NumPy captures
        come back to be compared. Same numbers, verdicts
        and error messages as ``1``. Arguments travel with cloudpickle
        (lambdas too); one that cannot is refused before any work. With
        ``localize=True``, a ``strategy`` or a layer instance the check runs
        in one process, and the report's header says why.
      disable_arithmetic_optimization: deprecated; ``True`` is
        ``graph_rewrites="as_written"``, ``False`` is ``"tensorflow_default"``.
    """
    options = _Options.build(
        tf1_fn, tf2_layer, inputs, steps=steps, modes=modes, tolerance=tolerance,
        step_tolerances=step_tolerances, loss_fn=loss_fn, optimizers=optimizers, train_steps=train_steps,
        checkpoint=checkpoint, rename=rename, tf_function=tf_function,
        graph_rewrites=graph_rewrites, seed=seed, progress=progress, meta=meta, strategy=strategy,
        localize=localize, workers=workers, disable_arithmetic_optimization=disable_arithmetic_optimization)
    engine = _Engine(options)
    results = engine.run()
    header = _header(options)
    if engine.jobs:
        header["worker_jobs"] = engine.jobs
    return EquivalenceReport(tuple(results), header)


def _header(options: _Options) -> dict:
    """The report's header: how the check ran, then notes on the inputs and the user's ``meta``."""
    strategy = options.strategy
    return {
        "tensorflow": tf.__version__,
        "steps": list(options.steps),
        "modes": list(options.modes),
        "tf_function": options.tf_function,
        "graph_rewrites": options.graph_rewrites,
        # what the verdict depends on: CPU, oneDNN, rewrites off on each side, threads
        "platform": _execution.platform(options.graph_rewrites, options.tf_function),
        "seed": options.seed,
        "input_shapes": [list(np.shape(leaf)) for leaf in flatten_tensors(options.inputs)],
        "strategy": None if strategy is None else
        f"{type(strategy).__name__} ({strategy.num_replicas_in_sync} replicas)",
        **({"localize": True} if options.localize else {}),
        **({"weights": options.aligned} if options.aligned else {}),
        **({"workers": options.workers if options.in_process is None else
            f"1 (asked for {options.workers}: {options.in_process})"} if options.workers > 1 else {}),
        **options.meta,
    }
