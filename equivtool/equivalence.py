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

How work is shared between steps, and why it changes no number:

* In ``constant`` mode every random op gets the same seeds whatever the order,
  so one TF1 graph holds the inference pass and, reusing its variables, the
  training pass with its gradients; one TF2 layer serves both calls. Its
  second call is the ``variables_once`` check; its variables serve ``parity``.
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

import contextlib
import dataclasses
import gc
import os
import tempfile
import time
import traceback
from typing import Any, Callable, Iterable, Mapping, Sequence

import equivtool  # noqa: F401  (environment fix before TensorFlow)
import numpy as np
import tensorflow as tf

from equivtool.comparison import Tolerance, compare
from equivtool.report import EquivalenceReport, StepResult
from equivtool.runners import (TF1Side, TF2Side, dense_gradient, depends_on, fixed_value, flatten_tensors,
                               restore_snapshot, snapshot_layer, variable_key)
from equivtool.seeding import DeterministicRandomTestTool
from equivtool.variables import (VariableCreationError, VariableInfo, VariableSet,
                                 _make_renamer, assert_no_variable_creations,
                                 compare_variables)

__all__ = ["check_equivalence", "STEPS", "MODES", "DEFAULT_STEPS"]

STEPS = ("variables_once", "parity", "fixed_weights", "random", "gradients", "optimizer",
         "checkpoint")
DEFAULT_STEPS = ("variables_once", "parity", "fixed_weights", "random", "gradients")
MODES = ("constant", "num_random_ops")

_TITLES = {
    "variables_once": "Variables are created once",
    "parity": "Variable parity (names, shapes, dtypes, trainability)",
    "fixed_weights": "Fixed weights: inference outputs and regularization losses",
    "random/constant/inference": "Random tool, constant mode: inference",
    "random/constant/training": "Random tool, constant mode: training",
    "random/num_random_ops/inference": "Random tool, num_random_ops mode: inference",
    "random/num_random_ops/training": "Random tool, num_random_ops mode: training",
    "gradients": "Gradients of the loss w.r.t. every trainable variable",
    "optimizer": "Optimizer steps: losses and updated variables",
    "checkpoint": "TF1 name-based checkpoint loaded into both sides",
}


# --------------------------------------------------------------------------
# Argument checking
# --------------------------------------------------------------------------

def _select(values, allowed: Sequence[str], argument: str) -> tuple:
    if values is None:
        return None
    if isinstance(values, str):
        values = (values,)
    try:
        values = tuple(values)
    except TypeError:
        raise TypeError(f"{argument}: expected a sequence of names from {list(allowed)}, got {values!r}") from None
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise ValueError(f"{argument}: unknown name(s) {unknown}; choose from {list(allowed)}")
    return values


def _check_inputs(inputs) -> None:
    leaves = flatten_tensors(inputs)
    if not leaves:
        raise ValueError("inputs: expected an array (or a nested structure of arrays), got an empty structure")
    for leaf in leaves:
        array = np.asarray(leaf)
        if array.dtype == object:
            raise TypeError(f"inputs: expected numeric arrays, got a leaf of type {type(leaf).__name__}")


class _StepTolerances:
    """``tolerance`` for every step, overridden per step by ``step_tolerances``."""

    def __init__(self, default, per_step: Mapping | None):
        self.default = Tolerance() if default is None else default
        if not isinstance(self.default, (Tolerance, Mapping)):
            raise TypeError(f"tolerance: expected an equivtool.Tolerance or a {{output name: Tolerance}} mapping, "
                            f"got {type(default).__name__}")
        self.per_step = dict(per_step or {})
        for key in self.per_step:
            if not any(key == s or key.startswith(s + "/") for s in STEPS):
                raise ValueError(f"step_tolerances: unknown step {key!r}; use one of {list(STEPS)} or a "
                                 "sub-step such as 'random/constant/training'")

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


# --------------------------------------------------------------------------
# The shared pair (constant random mode)
# --------------------------------------------------------------------------

