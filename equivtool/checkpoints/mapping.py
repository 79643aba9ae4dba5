"""Propose which TF2 variable is which TF1 variable: :func:`map_variables`.

A native TF2 rewrite (``tf.keras.layers.Conv2D`` where slim had ``conv2d``)
names its variables differently (``net/conv2d/kernel`` for
``net/conv1/weights``), so every check and checkpoint needs ``rename=`` rules.
:func:`map_variables` proposes them from what both sides say about each
variable, in this order, and never guesses silently:

1. the same name on both sides;
2. the same *signature* (shape, dtype, trainability) and the same *role*
   (the last name component, with synonyms: ``weights``/``kernel``,
   ``biases``/``bias``, ``gamma``/``scale``...); when one TF1 and one TF2
   variable share a signature and role, they are a pair;
3. when several share one, a variable whose innermost scope (the layer's
   name, without Keras' ``_N`` numbering) is that of exactly one candidate is
   paired with it (scope similarity: ``net/fc2/weights`` with
   ``model/fc2/kernel``); the rest are paired in creation order and listed in
   :attr:`VariableMapping.by_order` (a swap of two same-shape layers is then
   caught by ``check_equivalence``, whose fixed weights depend on the name);
4. when the counts differ, every candidate is listed in
   :attr:`VariableMapping.ambiguous` and none is paired.

TF1 partitioned variables (``name/part_0``, ``name/part_1``) are one variable
under their full name and shape, as the checkpoint stores them.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from equivtool._base.tree import flatten_tensors
from equivtool._platform.tf_internals import save_slice_info
from equivtool.variables import VariableInfo, VariableSet

__all__ = ["VariableMapping", "map_variables", "mapping_rules"]

# Last name components that mean the same thing in TF1 (slim, tf.compat.v1.layers,
# get_variable) and tf-keras.
_ROLES = (
    ("kernel", "weights", "w", "kernel_weights"),
    ("bias", "biases", "b"),
    ("gamma", "scale"),
    ("beta", "offset"),
    ("moving_mean",),
    ("moving_variance",),
    ("embeddings", "embedding", "params", "embedding_weights"),
)
_ROLE_OF = {name: group[0] for group in _ROLES for name in group}


def _role(name: str) -> str:
    leaf = name.rsplit("/", 1)[-1]
    return _ROLE_OF.get(leaf, leaf)


def _layer_scope(name: str) -> str:
    """The innermost scope, without Keras' per-process ``_N`` numbering, lower case."""
    parts = name.split("/")
    return _UNIQUIFIED.match(parts[-2]).group(1).lower() if len(parts) > 1 else ""


def _pair_by_scope(tf1_names: list, tf2_names: list) -> dict:
    """The pairs whose innermost scope names one layer on both sides and no other
    (``net/fc2/weights`` and ``model/fc2/kernel``): scope similarity decides
    before creation order does."""
    tf2_by_scope: dict = {}
    for name in tf2_names:
        tf2_by_scope.setdefault(_layer_scope(name), []).append(name)
    tf1_scopes = [_layer_scope(name) for name in tf1_names]
    return {name: tf2_by_scope[scope][0] for name, scope in zip(tf1_names, tf1_scopes)
            if scope and len(tf2_by_scope.get(scope, ())) == 1 and tf1_scopes.count(scope) == 1}


def _signature(info: VariableInfo) -> tuple:
    return (tuple(info.shape), info.dtype, info.trainable)


