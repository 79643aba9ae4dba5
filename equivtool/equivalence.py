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

import os
import warnings
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from equivtool._base.tree import flatten_tensors
from equivtool._platform import graph_rewrites as _graph_rewrites
from equivtool.comparison import Tolerance
from equivtool.coverage import Coverage
from equivtool.engine import registry as _steps
from equivtool.engine.noise_floor import DEFAULT_MULTIPLE as DEFAULT_NOISE_FLOOR_MULTIPLE
from equivtool.engine.options import Options
from equivtool.engine.run import Engine
from equivtool.report import EquivalenceReport, StepResult
from equivtool.seeding.traced import execution_note

__all__ = ["check_equivalence", "UnmatchedToleranceKeys", "STEPS", "MODES", "DEFAULT_STEPS"]

# Derived from the step registry (equivtool.engine.registry), kept importable from here.
STEPS = _steps.STEPS
DEFAULT_STEPS = _steps.DEFAULT_STEPS
MODES = _steps.MODES


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
    localize: bool | str = False,
    workers: int = 1,
    disable_arithmetic_optimization: bool | None = None,
    outputs: str | Sequence[str] | None = None,
    strict_tolerances: bool = False,
    noise_floor: bool = True,
    noise_floor_multiple: float = DEFAULT_NOISE_FLOOR_MULTIPLE,
    strict_intermediates: bool = False,
    slot_layout=None,
    tf1_python: str | os.PathLike | None = None,
    tf1_path: Sequence[str | os.PathLike] = (),
    kernel_floor: bool = False,
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
      inputs: a NumPy array, or a nested structure (dict, list, tuple) of arrays
        and NumPy scalars, fed to both sides. A ``tf.Tensor``/``tf.Variable``
        or Python numbers are refused, naming the leaf: pass ``x.numpy()`` or
        ``np.asarray(x)`` (a list of numbers is not guessed into one array).
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
        TensorFlow ops (used on both sides); ``regularization_loss`` is a float32
        scalar tensor on both sides, 0.0 when the model has no regularization
        losses (never None), so ``outputs_loss + regularization_loss`` always
        works. Default: mean of squares of the primary output plus the
        regularization loss, where the primary output is the output itself; of
        a tuple or list its first element (slim's ``(logits, end_points)``); of
        a dict its last entry (end points in forward order: the head), applied
        until a tensor is reached. The gradients step's report names it, and
        lists trainable variables the loss reaches on neither side.
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
        verdict may depend on the CPU. See :mod:`equivtool._platform.graph_rewrites`.
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
        ``random/*``, ``checkpoint``) and failed, run the pass once more, from
        the variables the step started from, with every op's output captured on
        both sides and attach the first op whose output exceeds tolerance as
        ``step.data["localization"]`` (an
        :class:`equivtool.localize.Localization`); ``"all"``: passing steps too.
        Verdicts and numbers are those of the steps themselves (a passing
        step whose intermediate differs is named in the verdict line). See
        :mod:`equivtool.localize` and ``docs/localization.md``.
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
      outputs: which output leaves to compare, as patterns matched against
        the leaf names of the report (``end_points/<key>``, ``outputs``); a
        pattern starting with ``!`` excludes (``"!end_points/*depthwise_output"``).
        Applied to both sides before comparing. See :mod:`equivtool.engine.output_filter`.
      strict_tolerances: a key of a ``{output name or pattern: Tolerance}``
        mapping (in ``tolerance`` or ``step_tolerances``) that matched no leaf
        of the comparisons it was given to is an error:
        :class:`UnmatchedToleranceKeys` (a ``ValueError`` holding the report)
        is raised after the run. By default such keys are named in a warning,
        in the text report and in ``meta["unmatched_tolerance_keys"]``.
      noise_floor: the ``optimizer`` and ``resume`` steps run the TF1 side once
        more from the same start with every float variable (slots and moving
        statistics included) one ULP away, and record that run's divergence
        from the first, per step and leaf: the floor. A leaf that exceeds its
        tolerance by no more than ``noise_floor_multiple`` times its floor is
        "consistent with rounding" and passes, with both numbers in a note and
        in ``step.data["noise_floor"]``; a floor of 0 widens nothing. ``False``
        skips the extra run. See :mod:`equivtool.engine.noise_floor`.
      noise_floor_multiple: how many times its floor a leaf's difference may
        reach (a number >= 1; default 10, one decimal digit).
      strict_intermediates: with ``localize``: passing forward-pass steps are
        localized too, and one whose outputs pass while an intermediate op
        differs beyond tolerance fails.
      slot_layout: the ``resume`` step's declared TF1 optimizer layout, as
        for :func:`equivtool.convert_checkpoint` (``equivtool.ADAM_WEIGHT_DECAY``
        for BERT's ``AdamWeightDecayOptimizer``).
      tf1_python: the path of a TensorFlow 1.x interpreter (``equivtool tf1-env``)
        in which the TF1 side runs, as the old code ran (``tf.contrib``
        included); ``tf1_fn`` is then ``"module:function"``, imported there with
        ``tf1_path`` and the current folder on its ``sys.path``. Default
        ``$EQUIVTOOL_TF1_PYTHON`` when ``tf1_fn`` is such a name. A ``loss_fn``
        is then a ``"module:function"`` name too, imported in both
        interpreters. Parity, fixed weights, both random modes, gradients,
        optimizer steps (``optimizers=("module:make_tf1_optimizer",
        make_tf2_optimizer)``), ``checkpoint`` and ``resume`` run there; the steps it
        cannot run yet are skipped with the reason. The report's header names
        the interpreter (``old_ran_under``). With ``workers=2`` the interpreter
        is the TF1 worker: both sides of each step run at once. See
        ``docs/tf1-as-it-ran.md``.
      tf1_path: folders put on the TF1 interpreter's ``sys.path``.
      kernel_floor: with ``tf1_python``: the steps that compare computed values
        (``fixed_weights``, both random modes, ``gradients``, ``optimizer``) run
        their TF1 side a second time there with every floating-point output
        of every compute op moved one ULP (rounding injected at every op); a
        failed leaf within ``noise_floor_multiple`` times that run's
        divergence is "consistent with kernel rounding" (TensorFlow 1.15's
        kernels round differently from this TensorFlow's). The numbers are in
        ``step.data["kernel_floor"]``. Refused without ``tf1_python``. See
        :mod:`equivtool.engine.kernel_floor`.
    """
    # The arguments are declared once, in this signature: every one goes to Options.build by name.
    options = Options.build(**locals())
    engine = Engine(options)
    parallel = None
    if options.workers > 1 and options.in_process is None and options.tf1_python is not None:
        from equivtool.engine.old_workers import run_parallel as parallel  # the TF1 interpreter is the worker
    elif options.workers > 1 and options.in_process is None:
        from equivtool.engine.workers import run_parallel as parallel
    results = engine.run(parallel)
    header = _header(options)
    if engine.jobs:
        header["worker_jobs"] = engine.jobs
    if options.tf1_python is not None:  # as compare --old-python names what OLD ran under
        header["old_ran_under"] = engine.old_ran_under or f"not started: {options.tf1_python}"
        if engine.old_interpreter is not None:  # its Python, TensorFlow, machine, CPU or CUDA build
            header["old_interpreter"] = dict(engine.old_interpreter)
    unmatched = engine.unmatched_tolerance_keys()
    if unmatched:
        header["unmatched_tolerance_keys"] = unmatched
    report = EquivalenceReport(tuple(results), header, coverage=Coverage.from_steps(results))
    if unmatched:
        _refuse_or_warn(report, unmatched, options.strict_tolerances)
    return report


class UnmatchedToleranceKeys(ValueError):
    """With ``strict_tolerances=True``: tolerance keys matched no leaf. ``report`` is the run's report."""

    def __init__(self, message: str, report: EquivalenceReport):
        super().__init__(message)
        self.report = report


def _refuse_or_warn(report: EquivalenceReport, unmatched: list, strict: bool) -> None:
    keys = ", ".join(unmatched)
    if strict:
        raise UnmatchedToleranceKeys(
            f"strict_tolerances: tolerance keys matched no leaf: {keys}; correct them to an output "
            "or leaf name (or pattern) the report shows, or remove them", report)
    warnings.warn(f"tolerance keys matched no leaf, so their tolerance applied to nothing: {keys} "
                  "(strict_tolerances=True makes this an error)", UserWarning, stacklevel=3)


def _header(options: Options) -> dict:
    """The report's header: how the check ran, then notes on the inputs and the user's ``meta``."""
    strategy = options.strategy
    return {
        "tensorflow": tf.__version__,
        "steps": list(options.steps),
        "modes": list(options.modes),
        "tf_function": options.tf_function,
        "execution": execution_note(options.tf_function, strategy is not None, options.localize),
        "graph_rewrites": options.graph_rewrites,
        # what the verdict depends on: CPU, oneDNN, rewrites off on each side, threads
        "platform": _graph_rewrites.platform(options.graph_rewrites, options.tf_function),
        "seed": options.seed,
        "input_shapes": [list(np.shape(leaf)) for leaf in flatten_tensors(options.inputs)],
        "strategy": None if strategy is None else
        f"{type(strategy).__name__} ({strategy.num_replicas_in_sync} replicas)",
        **({"localize": options.localize} if options.localize else {}),
        **({"outputs": list(options.outputs)} if options.outputs else {}),
        **({"weights": options.aligned} if options.aligned else {}),
        **({"workers": options.workers if options.in_process is None else
            f"1 (asked for {options.workers}: {options.in_process})"} if options.workers > 1 else {}),
        **options.meta,
    }
