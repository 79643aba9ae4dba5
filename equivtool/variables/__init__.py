"""Steps 1 and 2 of the equivalence workflow: variables are created once, and they match.

TensorFlow's migration guide asks for two hand-written checks before any
number is compared: calling the migrated layer a second time must not create
new variables (a shim layer whose ``get_variable`` calls do not reuse would
silently train fresh weights on every step), and the TF1 graph and the TF2
layer must hold the same variables (count, names, shapes, trainability).

This module provides both as library calls:

* :func:`assert_no_variable_creations` fails at the moment a variable is
  created, naming it and the user's line that created it;
* :func:`catch_and_raise_created_variables` lets creation happen and lists
  every created variable at the end, grouped by scope;
* :func:`creates_variables_once` guards a layer method per instance;
* :func:`tf1_variables`, :func:`tf2_variables`, :func:`compare_variables` and
  :func:`assert_variable_parity` capture and compare the two sides.

All guards install a variable creator as ``tf.variable_creator_scope`` does, so
they see ``tf.Variable``, ``tf.compat.v1.get_variable`` (and so tf-slim and
``tf.compat.v1.layers``) and Keras ``add_weight``, eagerly and while a
``tf.function`` is traced. Each guard removes exactly its own creator when it
ends, in whatever order guards end and on whichever thread.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Sequence, Union

import numpy as np
import tensorflow as tf

from equivtool._base.render import fixed_row, text_table

__all__ = [
    "VariableCreationError", "assert_no_variable_creations",
    "catch_and_raise_created_variables", "creates_variables_once",
    "VariableInfo", "VariableSet", "VariableParity", "tf1_variables",
    "tf2_variables", "compare_variables", "assert_variable_parity",
]


from equivtool.variables.guards import (  # noqa: E402  (step 1 lives in its own module)
    CreatedVariable, VariableCreationError, assert_no_variable_creations,  # noqa: F401
    catch_and_raise_created_variables, creates_variables_once)
from equivtool.variables.flavour import (  # noqa: E402  (one reader of names, dtypes, shapes)
    layer_variables, variable_dtype, variable_name, variable_shape)


# --------------------------------------------------------------------------
# Step 2: capture and compare
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class VariableInfo:
    """A variable's identity for parity: name (without ``:0``), shape, dtype, trainability."""

    name: str
    shape: tuple
    dtype: str
    trainable: bool

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if None not in self.shape else -1

    @classmethod
    def of(cls, variable) -> "VariableInfo":
        shape = variable_shape(variable)
        shape = tuple(shape.as_list()) if shape.rank is not None else ()
        return cls(variable_name(variable), shape, variable_dtype(variable).name, bool(variable.trainable))


@dataclass(frozen=True)
class VariableSet:
    """Variables captured from one side, in creation order (duplicates kept)."""

    variables: tuple
    source: str = ""
    #: ``((kernel name, (a, b)), ...)``: a TF1 graph's kernels whose output it reshapes to
    #: ``[..., a, b]`` (how it splits attention heads: :func:`equivtool.variables.attention.head_splits`).
    head_splits: tuple = ()

    def __len__(self) -> int:
        return len(self.variables)

    def __iter__(self) -> Iterator[VariableInfo]:
        return iter(self.variables)

    @property
    def names(self) -> tuple:
        return tuple(v.name for v in self.variables)

    @property
    def trainable(self) -> tuple:
        return tuple(v for v in self.variables if v.trainable)

    @property
    def num_trainable_parameters(self) -> int:
        return sum(v.size for v in self.variables if v.trainable)

    @classmethod
    def from_variables(cls, variables: Iterable, source: str = "") -> "VariableSet":
        return cls(tuple(VariableInfo.of(v) for v in variables), source)

    @classmethod
    def from_layer(cls, layer, source: str = "tf2") -> "VariableSet":
        """Capture ``layer.variables`` (a Keras 3 layer's without its random-number
        state); the layer must have been called (built)."""
        if not hasattr(layer, "variables"):
            raise TypeError(
                f"layer: expected a Keras layer or tf.Module with .variables, got "
                f"{type(layer).__name__}")
        if getattr(layer, "built", True) is False:
            raise ValueError(
                f"layer: {getattr(layer, 'name', layer)!r} has never been called, so it "
                "has no variables yet; call it on an input (or use "
                "equivtool.tf2_variables(layer, inputs)) before capturing its variables")
        return cls.from_variables(layer_variables(layer), source)

    def __str__(self) -> str:
        lines = [f"{len(self)} variables ({len(self.trainable)} trainable, "
                 f"{self.num_trainable_parameters:,} trainable parameters)"
                 + (f" from {self.source}" if self.source else "")]
        for info in self.variables:
            cells = (info.name, str(info.shape), info.dtype, "trainable" if info.trainable else "frozen")
            lines.append("  " + fixed_row(cells, (60, 20, 8, 0), sep=" "))
        return "\n".join(lines)