@dataclass(frozen=True)
class VariableMapping:
    """A proposed TF1 -> TF2 variable mapping.

    Attributes:
      pairs: TF1 name -> TF2 name (both without ``:0``), in TF1 creation order.
      unmapped_tf1: TF1 variables with no TF2 counterpart.
      unmapped_tf2: TF2 variables with no TF1 counterpart.
      ambiguous: ``(signature and role, TF1 candidates, TF2 candidates)`` for
        each group that could not be paired (the counts differ).
      rules: the ``rename=`` rules, ``(pattern, replacement)`` pairs, that map
        every paired TF2 name to its TF1 name and leave every TF1 name as it is.
      by_order: TF1 names paired by creation order among same-shape candidates.
      exact: TF2 names whose rule matches that exact name only: Keras numbers
        auto-named layers per process (``dense_3``), so such a rule holds only
        for a layer made as this one was; name the sublayers to make it stable.
    """

    pairs: "OrderedDict[str, str]"
    unmapped_tf1: tuple = ()
    unmapped_tf2: tuple = ()
    ambiguous: tuple = ()
    rules: tuple = ()
    by_order: tuple = ()
    exact: tuple = ()

    @property
    def complete(self) -> bool:
        """Every variable on both sides mapped exactly once."""
        return not (self.unmapped_tf1 or self.unmapped_tf2 or self.ambiguous)

    def tf2_to_tf1(self) -> dict:
        return {tf2: tf1 for tf1, tf2 in self.pairs.items()}

    def problems(self) -> list[str]:
        """One line per unmapped or ambiguous variable (empty when complete)."""
        lines = [f"TF1 variable {n!r} has no TF2 counterpart" for n in self.unmapped_tf1]
        lines += [f"TF2 variable {n!r} has no TF1 counterpart" for n in self.unmapped_tf2]
        lines += [f"ambiguous ({what}): TF1 {list(tf1)} against TF2 {list(tf2)}"
                  for what, tf1, tf2 in self.ambiguous]
        return lines

    def require_complete(self, argument: str) -> None:
        """Raise ``ValueError`` naming every unmapped and ambiguous variable."""
        problems = self.problems()
        if problems:
            raise ValueError(f"{argument}: the variable mapping is incomplete ({len(problems)} problems); "
                             "map them with rename rules or fix the model:\n  " + "\n  ".join(problems))

    def __str__(self) -> str:
        lines = [f"# {len(self.pairs)} variables mapped"
                 + ("" if self.complete else f"; {len(self.problems())} problems (see below)"),
                 "rename = ["]
        order = set(self.by_order)
        tf2_of = dict(self.pairs)
        exact = set(self.exact)
        for (pattern, replacement), tf1 in zip(self.rules, [t for t, u in self.pairs.items() if t != u]):
            comments = ["same shape as others: paired by creation order"] if tf1 in order else []
            if tf2_of[tf1] in exact:
                comments.append("exact: holds only for layers named as these were")
            comment = ("  # " + "; ".join(comments)) if comments else ""
            lines.append(f"    ({pattern!r}, {replacement!r}),{comment}")
        lines.append("]")
        lines += [f"# {line}" for line in self.problems()]
        return "\n".join(lines)


_UNIQUIFIED = re.compile(r"^(.+?)(?:_\d+)?$")


def _tolerant(tf2: str) -> str:
    """An anchored pattern for ``tf2`` in which every scope component may carry
    any ``_N`` suffix: Keras numbers auto-named layers per process
    (``dense``, ``dense_1``...), so the same layer class made again is named anew."""
    *scopes, leaf = tf2.split("/")
    parts = [re.escape(_UNIQUIFIED.match(c).group(1)) + r"(?:_\d+)?" for c in scopes] + [re.escape(leaf)]
    return "^" + "/".join(parts) + "$"


def mapping_rules(pairs: "dict[str, str]", tf1_names=(), tf2_names=()) -> tuple:
    """``(rules, exact)``: ``rename=`` rules mapping each TF2 name in ``pairs``
    (TF1 -> TF2) to its TF1 name, and the TF2 names whose rule had to be exact.

    A rule tolerates Keras' per-process layer numbering (``dense_3`` for
    ``dense``) when that pattern matches only its own TF2 variable and no TF1
    name; otherwise it is exact, and then valid only for layers named as
    these were (name the sublayers to make it stable). The rules are checked:
    every TF1 name must stay as it is and every TF2 name must become its TF1
    name; ``ValueError`` names the first that does not.
    """
    rules, exact = [], []
    for tf1, tf2 in pairs.items():
        if tf1 == tf2:
            continue
        pattern = _tolerant(tf2)
        regex = re.compile(pattern)
        if pattern != f"^{re.escape(tf2)}$" and (
                sum(1 for n in tf2_names if regex.match(n)) != 1 or any(regex.match(n) for n in tf1_names)):
            pattern = f"^{re.escape(tf2)}$"
            exact.append(tf2)
        rules.append((pattern, tf1.replace("\\", "\\\\")))
    rules = tuple(rules)
    apply = _apply(rules)
    for name in tf1_names:
        if apply(name) != name:
            raise ValueError(f"rename rules: TF1 variable {name!r} would become {apply(name)!r}: it is also "
                             "a TF2 name mapped elsewhere; rename it by hand")
    tf1_of = {tf2: tf1 for tf1, tf2 in pairs.items()}
    for name in tf2_names:
        if name in tf1_of and apply(name) != tf1_of[name]:
            raise ValueError(f"rename rules: TF2 variable {name!r} would become {apply(name)!r}, "
                             f"not {tf1_of[name]!r}")
    return rules, tuple(exact)