class _ConstantPair:
    """One TF1 graph and one TF2 layer under ``constant`` mode, built lazily.

    Without a strategy the TF2 layer's first call is the inference pass and its
    second (guarded) call the training pass, which also yields the gradients.
    With a strategy the first call creates the variables in cross-replica
    context (on the thread the random tool covers), and the distributed
    inference pass is the guarded second call and yields the gradients.
    """

    def __init__(self, engine: "_Engine"):
        self.engine = engine
        e = engine
        self.distributed = e.strategy is not None
        self.tf1_tool = DeterministicRandomTestTool(seed=e.seed, mode="constant")
        self.tf2_tool = DeterministicRandomTestTool(seed=e.seed, mode="constant")
        started = time.perf_counter()
        self.tf1 = TF1Side(e.tf1_fn, e.inputs, renamer=e.renamer, loss_fn=e.loss_fn,
                           disable_arithmetic_optimization=e.disable_arithmetic_optimization,
                           random_tool=self.tf1_tool)
        self.inference = self.tf1.forward(training=False,
                                          with_gradients=e.want_gradients and self.distributed)
        self.training = None if self.distributed else self.tf1.forward(
            training=True, with_gradients=e.want_gradients)
        # A layer instance built before the check got its initial values
        # elsewhere: it receives the TF1 graph's instead (noted in the steps).
        self.prebuilt = e.user_layer is not None and bool(getattr(e.user_layer, "built", False))
        with _strategy_scope(e.strategy), self.tf2_tool.scope():
            self.layer = e.new_layer()
            if self.distributed:
                self.layer(tf.nest.map_structure(tf.convert_to_tensor, e.inputs), training=False)
        self.tf2 = TF2Side(self.layer, renamer=e.renamer, loss_fn=e.loss_fn,
                           use_tf_function=e.tf_function, strategy=e.strategy)
        if self.prebuilt:
            self.tf2.assign_variables(self.tf1.read_variables())
        self.build_seconds = time.perf_counter() - started
        self._tf1_results: dict = {}
        self._tf2_results: dict = {}

    def _tf2_call(self, key: str, training: bool, with_gradients: bool, guarded: bool):
        if key not in self._tf2_results:
            with self.tf2_tool.scope():
                guard = assert_no_variable_creations() if guarded else contextlib.nullcontext()
                with guard:
                    self._tf2_results[key] = self.tf2.forward(self.engine.inputs, training=training,
                                                              with_gradients=with_gradients)
        return self._tf2_results[key]

    def tf2_inference(self):
        if self.distributed:
            return self._tf2_call("inference", False, self.engine.want_gradients, guarded=True)
        return self._tf2_call("inference", False, False, guarded=False)

    def tf2_training(self):
        """Without a strategy: the layer's second call; it must create no variable (step 1)."""
        if self.distributed:
            raise _SkipStep(_DISTRIBUTED_TRAINING)
        self.tf2_inference()
        return self._tf2_call("training", True, self.engine.want_gradients, guarded=True)

    def tf2_second_call(self):
        return self.tf2_inference() if self.distributed else self.tf2_training()

    def _tf1_fetch(self, key: str, forward):
        if key not in self._tf1_results:
            fetches = (forward.outputs, forward.regularization, forward.loss, forward.gradients)
            wanted = tuple(x for x in fetches if x is not None)
            # Eager training calls update batch-norm statistics as they run; the
            # TF1 pass runs its UPDATE_OPS alongside so both sides stay equal.
            values = iter(self.tf1.run(wanted, update_ops=forward.update_ops))
            self._tf1_results[key] = tuple(None if x is None else next(values) for x in fetches)
        return self._tf1_results[key]

    def tf1_inference(self):
        return self._tf1_fetch("inference", self.inference)

    def tf1_training(self):
        if self.distributed:
            raise _SkipStep(_DISTRIBUTED_TRAINING)
        self.tf1_inference()
        return self._tf1_fetch("training", self.training)

    def gradients(self) -> tuple:
        """``(tf1 loss, tf1 gradients, tf2 loss, tf2 gradients)``."""
        tf1 = self.tf1_inference() if self.distributed else self.tf1_training()
        tf2 = self.tf2_second_call()
        return tf1[2], tf1[3], tf2[2], tf2[3]

    def snapshot(self) -> tuple:
        return self.tf1.read_variables(), self.tf2.read_variables()

    def restore(self, snapshot: tuple) -> None:
        tf1_values, tf2_values = snapshot
        self.tf1.assign_variables(tf1_values)
        self.tf2.assign_variables(tf2_values)

    @contextlib.contextmanager
    def preserved(self):
        """Both sides' variables as they are now, put back on every exit path.

        Yields the snapshot, so a step can return to it midway."""
        self.tf1_inference()  # initialised, and both layers built
        self.tf2_inference()
        saved = self.snapshot()
        try:
            yield saved
        finally:
            self.restore(saved)

    def inference_now(self) -> tuple:
        """A fresh inference pass on both sides with the current variable values:
        ``(tf1 outputs, tf1 regularization, tf2 outputs, tf2 regularization)``."""
        tf1_out, tf1_reg = self.tf1.run((self.inference.outputs, self.inference.regularization))
        with self.tf2_tool.scope():
            tf2_out, tf2_reg, _, _ = self.tf2.forward(self.engine.inputs, training=False)
        return tf1_out, tf1_reg, tf2_out, tf2_reg

    def close(self) -> None:
        self.tf1.close()