def _check_callable(value, argument: str) -> None:
    if not callable(value):
        raise TypeError(f"{argument}: expected a callable, got {type(value).__name__} ({value!r})")


def tf1_variables(build_fn: Callable, *args, **kwargs) -> VariableSet:
    """Build ``build_fn(*args, **kwargs)`` in a fresh ``tf.Graph`` and capture its global variables.

    Trainability is read from the graph's ``TRAINABLE_VARIABLES`` collection,
    exactly as a TF1 optimizer would see it.
    """
    _check_callable(build_fn, "build_fn")
    graph = tf.Graph()
    with graph.as_default():
        build_fn(*args, **kwargs)
        global_vars = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        trainable_ids = {id(v) for v in graph.get_collection(
            tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
        infos = []
        for variable in global_vars:
            info = VariableInfo.of(variable)
            infos.append(VariableInfo(info.name, info.shape, info.dtype,
                                      id(variable) in trainable_ids))
    return VariableSet(tuple(infos), source="tf1")


def tf2_variables(layer: Callable, *args, calls: int = 2, **kwargs) -> VariableSet:
    """Call ``layer(*args, **kwargs)`` ``calls`` times and capture ``layer.variables``.

    The first call may create variables; the later ones run under
    :func:`assert_no_variable_creations`, so step 1 is checked on the way.
    """
    _check_callable(layer, "layer")
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls: expected an int >= 1 (the first call creates the variables), got {calls!r}")
    if not hasattr(layer, "variables"):
        raise TypeError(f"layer: expected a Keras layer or tf.Module with .variables, got {type(layer).__name__}")
    layer(*args, **kwargs)
    for _ in range(calls - 1):
        with assert_no_variable_creations():
            layer(*args, **kwargs)
    return VariableSet.from_variables(layer_variables(layer), source="tf2")


RenameRules = Union[None, Callable[[str], str], Mapping[str, str], Sequence[tuple]]


def make_renamer(rename: RenameRules) -> Callable[[str], str]:
    if rename is None:
        return lambda name: name
    if callable(rename):
        return rename
    if isinstance(rename, Mapping):
        rules = list(rename.items())
    elif isinstance(rename, (list, tuple)):
        rules = list(rename)
        for rule in rules:
            if not (isinstance(rule, (list, tuple)) and len(rule) == 2):
                raise TypeError(
                    "rename: expected a callable, a {pattern: replacement} dict or a "
                    f"sequence of (pattern, replacement) pairs; got the item {rule!r}")
    else:
        raise TypeError(
            "rename: expected a callable, a {pattern: replacement} dict or a sequence "
            f"of (pattern, replacement) pairs, got {type(rename).__name__}")
    compiled = []
    for pattern, replacement in rules:
        try:
            compiled.append((re.compile(pattern), replacement))
        except re.error as exc:
            raise ValueError(f"rename: invalid regular expression {pattern!r}: {exc}") from exc

    def apply(name: str) -> str:
        for regex, replacement in compiled:
            name = regex.sub(replacement, name)
        return name

    return apply


def _as_variable_set(value, argument: str) -> VariableSet:
    if isinstance(value, VariableSet):
        return value
    if hasattr(value, "variables") and not isinstance(value, (list, tuple)):
        return VariableSet.from_layer(value)
    if isinstance(value, (list, tuple)):
        items = []
        for item in value:
            if isinstance(item, VariableInfo):
                items.append(item)
            elif isinstance(item, tf.Variable) or hasattr(item, "trainable"):
                items.append(VariableInfo.of(item))
            else:
                raise TypeError(f"{argument}: cannot read a variable from {type(item).__name__}")
        return VariableSet(tuple(items))
    raise TypeError(
        f"{argument}: expected a VariableSet (from tf1_variables/tf2_variables), a "
        f"layer, or a list of variables; got {type(value).__name__}")


@dataclass(frozen=True)
class VariableParity:
    """The result of comparing two variable sets, matched by (renamed) name."""

    expected_count: int
    actual_count: int
    missing: tuple = ()
    extra: tuple = ()
    shape_mismatches: tuple = ()      # (name, expected shape, actual shape)
    dtype_mismatches: tuple = ()      # (name, expected dtype, actual dtype)
    trainable_mismatches: tuple = ()  # (name, expected trainable, actual trainable)
    duplicates: tuple = ()            # (side, name, count)
    matched: tuple = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.shape_mismatches or self.dtype_mismatches
                    or self.trainable_mismatches or self.duplicates)

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        head = (f"Variable parity: {'OK' if self.ok else 'MISMATCH'} - expected (TF1) "
                f"{self.expected_count}, actual (TF2) {self.actual_count}, matched "
                f"{len(self.matched)}")
        rows = []
        rows += [("missing in TF2", name, "present", "absent") for name in self.missing]
        rows += [("extra in TF2", name, "absent", "present") for name in self.extra]
        rows += [("shape", n, str(e), str(a)) for n, e, a in self.shape_mismatches]
        rows += [("dtype", n, e, a) for n, e, a in self.dtype_mismatches]
        rows += [("trainable", n, str(e), str(a)) for n, e, a in self.trainable_mismatches]
        rows += [(f"duplicate ({side})", n, f"{count} variables", "names must be unique")
                 for side, n, count in self.duplicates]
        if not rows:
            return head
        return "\n".join([head, *text_table(("problem", "variable", "TF1", "TF2"), rows)])


def compare_variables(expected, actual, rename: RenameRules = None) -> VariableParity:
    """Match two variable sets by name and report every difference.

    ``expected`` is usually :func:`tf1_variables`' result, ``actual``
    :func:`tf2_variables`'. ``:N`` output suffixes are always ignored;
    ``rename`` normalises names on both sides first: a callable, or regex rules
    as ``{pattern: replacement}`` or ``[(pattern, replacement), ...]`` applied
    in order (e.g. ``{r"^my_layer/": ""}`` strips an outer scope).
    """
    expected_set = _as_variable_set(expected, "expected")
    actual_set = _as_variable_set(actual, "actual")
    renamer = make_renamer(rename)

    def index(varset: VariableSet, side: str):
        grouped: "collections.OrderedDict[str, list]" = collections.OrderedDict()
        for info in varset:
            new_name = renamer(info.name)
            if not isinstance(new_name, str):
                raise TypeError(f"rename: must return a str, returned {type(new_name).__name__} for {info.name!r}")
            grouped.setdefault(new_name, []).append(info)
        dups = tuple((side, name, len(items)) for name, items in grouped.items() if len(items) > 1)
        return grouped, dups

    exp, exp_dups = index(expected_set, "TF1")
    act, act_dups = index(actual_set, "TF2")
    missing = tuple(name for name in exp if name not in act)
    extra = tuple(name for name in act if name not in exp)
    shapes, dtypes, trainables, matched = [], [], [], []
    for name, items in exp.items():
        if name not in act:
            continue
        e, a = items[0], act[name][0]
        matched.append(name)
        if e.shape != a.shape:
            shapes.append((name, e.shape, a.shape))
        if e.dtype != a.dtype:
            dtypes.append((name, e.dtype, a.dtype))
        if e.trainable != a.trainable:
            trainables.append((name, e.trainable, a.trainable))
    return VariableParity(
        expected_count=len(expected_set), actual_count=len(actual_set), missing=missing,
        extra=extra, shape_mismatches=tuple(shapes), dtype_mismatches=tuple(dtypes),
        trainable_mismatches=tuple(trainables), duplicates=exp_dups + act_dups,
        matched=tuple(matched))


def assert_variable_parity(expected, actual, rename: RenameRules = None) -> VariableParity:
    """Like :func:`compare_variables`, raising ``AssertionError`` with the table on any difference."""
    parity = compare_variables(expected, actual, rename)
    if not parity.ok:
        raise AssertionError(str(parity))
    return parity