def _apply(rules) -> Callable[[str], str]:
    compiled = [(re.compile(p), r) for p, r in rules]

    def apply(name: str) -> str:
        for regex, replacement in compiled:
            name = regex.sub(replacement, name)
        return name
    return apply


def propose(tf1: VariableSet, tf2: VariableSet) -> VariableMapping:
    """The mapping between two captured variable sets (see the module's docstring)."""
    for varset, side in ((tf1, "TF1"), (tf2, "TF2")):
        seen = set()
        for name in varset.names:
            if name in seen:
                raise ValueError(f"{side} variable {name!r} appears twice: names must be unique to be mapped")
            seen.add(name)
    tf1_by_name = OrderedDict((v.name, v) for v in tf1)
    tf2_by_name = OrderedDict((v.name, v) for v in tf2)
    pairs: dict = {}
    for name, info in tf1_by_name.items():
        other = tf2_by_name.get(name)
        if other is not None and _signature(other) == _signature(info):
            pairs[name] = name
    by_order, ambiguous = [], []
    # By signature and role first; what is left, by signature alone (a
    # ``table`` of its own shape is the ``embeddings``), and that alone only one to one.
    for keyed in (lambda info: _signature(info) + (_role(info.name),), _signature):
        groups: "OrderedDict[tuple, tuple]" = OrderedDict()
        taken = set(pairs.values())
        for name, info in tf1_by_name.items():
            if name not in pairs:
                groups.setdefault(keyed(info), ([], []))[0].append(name)
        for name, info in tf2_by_name.items():
            if name not in taken:
                groups.setdefault(keyed(info), ([], []))[1].append(name)
        ambiguous = []
        for key, (tf1_names, tf2_names) in groups.items():
            if not tf1_names or not tf2_names:
                continue
            if len(tf1_names) == len(tf2_names) and (len(key) > 3 or len(tf1_names) == 1):
                by_scope = _pair_by_scope(tf1_names, tf2_names) if len(tf1_names) > 1 else {}
                pairs.update(by_scope)
                rest_tf1 = [n for n in tf1_names if n not in by_scope]
                rest_tf2 = [n for n in tf2_names if n not in by_scope.values()]
                pairs.update(zip(rest_tf1, rest_tf2))
                if len(rest_tf1) > 1:
                    by_order.extend(rest_tf1)
            else:
                shape, dtype, trainable = key[:3]
                role = f"{key[3]} " if len(key) > 3 else ""
                what = f"{role}{list(shape)} {dtype}{'' if trainable else ' non-trainable'}"
                ambiguous.append((what, tuple(tf1_names), tuple(tf2_names)))
    ordered = OrderedDict((n, pairs[n]) for n in tf1_by_name if n in pairs)
    in_ambiguity = {n for _, a, b in ambiguous for n in a + b}
    mapped_tf2 = set(ordered.values())
    unmapped_tf1 = tuple(n for n in tf1_by_name if n not in ordered and n not in in_ambiguity)
    unmapped_tf2 = tuple(n for n in tf2_by_name if n not in mapped_tf2 and n not in in_ambiguity)
    rules, exact = mapping_rules(ordered, tf1_by_name, tf2_by_name)
    return VariableMapping(ordered, unmapped_tf1, unmapped_tf2, tuple(ambiguous), rules, tuple(by_order),
                           exact)


def as_rename(rename: Any, argument: str = "rename"):
    """``rename`` as ``check_equivalence`` and ``convert_checkpoint`` take it: a
    :class:`VariableMapping` becomes its rules (refused when ambiguous or
    incomplete, naming every problem); anything else is returned as it is."""
    if isinstance(rename, VariableMapping):
        rename.require_complete(argument)
        return list(rename.rules)
    return rename


def aligned_weights(rename: Any) -> str | None:
    """How ``check_equivalence`` aligns the weights for ``rename``: a
    :class:`VariableMapping` (a native rewrite) aligns them (see
    ``equivtool.checkpoints._align``); rules alone do not."""
    if isinstance(rename, VariableMapping):
        from equivtool.checkpoints._align import ALIGNED
        return ALIGNED
    return None