# --------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------

class _Engine:
    def __init__(self, tf1_fn, tf2_layer, inputs, *, steps, modes, tolerance, step_tolerances,
                 loss_fn, optimizers, train_steps, checkpoint, rename, tf_function,
                 disable_arithmetic_optimization, seed, progress, strategy=None):
        self.tf1_fn = tf1_fn
        self.strategy = strategy
        self.inputs = inputs
        self.steps = steps
        self.modes = modes
        self.tolerances = _StepTolerances(tolerance, step_tolerances)
        self.loss_fn = loss_fn
        self.optimizers = optimizers
        self.train_steps = train_steps
        self.checkpoint = checkpoint
        self.renamer = _make_renamer(rename)
        self.tf_function = tf_function
        self.disable_arithmetic_optimization = disable_arithmetic_optimization
        self.seed = seed
        self.progress = progress
        self.want_gradients = "gradients" in steps
        if isinstance(tf2_layer, tf.Module):
            self.user_layer = tf2_layer
            self.factory = None
        else:
            self.user_layer = None
            self.factory = tf2_layer
        self._user_layer_used = False
        self.layer_names: set = set()  # the TF2 layers' names: their name scopes may prefix end-point keys
        self._pair: _ConstantPair | None = None
        self._pair_error: str | None = None
        self.results: dict[str, StepResult] = {}

    # -- layers ------------------------------------------------------------

    def new_layer(self):
        if self.factory is not None:
            layer = self.factory()
            if not callable(layer):
                raise TypeError(f"tf2_layer: the factory returned {type(layer).__name__}, expected a Keras layer")
            self.layer_names.add(getattr(layer, "name", None))
            return layer
        if self._user_layer_used:
            raise _SkipStep("tf2_layer is a layer instance, which can be created only once; pass a "
                            "zero-argument factory (e.g. lambda: MyLayer()) to run this step on a fresh layer")
        self._user_layer_used = True
        self.layer_names.add(getattr(self.user_layer, "name", None))
        return self.user_layer

    @property
    def pair(self) -> _ConstantPair:
        """The constant-mode pair; a failure to build it is reported once, by the first step."""
        if self._pair_error is not None:
            raise _SkipStep(f"not run: building the models failed in an earlier step ({self._pair_error})")
        if self._pair is None:
            try:
                self._pair = _ConstantPair(self)
            except Exception as exc:
                self._pair_error = f"{type(exc).__name__}: {exc}"[:300]
                raise
        return self._pair

    def _release_pair(self) -> None:
        """Close the shared session and drop the shared graph and layer (layers and
        graphs hold reference cycles, hence the collection)."""
        if self._pair is not None:
            self._pair.close()
            self._pair = None
            gc.collect()

    # -- bookkeeping -------------------------------------------------------

    def record(self, result: StepResult) -> None:
        self.results[result.name] = result
        if self.progress is not None:
            self.progress(result)

    def run_step(self, name: str, fn: Callable[[], StepResult]) -> None:
        start = time.perf_counter()
        try:
            result = fn()
        except _SkipStep as skip:
            result = StepResult(name, _TITLES[name], "skipped", time.perf_counter() - start, message=str(skip))
        except Exception as exc:  # a step that crashes is reported, the others still run
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            result = StepResult(name, _TITLES[name], "error", time.perf_counter() - start,
                                message=detail, data={"traceback": traceback.format_exc(limit=8)})
        else:
            result = _with_seconds(result, time.perf_counter() - start)
        self.record(result)

    def compare_step(self, name, pairs: Iterable[tuple], notes=(), data=None) -> StepResult:
        spec = self.tolerances.get(name)
        comparisons = []
        notes = list(notes)
        for label, expected, actual in pairs:
            if label == "outputs":
                expected, actual, stripped = _align_output_keys(expected, actual, self.renamer,
                                                                 self.layer_names)
                if stripped:
                    notes.append(f"end-point keys: the TF2 layer's own name scope {stripped!r} removed "
                                 "(the only difference from the TF1 keys)")
                for sub_label, sub_expected, sub_actual in _split_outputs(expected, actual):
                    comparisons.append(compare(sub_expected, sub_actual, spec, name=sub_label))
            else:
                comparisons.append(compare(expected, actual, spec, name=label))
        return StepResult.from_comparisons(name, _TITLES[name], comparisons, notes=notes, data=data)

    # -- steps -------------------------------------------------------------

    def step_variables_once(self) -> StepResult:
        pair = self.pair
        notes = [f"includes building the shared TF1 graph and TF2 layer ({pair.build_seconds:.1f}s)"]
        try:
            pair.tf2_second_call()
        except VariableCreationError as exc:
            return StepResult("variables_once", _TITLES["variables_once"], "failed", 0.0,
                              message=str(exc), notes=notes)
        which = "distributed inference" if pair.distributed else "training=True"
        return StepResult("variables_once", _TITLES["variables_once"], "passed", 0.0,
                          message=f"the second call ({which}) created no variable", notes=notes,
                          data={"variables": len(pair.layer.variables)})

    def step_parity(self) -> StepResult:
        pair = self.pair
        pair.tf2_inference()
        expected = VariableSet.from_variables(pair.tf1.variables, "tf1")
        trainable = pair.tf1.trainable_keys
        expected = VariableSet(tuple(
            VariableInfo(v.name, v.shape, v.dtype, variable_key(v.name, self.renamer) in trainable)
            for v in expected), "tf1")
        actual = VariableSet.from_variables(pair.layer.variables, "tf2")
        parity = compare_variables(expected, actual, rename=self.renamer)
        status = "passed" if parity.ok else "failed"
        return StepResult("parity", _TITLES["parity"], status, 0.0,
                          message="" if parity.ok else str(parity),
                          data={"tf1_variables": len(expected), "tf2_variables": len(actual),
                                "trainable": len(expected.trainable),
                                "trainable_parameters": expected.num_trainable_parameters})

    def step_random_constant(self, training: bool) -> StepResult:
        name = f"random/constant/{'training' if training else 'inference'}"
        pair = self.pair
        if training:
            tf1_out, tf1_reg, _, _ = pair.tf1_training()
            tf2_out, tf2_reg, _, _ = pair.tf2_training()
        else:
            tf1_out, tf1_reg, _, _ = pair.tf1_inference()
            tf2_out, tf2_reg, _, _ = pair.tf2_inference()
        result = self.compare_step(name, _forward_pairs(tf1_out, tf1_reg, tf2_out, tf2_reg),
                                   notes=[_PREBUILT_NOTE] if pair.prebuilt else [])
        forward = pair.training if training else pair.inference
        return _judge_loop_random(result, forward.loop_random_ops, _forward_leaf_tensors(result, forward))

    def step_gradients(self) -> StepResult:
        pair = self.pair
        tf1_loss, tf1_grads, tf2_loss, tf2_grads = pair.gradients()
        tf1_dense = {key: dense_gradient(value) for key, value in tf1_grads.items()}
        tf1_grads = {key: dense for key, (dense, _) in tf1_dense.items()}
        missing = sorted(set(tf1_grads) ^ set(tf2_grads))
        notes = [f"loss: TF1 {float(tf1_loss):.9g}, TF2 {float(tf2_loss):.9g}"]
        notes += _sparse_note([k for k, (_, sparse) in tf1_dense.items() if sparse], pair.tf2.sparse_gradients)
        if missing:
            notes.append("gradients present on one side only: " + ", ".join(missing[:10]))
        tf1_ordered = {k: tf1_grads[k] for k in pair.tf1.keys if k in tf1_grads}
        if pair.distributed:
            notes.append(_DISTRIBUTED_NOTE)
        result = self.compare_step("gradients",
                                   [("loss", np.float32(tf1_loss), np.float32(tf2_loss)),
                                    ("gradients", tf1_ordered, tf2_grads)],
                                   notes=notes, data={"variables": len(tf1_grads)})
        forward = pair.inference if pair.distributed else pair.training
        tensors = {"loss": forward.loss}
        tensors.update({f"gradients/{key}": g for key, g in (forward.gradients or {}).items()})
        return _judge_loop_random(result, forward.loop_random_ops, tensors)

    def step_fixed_weights(self) -> StepResult:
        pair = self.pair
        with pair.preserved():
            values = {key: fixed_value(key, v.shape, v.dtype.base_dtype)
                      for key, v in zip(pair.tf1.keys, pair.tf1.variables)}
            pair.tf1.assign_variables(values)
            pair.tf2.assign_variables(values)
            unassigned = [k for k in pair.tf2.keys() if k not in values]
            outputs = pair.inference_now()
        notes = [f"TF2 variables without a TF1 counterpart kept their values: {unassigned[:5]}"] if unassigned else []
        return self.compare_step("fixed_weights", _forward_pairs(*outputs), notes=notes)

    def step_optimizer(self) -> StepResult:
        if self.optimizers is None:
            raise _SkipStep("no optimizers given: pass optimizers=(make_tf1_optimizer, make_tf2_optimizer)")
        make_tf1, make_tf2 = self.optimizers
        pair = self.pair
        training = not pair.distributed
        pair.gradients()  # both sides have had the same calls (batch-norm statistics included)
        with pair.preserved():
            # A forward pass of its own: its random ops are not shared with the
            # training-output comparison.
            forward = pair.tf1.forward(training=training, with_gradients=False)
            with pair.tf1.graph.as_default():
                loss = pair.tf1.loss_fn(forward.outputs, forward.regularization)
                optimizer = make_tf1()
                with tf.control_dependencies(forward.update_ops):
                    train_op = optimizer.minimize(loss, var_list=pair.tf1.trainable_variables())
                known = set(pair.tf1.variables)
                new_vars = [v for v in tf.compat.v1.global_variables() if v not in known]
                pair.tf1.session.run(tf.compat.v1.variables_initializer(new_vars))
            with _strategy_scope(self.strategy):
                tf2_optimizer = make_tf2()
                # Slot variables made inside a traced step would make it trace twice.
                _build_optimizer(tf2_optimizer, pair.layer.trainable_variables)

            comparisons, failed_at, losses = [], None, []
            tf2_keys = set(pair.tf2.keys())
            for step in range(self.train_steps):
                # Every step sees each random op's first draw on both sides: a
                # new TF1 session, and a new op per eager call (or per trace).
                pair.tf1.renew_session()
                tf1_loss, _ = pair.tf1.run((loss, train_op))
                with pair.tf2_tool.scope():
                    tf2_loss = pair.tf2.train_step(self.inputs, tf2_optimizer, training=training)
                losses.append([float(tf1_loss), float(tf2_loss)])
                tf1_vars = {k: v for k, v in pair.tf1.read_variables().items() if k in tf2_keys}
                spec = self.tolerances.get("optimizer", step)
                comparison = compare({"loss": np.float32(tf1_loss), "variables": tf1_vars},
                                     {"loss": np.float32(tf2_loss), "variables": pair.tf2.read_variables()},
                                     spec, name=f"step_{step + 1}")
                comparisons.append(comparison)
                if not comparison.ok and failed_at is None:
                    failed_at = step + 1
        notes = [f"{self.train_steps} steps of {type(optimizer).__name__} (TF1) vs "
                 f"{type(tf2_optimizer).__name__} (TF2)"]
        tf1_gradients = (pair.training or pair.inference).gradients or {}
        notes += _sparse_note([k for k, g in tf1_gradients.items() if isinstance(g, tf.IndexedSlices)],
                              pair.tf2.sparse_gradients, applied=True)
        if pair.distributed:
            notes.append(_DISTRIBUTED_NOTE)
        if failed_at is not None:
            notes.append(f"first step that exceeds tolerance: {failed_at}")
        result = StepResult.from_comparisons("optimizer", _TITLES["optimizer"], comparisons, notes=notes,
                                             data={"steps": self.train_steps, "first_failing_step": failed_at,
                                                   "losses": losses})
        # A variable's update is explained by the loops when its gradient (in
        # the shared pair's training pass, with that pass's loops) is.
        gradient_pass = pair.training or pair.inference
        gradient_of = gradient_pass.gradients or {}
        tensors = {}
        for step in range(self.train_steps):
            tensors[f"step_{step + 1}/loss"] = loss
            tensors.update({f"step_{step + 1}/variables/{key}": gradient_of.get(key) for key in tf2_keys})
        return _judge_loop_random(result, {**forward.loop_random_ops, **gradient_pass.loop_random_ops}, tensors)

    def step_checkpoint(self) -> StepResult:
        pair = self.pair
        with pair.preserved() as saved, tempfile.TemporaryDirectory(prefix="equivtool-ckpt-") as workdir:
            with pair.tf1.graph.as_default():
                saver = tf.compat.v1.train.Saver(var_list=pair.tf1.variables)
            path = self.checkpoint if isinstance(self.checkpoint, (str, os.PathLike)) else None
            notes = []
            if path is None:
                # The checkpoint holds fixed values, so that loading it visibly
                # changes both sides' (random) variables.
                values = {key: fixed_value("ckpt/" + key, v.shape, v.dtype.base_dtype)
                          for key, v in zip(pair.tf1.keys, pair.tf1.variables)}
                pair.tf1.assign_variables(values)
                with pair.tf1.graph.as_default():
                    path = saver.save(pair.tf1.session, os.path.join(workdir, "model.ckpt"))
                pair.restore(saved)
                notes.append("checkpoint written by the TF1 side with tf.compat.v1.train.Saver")
            with pair.tf1.graph.as_default():
                saver.restore(pair.tf1.session, os.fspath(path))
            reader = tf.train.load_checkpoint(os.fspath(path))
            names = {variable_key(v.name, self.renamer): v.op.name
                     for v in pair.tf1.variables}
            loaded, absent = 0, []
            for variable in pair.layer.variables:
                key = variable_key(variable.name, self.renamer)
                name = names.get(key, key)
                if reader.has_tensor(name):
                    variable.assign(reader.get_tensor(name))
                    loaded += 1
                else:
                    absent.append(name)
            if absent:
                notes.append(f"{len(absent)} TF2 variables not in the checkpoint: {absent[:5]}")
            tf1_out, _, tf2_out, _ = pair.inference_now()
        return self.compare_step("checkpoint", [("outputs", tf1_out, tf2_out)], notes=notes,
                                 data={"loaded_variables": loaded, "missing": len(absent)})

    def step_random_fresh(self, mode: str, training: bool) -> StepResult:
        name = f"random/{mode}/{'training' if training else 'inference'}"
        if self.strategy is not None:
            raise _SkipStep("not run under a distribution strategy: replica functions run on other "
                            "threads, outside the random tool's scope, so num_random_ops counts differ; "
                            "the constant-mode steps cover the distributed layer")
        tf1_tool = DeterministicRandomTestTool(seed=self.seed, mode=mode)
        tf1 = TF1Side(self.tf1_fn, self.inputs, renamer=self.renamer, loss_fn=self.loss_fn,
                      disable_arithmetic_optimization=self.disable_arithmetic_optimization,
                      random_tool=tf1_tool)
        try:
            forward = tf1.forward(training=training)
            tf1_out, tf1_reg = tf1.run((forward.outputs, forward.regularization), update_ops=forward.update_ops)
        finally:
            tf1.close()
        tf2_tool = DeterministicRandomTestTool(seed=self.seed, mode=mode)
        notes = []
        if self.tf_function:
            notes.append("called eagerly: tf.function traces a variable-creating call twice, and "
                         "num_random_ops counts the random ops of both traces")
        with tf2_tool.scope():
            layer = self.new_layer()
            tf2 = TF2Side(layer, renamer=self.renamer, loss_fn=self.loss_fn, use_tf_function=False)
            tf2_out, tf2_reg, _, _ = tf2.forward(self.inputs, training=training)
        result = self.compare_step(name, _forward_pairs(tf1_out, tf1_reg, tf2_out, tf2_reg), notes=notes)
        return _judge_loop_random(result, forward.loop_random_ops, _forward_leaf_tensors(result, forward))

    # -- the loop ----------------------------------------------------------

    def run(self) -> list[StepResult]:
        snapshot = None
        if self.user_layer is not None and getattr(self.user_layer, "built", False):
            snapshot = snapshot_layer(self.user_layer)
        try:
            self._run_selected()
        finally:
            self._release_pair()
            if snapshot is not None:
                restore_snapshot(snapshot)
        return self._ordered()

    def _run_selected(self) -> None:
        steps, modes = self.steps, self.modes
        if "variables_once" in steps:
            self.run_step("variables_once", self.step_variables_once)
        if "parity" in steps:
            self.run_step("parity", self.step_parity)
        if "random" in steps and "constant" in modes:
            self.run_step("random/constant/inference", lambda: self.step_random_constant(False))
            self.run_step("random/constant/training", lambda: self.step_random_constant(True))
        if "gradients" in steps:
            self.run_step("gradients", self.step_gradients)
        if "fixed_weights" in steps:
            self.run_step("fixed_weights", self.step_fixed_weights)
        if "optimizer" in steps:
            self.run_step("optimizer", self.step_optimizer)
        if "checkpoint" in steps:
            self.run_step("checkpoint", self.step_checkpoint)
        self._release_pair()  # the fresh-graph steps below do not need it: free its memory first
        if "random" in steps and "num_random_ops" in modes:
            for training in (False, True):
                name = f"random/num_random_ops/{'training' if training else 'inference'}"
                self.run_step(name, lambda t=training: self.step_random_fresh("num_random_ops", t))

    def _ordered(self) -> list[StepResult]:
        order = ["variables_once", "parity", "fixed_weights", "random/constant/inference",
                 "random/constant/training", "random/num_random_ops/inference",
                 "random/num_random_ops/training", "gradients", "optimizer", "checkpoint"]
        return [self.results[name] for name in order if name in self.results]


