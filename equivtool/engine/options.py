"""``check_equivalence``'s arguments, checked and normalised before any work starts.

:class:`Options` is one frozen object; :meth:`Options.build` raises an error
that names the argument and the expected form, and refuses arguments that
cannot be sent to a worker process (:mod:`equivtool.engine.send`) up front.
"""

from __future__ import annotations

import dataclasses
import types
import os
import warnings
from typing import Any, Callable, Mapping

import numpy as np
import tensorflow as tf

from equivtool.engine import output_filter
from equivtool._base.tree import flatten_tensors
from equivtool._platform import graph_rewrites as _rewrites
from equivtool.comparison import Tolerance
from equivtool.engine import noise_floor as _noise_floor
from equivtool.engine import registry as _steps
from equivtool.engine import send as _send
from equivtool.engine.registry import MODES, STEPS
from equivtool.engine.sides.tf1_side import checkpoint_exists
from equivtool.report import StepResult
from equivtool.variables import make_renamer
from equivtool.variables.slots import SlotLayout
from equivtool.variables.mapping import aligned_weights, as_rename


_PYTHON_NUMBERS = (bool, int, float, complex)


def _check_input_types(node, path: str = "inputs") -> None:
    """Refuse, naming the leaf's path and the fix, what is not a NumPy array or
    scalar in a dict/list/tuple: a TensorFlow tensor or variable (each side
    feeds it its own way), or Python numbers. A list of numbers is not taken
    as one array: a list is also a structure of several inputs, and guessing
    which was meant would be silent."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            _check_input_types(value, f"{path}[{key!r}]")
    elif isinstance(node, (list, tuple)):
        if node and all(isinstance(leaf, _PYTHON_NUMBERS) for leaf in flatten_tensors(node)):
            raise TypeError(f"{path}: a {type(node).__name__} of Python numbers, which equivtool does not "
                            "read as one array (a list is also a structure of several inputs); pass "
                            f"np.asarray({path}, dtype=np.float32)")
        for i, value in enumerate(node):
            _check_input_types(value, f"{path}[{i}]")
    elif hasattr(node, "numpy"):  # a tf.Tensor or tf.Variable (recognised as in equivtool._base.tree)
        raise TypeError(f"{path}: a tensor ({type(node).__name__}); pass NumPy arrays, which both sides feed "
                        f"the same way: {path}.numpy() (or np.asarray({path}))")
    elif isinstance(node, _PYTHON_NUMBERS):
        raise TypeError(f"{path}: a Python {type(node).__name__} ({node!r}); pass a NumPy scalar or array, "
                        f"e.g. np.float32({node!r}) or np.asarray(...)")


def _check_inputs(inputs) -> dict:
    """Refuse inputs that cannot be compared; return the header notes for the report
    (``non_finite_inputs`` when a leaf holds NaN or infinity)."""
    _check_input_types(inputs)
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

    def _key(self, step: str) -> str | None:
        """The ``step_tolerances`` key that applies to ``step`` (the longest prefix), or None."""
        parts = step.split("/")
        for depth in range(len(parts), 0, -1):
            key = "/".join(parts[:depth])
            if key in self.per_step:
                return key
        return None

    def source(self, step: str) -> str:
        """The argument ``step``'s tolerance comes from, as the user wrote it."""
        key = self._key(step)
        return "tolerance" if key is None else f"step_tolerances[{key!r}]"

    def get(self, step: str, index: int | None = None):
        key = self._key(step)
        spec = self.default if key is None else self.per_step[key]
        if callable(spec) and not isinstance(spec, (Tolerance, Mapping)):
            spec = spec(index if index is not None else 0)
        return spec