def tf1_graph_variables(tf1_fn: Callable, inputs, training: bool = False) -> VariableSet:
    """Build ``tf1_fn`` in a fresh graph; its global variables, a partitioned
    variable once under its full name and shape."""
    graph = tf.Graph()
    with graph.as_default():
        tensors = tf.nest.map_structure(tf.convert_to_tensor, inputs)
        tf1_fn(tensors, training)
        trainable = {id(v) for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
        infos = OrderedDict()
        for variable in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
            info = VariableInfo.of(variable)
            slice_info = save_slice_info(variable)
            name, shape = info.name, info.shape
            if slice_info is not None:
                name, shape = slice_info.full_name, tuple(slice_info.full_shape)
            infos.setdefault(name, VariableInfo(name, shape, info.dtype, id(variable) in trainable))
    return VariableSet(tuple(infos.values()), source="tf1")


def make_layer(tf2_layer: Any, argument: str = "tf2_layer"):
    """``tf2_layer()`` when it is a factory, else the layer itself."""
    if not _is_factory(tf2_layer):
        return tf2_layer
    if not callable(tf2_layer):
        raise TypeError(f"{argument}: expected a zero-argument factory returning a Keras layer or tf.Module, "
                        f"got {type(tf2_layer).__name__}")
    layer = tf2_layer()
    if not hasattr(layer, "variables"):
        raise TypeError(f"{argument}: the factory returned {type(layer).__name__}, not a Keras layer or "
                        "tf.Module")
    return layer


def check_inputs(inputs, argument: str = "inputs") -> None:
    leaves = flatten_tensors(inputs)
    if not leaves or any(np.asarray(leaf).dtype == object or np.asarray(leaf).size == 0 for leaf in leaves):
        raise ValueError(f"{argument}: expected a non-empty numeric array (or a nested structure of them)")


def map_variables(tf1_fn: Callable, tf2_layer: Any, inputs, *, training: bool = False) -> VariableMapping:
    """Propose the mapping from the TF1 function's variables to the TF2 layer's.

    Args:
      tf1_fn: ``tf1_fn(inputs, training)`` building the TF1 forward pass, as
        for :func:`equivtool.check_equivalence`.
      tf2_layer: a zero-argument factory returning the TF2 layer, or a layer
        instance (called on ``inputs`` before the TF1 graph is built, as a
        Keras layer cannot be called after a tf-slim graph build).
      inputs: a NumPy array (or nested structure) both are called on once.
      training: the ``training`` flag of that call.

    Returns a :class:`VariableMapping`; ``print(mapping)`` shows the
    ``rename=`` rules as Python, and ``check_equivalence(..., rename=mapping)``
    uses them (refusing a mapping that is ambiguous or incomplete).
    """
    if not callable(tf1_fn):
        raise TypeError(f"tf1_fn: expected a callable tf1_fn(inputs, training), got {type(tf1_fn).__name__}")
    check_inputs(inputs)
    if not callable(tf2_layer):
        raise TypeError(f"tf2_layer: expected a zero-argument factory returning a Keras layer or tf.Module, "
                        f"got {type(tf2_layer).__name__}")
    # A factory's layer is made after the TF1 graph: a Keras layer made before
    # a tf-slim graph build cannot be called after it ("invalid state"). A layer
    # instance was made already, so it is called (its variables created) first,
    # and only its variables are read after the TF1 build.
    instance = make_layer(tf2_layer) if not _is_factory(tf2_layer) else None
    if instance is not None:
        instance(tf.nest.map_structure(tf.convert_to_tensor, inputs), training=training)
    tf1 = tf1_graph_variables(tf1_fn, inputs, training)
    layer = instance
    if layer is None:
        layer = make_layer(tf2_layer)
        layer(tf.nest.map_structure(tf.convert_to_tensor, inputs), training=training)
    return propose(tf1, VariableSet.from_layer(layer))


def _is_factory(tf2_layer: Any) -> bool:
    """Whether ``tf2_layer`` is a factory (a class or function), not a layer (as :func:`make_layer` tells)."""
    return not (isinstance(tf2_layer, tf.Module) or hasattr(tf2_layer, "variables")
                and not isinstance(tf2_layer, type))