class _SkipStep(Exception):
    """Raised inside a step that cannot run with the given arguments."""


_DISTRIBUTED_TRAINING = (
    "not comparable under a distribution strategy: each replica normalises with its own batch "
    "statistics and draws its own dropout masks, so training-mode outputs differ from a single "
    "device by design (gradients and optimizer steps are compared with training=False)")
_PREBUILT_NOTE = ("tf2_layer was built before the check, so its variables were given the TF1 graph's "
                  "initial values: initializers are not compared (pass a factory to compare them)")
_DISTRIBUTED_NOTE = ("under a distribution strategy: computed with training=False on both sides; "
                     "gradients are all-reduced across replicas")


def _strategy_scope(strategy):
    return contextlib.nullcontext() if strategy is None else strategy.scope()


def _build_optimizer(optimizer, variables) -> None:
    """Create a Keras optimizer's slot variables now (new and legacy optimizers)."""
    if hasattr(optimizer, "build") and not getattr(optimizer, "built", False):
        optimizer.build(variables)
    elif hasattr(optimizer, "_create_all_weights"):
        optimizer._create_all_weights(variables)


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


def _forward_pairs(tf1_out, tf1_reg, tf2_out, tf2_reg) -> list:
    """What a forward-pass step compares: the outputs and the total regularization loss
    (0 on a side without regularizers)."""
    return [("outputs", tf1_out, tf2_out),
            ("regularization_loss", np.float32(tf1_reg), np.float32(tf2_reg))]


