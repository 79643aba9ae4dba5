"""The step registry: every step of the equivalence workflow, defined once.

A :class:`Step` is a small registered unit: the name it is reported under, its
title, the user-facing name that selects it (``steps=[...]``), the random-tool
mode it needs, and how it runs (a ``"module:function"`` reference, resolved
only when the step runs, so this module imports nothing heavy: the CLI can read
its choices without importing TensorFlow).

Everything else derives from :data:`REGISTRY`:

* :data:`STEPS`, the names ``check_equivalence(steps=...)`` and the CLI accept;
* :data:`DEFAULT_STEPS`, the selection when ``steps`` is not given;
* :data:`MODES`, the random-tool modes (``DeterministicRandomTestTool`` and
  ``check_equivalence(modes=...)`` accept these);
* titles, the run order (:func:`run_order`) and the report order (the
  registry's own order).
"""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

__all__ = ["Step", "REGISTRY", "STEPS", "DEFAULT_STEPS", "MODES", "SUB_STEPS", "get_step", "title",
           "run_order", "report_order", "select_steps", "select_modes", "default_selection", "SkipStep"]

#: The :class:`~equivtool.DeterministicRandomTestTool` modes, in the order the
#: ``random`` step runs them.
from equivtool.seeding.modes import MODES  # noqa: E402  (the random tool's, TensorFlow-free)

_RUNS = "equivtool.engine.steps."  # + "<module>:<step>", one module per what a step proves


@dataclass(frozen=True)
class Step:
    """One unit of the workflow.

    Attributes:
      name: the name in reports and ``step_tolerances`` (``"random/constant/training"``).
      title: the one-line description shown in reports.
      run: ``"module:function"``; the function takes the engine and ``params``
        as keyword arguments and returns a :class:`~equivtool.StepResult`.
      option: the name that selects the step in ``steps=[...]`` (default ``name``).
      mode: the random-tool mode the step needs to be selected in ``modes``, if any.
      params: keyword arguments passed to ``run``, as ``(name, value)`` pairs
        (a tuple, so a step stays hashable).
      default: selected when ``steps`` is not given.
      enabled_by: a ``check_equivalence`` argument that, when given, adds the
        step to the default selection (``optimizers``, ``checkpoint``).
      run_rank: position in the run order (ties keep the registry's order).
      shared: runs on the shared constant-mode pair of models; steps with
        ``shared=False`` build their own models and run after the pair is freed.
      needs: the capabilities it asks of both sides (see :mod:`equivtool.engine.sides`);
        a side that refuses one skips the step with its reason.
    """

    name: str
    title: str
    run: str
    option: str = ""
    mode: str | None = None
    params: tuple = ()
    default: bool = True
    enabled_by: str | None = None
    run_rank: int = 0
    shared: bool = True
    needs: tuple = ()

    def __post_init__(self) -> None:
        if not self.option:
            object.__setattr__(self, "option", self.name)

    def runner(self) -> Callable:
        """The function that runs this step (imported on first use)."""
        return pkgutil.resolve_name(self.run)


def _random(mode: str, training: bool, run_rank: int, shared: bool) -> Step:
    what = "training" if training else "inference"
    return Step(f"random/{mode}/{what}", f"Random tool, {mode} mode: {what}",
                _RUNS + ("forward:random_constant" if shared else "forward:random_fresh"), option="random", mode=mode,
                params=(("mode", mode), ("training", training)), run_rank=run_rank, shared=shared,
                needs=("forward",))