@dataclasses.dataclass(frozen=True)
class Options:
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
    graph_rewrites: str               # "as_written" | "tensorflow_default" (equivtool._platform.graph_rewrites)
    seed: int
    progress: Callable[[StepResult], None] | None
    meta: Mapping
    strategy: Any
    localize: bool | str = False  # True: the failing forward-pass steps; "all": every one
    strict_intermediates: bool = False  # a passing step whose localization diverged fails
    workers: int = 1
    in_process: str | None = None     # why workers > 1 still runs in one process
    strict_tolerances: bool = False   # a tolerance key that matched no leaf is an error
    outputs: tuple = ()               # include / "!"exclude patterns of compared output leaves
    aligned: str | None = None        # rename=VariableMapping: how both sides' weights are aligned
    noise_floor: bool = True          # multi-step training judged against a measured floor (engine.noise_floor)
    noise_floor_multiple: float = _noise_floor.DEFAULT_MULTIPLE
    slot_layout: Any = None           # the resume step's declared TF1 optimizer layout (a SlotLayout)
    tf1_python: str | None = None     # the TF1 side runs in this interpreter (engine/sides/old_python)
    tf1_path: tuple = ()              # folders on its sys.path (the caller's folder last)
    tf1_loss: str | None = None       # loss_fn's name, imported there ("module:function")
    kernel_floor: bool = False        # with tf1_python: rounding injected at every TF1 op (engine.kernel_floor)

    @property
    def want_gradients(self) -> bool:
        return "gradients" in self.steps

    @classmethod
    def build(cls, tf1_fn, tf2_layer, inputs, **arguments) -> "Options":
        """Check every argument (raising an error that names it and the expected
        form) before any work starts.

        ``arguments`` are :func:`equivtool.check_equivalence`'s keyword arguments,
        every one of them: its signature is the one place they and their defaults
        are declared (a name missing here is an ``AttributeError`` naming it)."""
        a = types.SimpleNamespace(**arguments)
        tf1_python, tf1_path, loss_fn, tf1_loss = a.tf1_python, a.tf1_path, a.loss_fn, None
        if tf1_python is None and isinstance(tf1_fn, str):  # "module:function": the interpreter from the environment
            tf1_python = os.environ.get("EQUIVTOOL_TF1_PYTHON") or None
        if tf1_python is not None:
            from equivtool.engine.sides._old_python_args import check_tf1_python
            tf1_python, tf1_path, loss_fn, tf1_loss = check_tf1_python(tf1_python, tf1_fn, tf1_path, loss_fn,
                                                                       a.optimizers)
        elif not callable(tf1_fn):
            raise TypeError(f"tf1_fn: expected a callable tf1_fn(inputs, training), got {type(tf1_fn).__name__}"
                            + (" (a \"module:function\" name needs tf1_python)" if isinstance(tf1_fn, str) else ""))
        if not callable(tf2_layer):
            raise TypeError("tf2_layer: expected a Keras layer or a zero-argument factory returning one, "
                            f"got {type(tf2_layer).__name__}")
        input_notes = _check_inputs(inputs)
        output_patterns = output_filter.check_patterns(a.outputs)
        enabled = [name for name, given in (("optimizers", a.optimizers is not None),
                                            ("checkpoint", bool(a.checkpoint)),
                                            ("resume", a.optimizers is not None
                                             and isinstance(a.checkpoint, (str, os.PathLike)))) if given]
        selected = _steps.select_steps(a.steps, enabled)
        selected_modes = _steps.select_modes(a.modes)
        if "random" in selected and not selected_modes:
            raise ValueError(f"modes: the random step needs at least one mode from {list(MODES)}")
        _check_training(a.train_steps, a.optimizers if tf1_python is None else None, loss_fn)
        _check_run_options(a.tf_function, a.seed, a.progress, a.strategy)
        graph_rewrites = _graph_rewrites(a.graph_rewrites, a.disable_arithmetic_optimization)
        _check_checkpoint(a.checkpoint)
        from equivtool.localize import check_localize
        check_localize(a.localize)
        if not isinstance(a.strict_intermediates, bool) or (a.strict_intermediates and not a.localize):
            raise TypeError(f"strict_intermediates: expected True (with localize=True or 'all') or False, got "
                            f"{a.strict_intermediates!r}" + ("" if a.localize else " without localize"))
        if a.slot_layout is not None and not isinstance(a.slot_layout, SlotLayout):
            raise TypeError("slot_layout: expected an equivtool.SlotLayout (e.g. equivtool.ADAM_WEIGHT_DECAY), "
                            f"got {type(a.slot_layout).__name__}")
        for name, flag in (("strict_tolerances", a.strict_tolerances), ("noise_floor", a.noise_floor),
                           ("kernel_floor", a.kernel_floor)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: expected True or False, got {flag!r}")
        if a.kernel_floor and tf1_python is None:
            raise ValueError("kernel_floor: needs tf1_python (both sides run in this TensorFlow and share its "
                             "kernels, so there is no kernel difference to measure)")
        multiple = _noise_floor.check_multiple(a.noise_floor_multiple)
        if isinstance(a.workers, (bool, np.bool_)) or not isinstance(a.workers, (int, np.integer)) or a.workers < 1:
            raise ValueError(f"workers: expected an int >= 1 (processes running the two sides), got {a.workers!r}")
        options = cls(tf1_fn=tf1_fn, tf2_layer=tf2_layer, inputs=inputs, steps=selected, modes=selected_modes,
                   tolerances=_StepTolerances(a.tolerance, a.step_tolerances), loss_fn=loss_fn,
                   optimizers=a.optimizers, train_steps=a.train_steps, checkpoint=a.checkpoint,
                   renamer=make_renamer(as_rename(a.rename)), tf_function=bool(a.tf_function),
                   graph_rewrites=graph_rewrites, seed=int(a.seed),
                   progress=a.progress, meta={**input_notes, **_check_meta(a.meta)}, strategy=a.strategy,
                   localize=a.localize, strict_intermediates=a.strict_intermediates, workers=int(a.workers),
                   outputs=output_patterns, strict_tolerances=a.strict_tolerances,
                   aligned=aligned_weights(a.rename),
                   noise_floor=a.noise_floor, noise_floor_multiple=multiple, slot_layout=a.slot_layout,
                   tf1_python=tf1_python, tf1_path=tuple(tf1_path), tf1_loss=tf1_loss,
                   kernel_floor=a.kernel_floor)
        if tf1_python is not None:
            from equivtool.engine.sides._old_python_args import refusal_reason
            reason = refusal_reason(options)
            if reason is not None:
                raise ValueError(reason)
        if options.workers > 1:
            reason = in_process_reason(options)
            if reason is None and tf1_python is None:  # (with tf1_python the TF2 side stays here: nothing is sent)
                check_sendable(options)
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
    _rewrites.check_graph_rewrites(graph_rewrites)
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
# What may not run in workers, and what cannot be sent
# --------------------------------------------------------------------------

def in_process_reason(options: Options) -> str | None:
    """Why the check must run in one process whatever ``workers`` says, or None."""
    if options.localize:
        return "localize=True captures both sides' ops in one process"
    if options.strategy is not None:
        return "a distribution strategy's devices belong to this process"
    if isinstance(options.tf2_layer, tf.Module):
        return "tf2_layer is a layer instance, which cannot be sent to another process (pass a factory)"
    return None


def _for_workers(options: Options) -> Options:
    return dataclasses.replace(options, progress=None)


def check_sendable(options: Options) -> bytes:
    """The options as the workers receive them; a TypeError naming the argument
    that cannot be sent to another process."""
    try:
        return _send.dumps(_for_workers(options))
    except Exception as whole:
        failure = whole  # find which argument it was
    checked = (("tf1_fn", options.tf1_fn), ("tf2_layer", options.tf2_layer), ("inputs", options.inputs),
               ("loss_fn", options.loss_fn), ("optimizers", options.optimizers),
               ("tolerance or step_tolerances", options.tolerances), ("rename", options.renamer),
               ("meta", options.meta), ("checkpoint", options.checkpoint))
    for name, value in checked:
        try:
            _send.dumps(value)
        except Exception as exc:
            raise TypeError(
                f"{name}: cannot be sent to a worker process with workers>1 ({type(exc).__name__}: "
                f"{str(exc)[:200]}); pass module-level functions or picklable objects, or workers=1") from None
    raise TypeError(f"the check's arguments cannot be sent to a worker process with workers>1 "
                    f"({type(failure).__name__}: {str(failure)[:200]}); pass workers=1") from None