def _forward_leaf_tensors(result: StepResult, forward) -> dict:
    """``{leaf name: TF1 tensor}`` for a forward-pass step's comparisons, matched
    by position (the comparison walks the TF1 structure in order); a part whose
    leaf count differs (keys on one side only) is left out."""
    parts = [flatten_tensors(part) for _, part, _ in _split_outputs(forward.outputs, forward.outputs)]
    parts.append([forward.regularization])
    tensors = {}
    for comparison, part in zip(result.comparisons, parts):
        if len(comparison.leaves) == len(part):
            tensors.update({leaf.name: tensor for leaf, tensor in zip(comparison.leaves, part)})
    return tensors


def _judge_loop_random(result: StepResult, loops: Mapping, tensors: Mapping) -> StepResult:
    """A failed step is "not comparable" when the TF1 pass draws random numbers
    inside a while loop and every failing leaf is computed from such a loop.

    In a TF1 session a random op inside ``tf.while_loop`` (``DropoutWrapper``
    under ``dynamic_rnn``) is one stateful op that draws a new value at every
    iteration; run eagerly, every iteration creates a new op, which the random
    tool seeds afresh, so the two sides' draws cannot be aligned. A failing
    leaf that does not depend on such a loop is a real difference: the step
    stays failed, with a note.
    """
    if result.status != "failed" or not loops:
        return result
    failing = [leaf.name for comparison in result.comparisons for leaf in comparison.failures]
    unexplained = [name for name in failing if not depends_on(tensors.get(name), loops)]
    described = "; ".join(f"{loop}: {', '.join(found[:3])}" for loop, found in list(loops.items())[:3])
    if unexplained:
        note = (f"the TF1 pass draws random numbers inside while loops ({described}), but these failing "
                f"leaves do not depend on them: {unexplained[:5]}")
        return dataclasses.replace(result, notes=result.notes + (note,))
    message = ("not comparable: the TF1 pass draws random numbers inside a while loop (one stateful op "
               "drawing anew at every iteration, while eagerly each iteration creates a new op), so the "
               f"two sides' draws cannot be aligned; every failing leaf ({len(failing)}) depends on it. "
               f"Loops: {described}. The inference steps compare the same layers without those draws.")
    return dataclasses.replace(result, status="skipped", message=message,
                               data={**dict(result.data), "not_comparable": "random ops inside while loops",
                                     "failed_leaves": failing[:20]})