#: Every step, in report order. Run order: :func:`run_order`.
REGISTRY: tuple[Step, ...] = (
    Step("variables_once", "Variables are created once", _RUNS + "variables:variables_once", run_rank=0,
         needs=("variables",)),
    Step("parity", "Variable parity (names, shapes, dtypes, trainability)", _RUNS + "variables:parity", run_rank=1,
         needs=("variables",)),
    # Changes the variables and puts them back (after the pair's first call,
    # which the random-mode comparisons read): before the TF1 training graph's
    # session exists, so that the values it saves are not held beside it.
    Step("fixed_weights", "Fixed weights: inference outputs and regularization losses",
         _RUNS + "forward:fixed_weights", run_rank=2, needs=("forward", "variables")),
    _random("constant", False, run_rank=2, shared=True),
    _random("constant", True, run_rank=2, shared=True),
    # Fresh graphs and layers per comparison: after the shared pair is freed.
    _random("num_random_ops", False, run_rank=9, shared=False),
    _random("num_random_ops", True, run_rank=9, shared=False),
    Step("gradients", "Gradients of the loss w.r.t. every trainable variable", _RUNS + "training:gradients",
         run_rank=3, needs=("gradients",)),
    Step("optimizer", "Optimizer steps: losses and updated variables", _RUNS + "training:optimizer",
         default=False, enabled_by="optimizers", run_rank=5, needs=("training", "variables")),
    Step("checkpoint", "TF1 name-based checkpoint loaded into both sides", _RUNS + "checkpoint:checkpoint",
         default=False, enabled_by="checkpoint", run_rank=6, needs=("checkpoints", "forward")),
    # A graph and a layer of its own (see equivtool.checkpoints._resume).
    Step("resume", "Training resumed from a TF1 checkpoint (converted for TF2): loss, variables, slots",
         "equivtool.checkpoints._resume:resume", default=False, enabled_by="resume", run_rank=8,
         shared=False, needs=("training", "checkpoints")),
)

_BY_NAME = {step.name: step for step in REGISTRY}


def _unique(names: Iterable[str]) -> tuple:
    return tuple(dict.fromkeys(names))


#: The names ``steps=[...]`` accepts, in report order.
STEPS: tuple[str, ...] = _unique(step.option for step in REGISTRY)
#: The selection when ``steps`` is not given (plus the steps an argument enables).
DEFAULT_STEPS: tuple[str, ...] = _unique(step.option for step in REGISTRY if step.default)
#: Every name a step is reported under (``step_tolerances`` keys may also be a prefix of one).
SUB_STEPS: tuple[str, ...] = tuple(step.name for step in REGISTRY)


def get_step(name: str) -> Step:
    """The registered step reported as ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no step named {name!r}; registered: {list(_BY_NAME)}") from None


def title(name: str) -> str:
    return get_step(name).title


def _names(values, allowed: Sequence[str], argument: str) -> tuple | None:
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


def default_selection(enabled: Iterable[str] = ()) -> tuple:
    """:data:`DEFAULT_STEPS` plus the steps enabled by the given argument names."""
    enabled = set(enabled)
    return _unique(step.option for step in REGISTRY if step.default or step.enabled_by in enabled)


def select_steps(steps, enabled: Iterable[str] = ()) -> tuple:
    """Validate ``steps`` (names from :data:`STEPS`); ``None`` selects :func:`default_selection`."""
    selected = _names(steps, STEPS, "steps")
    return default_selection(enabled) if selected is None else selected


def select_modes(modes) -> tuple:
    """Validate ``modes`` (names from :data:`MODES`)."""
    return _names(modes, MODES, "modes") or ()


def _selected(step: Step, steps: Sequence[str], modes: Sequence[str]) -> bool:
    return step.option in steps and (step.mode is None or step.mode in modes)


def run_order(steps: Sequence[str], modes: Sequence[str]) -> list[Step]:
    """The selected steps in the order they run (shared-pair steps first)."""
    chosen = [(s.run_rank, i, s) for i, s in enumerate(REGISTRY) if _selected(s, steps, modes)]
    return [s for _, _, s in sorted(chosen, key=lambda item: item[:2])]


def report_order(names: Iterable[str]) -> list[str]:
    """``names`` (reported step names) in the registry's order."""
    present = set(names)
    return [step.name for step in REGISTRY if step.name in present]


class SkipStep(Exception):
    """Raised inside a step that cannot run with the given arguments; the
    message is the reason shown in the report."""