def _sparse_note(tf1_keys, tf2_keys, applied: bool = False) -> list:
    """A note naming the variables whose gradients were sparse (tf.IndexedSlices)."""
    keys = sorted(set(tf1_keys) | set(tf2_keys))
    if not keys:
        return []
    how = ("applied sparsely by both optimizers; the updated variables are compared" if applied
           else "scattered into dense arrays and compared densely")
    sides = ("on both sides" if set(tf1_keys) == set(tf2_keys)
             else f"TF1: {sorted(tf1_keys)[:5]}, TF2: {sorted(tf2_keys)[:5]}")
    return [f"sparse gradients (tf.IndexedSlices, {sides}) for {len(keys)} variable(s) {keys[:5]}: {how}"]


def _with_seconds(result: StepResult, seconds: float) -> StepResult:
    return dataclasses.replace(result, seconds=seconds)


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
    disable_arithmetic_optimization: bool = True,
    seed: int = 42,
    progress: Callable[[StepResult], None] | None = None,
    meta: Mapping[str, Any] | None = None,
    strategy: tf.distribute.Strategy | None = None,
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
      disable_arithmetic_optimization: turn Grappler's arithmetic optimizer off
        in the TF1 session, as the guide suggests for tighter matches.
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
    """
    if not callable(tf1_fn):
        raise TypeError(f"tf1_fn: expected a callable tf1_fn(inputs, training), got {type(tf1_fn).__name__}")
    if not callable(tf2_layer):
        raise TypeError("tf2_layer: expected a Keras layer or a zero-argument factory returning one, "
                        f"got {type(tf2_layer).__name__}")
    _check_inputs(inputs)
    selected = _select(steps, STEPS, "steps")
    if selected is None:
        selected = DEFAULT_STEPS + (("optimizer",) if optimizers is not None else ()) \
            + (("checkpoint",) if checkpoint else ())
    selected_modes = _select(modes, MODES, "modes") or ()
    if "random" in selected and not selected_modes:
        raise ValueError(f"modes: the random step needs at least one mode from {list(MODES)}")
    if isinstance(train_steps, bool) or not isinstance(train_steps, int) or train_steps < 1:
        raise ValueError(f"train_steps: expected an int >= 1, got {train_steps!r}")
    if optimizers is not None and not (isinstance(optimizers, (tuple, list)) and len(optimizers) == 2
                                       and all(callable(o) for o in optimizers)):
        raise TypeError("optimizers: expected a pair (make_tf1_optimizer, make_tf2_optimizer) of "
                        "zero-argument callables")
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"strategy: expected a tf.distribute.Strategy, got {type(strategy).__name__}")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn: expected a callable loss_fn(outputs, regularization_loss), got {loss_fn!r}")
    engine = _Engine(tf1_fn, tf2_layer, inputs, steps=selected, modes=selected_modes,
                     tolerance=tolerance, step_tolerances=step_tolerances, loss_fn=loss_fn,
                     optimizers=optimizers, train_steps=train_steps, checkpoint=checkpoint,
                     rename=rename, tf_function=tf_function,
                     disable_arithmetic_optimization=disable_arithmetic_optimization,
                     seed=seed, progress=progress, strategy=strategy)
    results = engine.run()
    info = {
        "tensorflow": tf.__version__,
        "steps": list(selected),
        "modes": list(selected_modes),
        "tf_function": tf_function,
        "disable_arithmetic_optimization": disable_arithmetic_optimization,
        "seed": seed,
        "input_shapes": [list(np.shape(leaf)) for leaf in flatten_tensors(inputs)],
        "strategy": None if strategy is None else
        f"{type(strategy).__name__} ({strategy.num_replicas_in_sync} replicas)",
    }
    info.update(meta or {})
    return EquivalenceReport(tuple(results), info)
