"""Propose which TF2 variable is which TF1 variable: :func:`map_variables`.

A native TF2 rewrite (``tf.keras.layers.Conv2D`` where slim had ``conv2d``)
names its variables differently (``net/conv2d/kernel`` for
``net/conv1/weights``), so every check and checkpoint needs ``rename=`` rules.
:func:`map_variables` proposes them from what both sides say about each
variable, in this order, and never guesses silently:

1. the same name on both sides;
2. the same *signature* (shape, dtype, trainability) and the same *role*
   (the last name component, with synonyms: ``weights``/``kernel``,
   ``depthwise_weights``/``depthwise_kernel``, ``biases``/``bias``,
   ``gamma``/``scale``, ``beta``/``offset``, ``embeddings``...); when as many
   TF1 as TF2 variables share a signature and role, they are paired;
3. when several share one, a variable whose innermost scope (the layer's
   name, without Keras' ``_N`` numbering) is that of exactly one candidate is
   paired with it (scope similarity: ``net/fc2/weights`` with
   ``model/fc2/kernel``); the rest are paired in creation order and listed in
   :attr:`VariableMapping.by_order` (a swap of two same-shape layers is then
   caught by ``check_equivalence``, whose fixed weights depend on the name);
4. when the counts differ, every candidate is listed in
   :attr:`VariableMapping.ambiguous` and none is paired;
   :meth:`VariableMapping.resolve` completes the mapping from the user's
   ``{tf1_name: tf2_name}`` (the refusal prints that call, filled in);
5. a TF1 fused LSTM kernel (``lstm_cell/kernel``, input and recurrent rows in
   one matrix, gates i, j, f, o) against Keras' split ``kernel`` and
   ``recurrent_kernel`` (gates i, f, c, o) is refused in
   :attr:`VariableMapping.refused`: no transpose or reshape expresses it;
6. multi-head attention blocks (TF1 ``query``/``key``/``value``/``output``
   dense layers against ``MultiHeadAttention``'s ``EinsumDense`` ones) are
   paired by that structure before shapes are grouped, with ``"reshape"``
   where the shapes differ (``equivtool.checkpoints._attention``); a block
   whose TF1 graph splits the heads otherwise is refused
   (:func:`equivtool.variables.attention.split_refusals`).

A pair may carry a declared transform (:meth:`VariableMapping.resolve`):
``"transpose"`` (the axes reversed: BERT's ``output_weights`` [classes,
hidden] for a ``Dense`` kernel [hidden, classes]) or ``"reshape"`` (to the
TF2 shape, same element order: a [hidden, hidden] attention kernel for
``MultiHeadAttention``'s [hidden, heads, head_size]). A checkpoint conversion
applies it to the TF1 value; a check applies its inverse to every TF2 value
it reads and the transform to the fixed starting values it writes.

Keras numbers auto-named layers per process (``dense``, ``dense_1``, then
``dense_2`` for the same layer made again). A check or conversion given a
:class:`VariableMapping` and a factory makes its layers with fresh numbering
(:func:`fresh_layer_numbering`), as :func:`map_variables` did, so the rules
hold for every layer the factory makes; a name the rules miss because of the
numbering is said to be one.

TF1 partitioned variables (``name/part_0``, ``name/part_1``) are one variable
under their full name and shape, as the checkpoint stores them.
"""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np
import tensorflow as tf

from equivtool._base.tree import flatten_tensors
from equivtool._platform.graph_building import fast_graph_building
from equivtool._platform.tf_internals import keras_layer_name_state, save_slice_info
from equivtool.variables import VariableInfo, VariableSet
from equivtool.variables import attention as _attention

__all__ = ["VariableMapping", "map_variables", "mapping_rules", "resolve", "TRANSFORMS"]

#: The transforms a pair may declare (TF1 value -> TF2 value).
TRANSFORMS = ("transpose", "reshape")

# Last name components that mean the same thing in TF1 (slim, tf.compat.v1.layers,
# get_variable) and tf-keras.
_ROLES = (
    ("kernel", "weights", "w", "kernel_weights"),
    ("depthwise_kernel", "depthwise_weights", "depthwise_filter"),
    ("pointwise_kernel", "pointwise_weights", "pointwise_filter"),
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
    #: ``(TF1 names, TF2 names, why)``: variables no transform can map (a fused LSTM kernel).
    refused: tuple = ()
    #: ``(TF1 name, "transpose" | "reshape")``: the pairs whose TF1 value is transformed to the TF2 shape.
    transforms: tuple = ()
    #: Every variable's shape, by name, in creation order (what :meth:`resolve` checks).
    tf1_shapes: dict = field(default_factory=dict, compare=False, repr=False)
    tf2_shapes: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def complete(self) -> bool:
        """Every variable on both sides mapped exactly once."""
        return not (self.unmapped_tf1 or self.unmapped_tf2 or self.ambiguous or self.refused)

    def resolve(self, pairs: "Mapping[str, Any]") -> "VariableMapping":
        """This mapping with ``pairs`` (``{tf1_name: tf2_name}``, or
        ``{tf1_name: (tf2_name, "transpose" | "reshape")}``) decided by hand.

        A TF1 name given here replaces its proposed pair; a TF2 name taken here
        from another TF1 name leaves that one unmapped. The rules are made anew
        and checked. ``ValueError`` names a name neither side has, a TF2 name
        given twice, or a shape the transform does not give.
        """
        return resolve(self, pairs)

    def renamer(self) -> "MappingRenamer":
        """The rules as the callable ``check_equivalence`` and ``convert_checkpoint``
        use, carrying the declared transforms."""
        tf1_of = {tf1: tf2 for tf1, tf2 in self.pairs.items()}
        shapes = {tf1: (kind, tuple(self.tf1_shapes[tf1]), tuple(self.tf2_shapes[tf1_of[tf1]]))
                  for tf1, kind in self.transforms}
        return MappingRenamer(tuple(self.rules), shapes, tuple(self.pairs.values()))

    def tf2_to_tf1(self) -> dict:
        return {tf2: tf1 for tf1, tf2 in self.pairs.items()}

    def problems(self) -> list[str]:
        """One line per unmapped or ambiguous variable (empty when complete)."""
        lines = [f"TF1 variable {n!r} has no TF2 counterpart" for n in self.unmapped_tf1]
        lines += [f"TF2 variable {n!r} has no TF1 counterpart" for n in self.unmapped_tf2]
        lines += [f"ambiguous ({what}): TF1 {list(tf1)} against TF2 {list(tf2)}"
                  for what, tf1, tf2 in self.ambiguous]
        lines += [f"refused: TF1 {list(tf1)} against TF2 {list(tf2)}: {why}" for tf1, tf2, why in self.refused]
        return lines

    def suggestions(self) -> dict:
        """``{tf1_name: (tf2_name, transform)}`` for unmapped variables that one
        declared transform would pair, one to one: a TF2 shape that is the TF1
        shape reversed (``"transpose"``), or the same role and element count
        (``"reshape"``). Suggested in :meth:`resolve_call`, never applied unasked."""
        found = {}
        for tf1 in self.unmapped_tf1:
            shape = tuple(self.tf1_shapes.get(tf1, ()))
            candidates = []
            for tf2 in self.unmapped_tf2:
                other = tuple(self.tf2_shapes.get(tf2, ()))
                if len(shape) == 2 and shape[0] != shape[1] and other == shape[::-1]:
                    candidates.append((tf2, "transpose"))
                elif other != shape and _role(tf1) == _role(tf2) and shape and other \
                        and int(np.prod(shape)) == int(np.prod(other)):
                    candidates.append((tf2, "reshape"))
            if len(candidates) == 1:
                found[tf1] = candidates[0]
        taken = [tf2 for tf2, _ in found.values()]
        return {a: b for a, b in found.items() if taken.count(b[0]) == 1}

    def resolve_call(self) -> str:
        """The :meth:`resolve` call that completes the ambiguous groups, filled in
        with their names in creation order, and pairs the :meth:`suggestions`
        (the user checks each pair)."""
        items = [f"{a!r}: {b!r}" for _, tf1, tf2 in self.ambiguous for a, b in zip(tf1, tf2)]
        items += [f"{a!r}: ???" for _, tf1, tf2 in self.ambiguous for a in tf1[len(tf2):]]
        items += [f"{a!r}: {b!r}" for a, b in self.suggestions().items()]
        return "mapping = mapping.resolve({" + ", ".join(items) + "})"

    def require_complete(self, argument: str) -> None:
        """Raise ``ValueError`` naming every unmapped, ambiguous and refused
        variable; for ambiguous ones, with the :meth:`resolve` call to complete them."""
        problems = self.problems()
        if problems:
            advice = ("complete the ambiguous pairs and declare the transforms that fit (check each one: a "
                      f"swap of same-shape layers is not caught by shape):\n  {self.resolve_call()}\n"
                      if self.ambiguous or self.suggestions() else "")
            raise ValueError(f"{argument}: the variable mapping is incomplete ({len(problems)} problems), so "
                             "the weights cannot be aligned; nothing was run:\n  " + "\n  ".join(problems)
                             + f"\n{advice}pass the completed mapping as {argument}= "
                             "(mapping.resolve({tf1_name: tf2_name}) maps any pair by hand)")

    def __str__(self) -> str:
        lines = [f"# {len(self.pairs)} variables mapped"
                 + ("" if self.complete else f"; {len(self.problems())} problems (see below)"),
                 "rename = ["]
        order = set(self.by_order)
        tf2_of = dict(self.pairs)
        exact = set(self.exact)
        transforms = dict(self.transforms)
        for (pattern, replacement), tf1 in zip(self.rules, [t for t, u in self.pairs.items() if t != u]):
            comments = ["same shape as others: paired by creation order"] if tf1 in order else []
            if tf1 in transforms:
                comments.append(f"{transforms[tf1]} (declared)")
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


def to_tf2(kind: str, value: np.ndarray, tf2_shape) -> np.ndarray:
    """A TF1 value in the TF2 layout: ``"transpose"`` reverses its axes,
    ``"reshape"`` keeps its element order in the TF2 shape."""
    value = np.asarray(value)
    return np.transpose(value) if kind == "transpose" else np.reshape(value, tuple(tf2_shape))


def to_tf1(kind: str, value: np.ndarray, tf1_shape) -> np.ndarray:
    """The inverse of :func:`to_tf2`: a TF2 value (or gradient) in the TF1 layout."""
    value = np.asarray(value)
    return np.transpose(value) if kind == "transpose" else np.reshape(value, tuple(tf1_shape))


def _transform_gives(kind: str | None, tf1_shape, tf2_shape) -> bool:
    tf1_shape, tf2_shape = tuple(tf1_shape), tuple(tf2_shape)
    if kind is None:
        return tf1_shape == tf2_shape
    if kind == "transpose":
        return tf1_shape[::-1] == tf2_shape
    return int(np.prod(tf1_shape)) == int(np.prod(tf2_shape))


class MappingRenamer:
    """A :class:`VariableMapping`'s ``rename=`` rules as a callable (TF2 name ->
    TF1 name, a TF1 name unchanged), with the declared transforms:
    ``transforms[tf1_name] = (kind, TF1 shape, TF2 shape)``. Picklable (workers)."""

    def __init__(self, rules: tuple, transforms: dict, tf2_names: tuple = ()):
        self.rules = tuple(rules)
        self.transforms = dict(transforms)
        self.tf2_names = tuple(tf2_names)
        self._apply = None

    def __getstate__(self):
        return {"rules": self.rules, "transforms": self.transforms, "tf2_names": self.tf2_names}

    def __setstate__(self, state):
        self.__init__(state["rules"], state["transforms"], state["tf2_names"])

    def __call__(self, name: str) -> str:
        if self._apply is None:
            self._apply = _apply(self.rules)
        return self._apply(name)

    def tf1_value(self, key: str, value):
        """A TF2 variable's (or gradient's) value under ``key`` in the TF1 layout."""
        entry = self.transforms.get(key)
        return value if entry is None else to_tf1(entry[0], value, entry[1])

    def tf2_value(self, key: str, value):
        """A TF1 value for ``key`` in the TF2 variable's layout."""
        entry = self.transforms.get(key)
        return value if entry is None else to_tf2(entry[0], value, entry[2])

    def tf1_shape(self, key: str, tf2_shape) -> tuple:
        entry = self.transforms.get(key)
        return tuple(tf2_shape) if entry is None else entry[1]


def tf1_value(renamer, key: str, value):
    """``value`` (read from a TF2 variable under ``key``) in the TF1 layout: the
    inverse of a declared transform, or ``value`` itself."""
    return renamer.tf1_value(key, value) if isinstance(renamer, MappingRenamer) else value


def tf2_value(renamer, key: str, value):
    """A TF1-layout ``value`` for the TF2 variable under ``key``."""
    return renamer.tf2_value(key, value) if isinstance(renamer, MappingRenamer) else value


def renumbering_hint(unmapped_tf2: "list[str]", renamer) -> str | None:
    """A sentence when TF2 names the mapping's rules missed are its own names
    numbered otherwise by Keras (``dense_2/kernel`` where the mapping saw
    ``dense/kernel``): the layer was made outside :func:`fresh_layer_numbering`."""
    known = getattr(renamer, "tf2_names", ())
    if not known or not unmapped_tf2:
        return None
    canonical = {_tolerant(n): n for n in known}
    seen = [(n, canonical[_tolerant(n)]) for n in unmapped_tf2 if _tolerant(n) in canonical]
    if not seen:
        return None
    here, there = seen[0]
    return (f"layer renumbering: {len(seen)} of these are the mapping's variables numbered otherwise by Keras "
            f"({here!r} here, {there!r} when the mapping was made): Keras numbers auto-named layers per "
            "process; pass a zero-argument factory (equivtool then makes the layer with fresh numbering, as "
            "map_variables did) or give the layers names")


#: How :func:`native_rewrite_hint` tells a check's caller to pair variables by role.
MAP_FOR_CHECK = ("mapping = equivtool.map_variables(tf1_fn, make_layer, inputs), then "
                 "check_equivalence(..., rename=mapping) (on the command line: equivtool check ... --map)")


def native_rewrite_hint(missing: "list[str]", extra: "list[str]", matched: int,
                        remedy: str = MAP_FOR_CHECK) -> str | None:
    """A sentence when most names found no counterpart on either side, the mark
    of a native rewrite (its own layer names) checked without a mapping:
    ``missing``: TF1 names without a TF2 counterpart, ``extra``: the reverse."""
    if not missing or not extra or matched >= min(len(missing), len(extra)):
        return None
    return (f"names differ: {len(missing)} TF1 and {len(extra)} TF2 variables have no counterpart by name "
            f"({missing[0]!r} against {extra[0]!r}), as in a native rewrite that names its layers its own way: "
            f"pair them by role and structure with {remedy}")


def resolve(mapping: VariableMapping, pairs: "Mapping[str, Any]") -> VariableMapping:
    """:meth:`VariableMapping.resolve` (see there)."""
    if not isinstance(mapping, VariableMapping):
        raise TypeError(f"mapping: expected the VariableMapping map_variables returned, got {type(mapping).__name__}")
    if not isinstance(pairs, Mapping) or not pairs:
        raise TypeError("pairs: expected a non-empty {tf1_name: tf2_name or (tf2_name, 'transpose' | "
                        f"'reshape')}} dict, got {pairs!r}")
    tf1_shapes, tf2_shapes = mapping.tf1_shapes, mapping.tf2_shapes
    if not tf1_shapes or not tf2_shapes:
        raise ValueError("mapping: it carries no variable shapes (made by hand?); use the mapping "
                         "map_variables returned")
    decided, kinds = {}, {}
    for tf1, value in pairs.items():
        tf2, kind = None, None
        if isinstance(value, str):
            tf2 = value
        elif isinstance(value, (tuple, list)) and len(value) == 2:
            tf2, kind = value
        if not isinstance(tf1, str) or not isinstance(tf2, str) or kind not in (None,) + TRANSFORMS:
            raise TypeError(f"pairs[{tf1!r}]: expected a TF2 name or (TF2 name, 'transpose' | 'reshape'), "
                            f"got {value!r}")
        if tf1 not in tf1_shapes:
            raise ValueError(f"pairs: {tf1!r} is not a TF1 variable of this mapping (TF1 names: "
                             f"{list(tf1_shapes)[:6]}{'...' if len(tf1_shapes) > 6 else ''})")
        if tf2 not in tf2_shapes:
            raise ValueError(f"pairs[{tf1!r}]: {tf2!r} is not a TF2 variable of this mapping (TF2 names: "
                             f"{list(tf2_shapes)[:6]}{'...' if len(tf2_shapes) > 6 else ''})")
        if tf2 in decided.values():
            raise ValueError(f"pairs[{tf1!r}]: TF2 variable {tf2!r} is given for two TF1 variables")
        if not _transform_gives(kind, tf1_shapes[tf1], tf2_shapes[tf2]):
            how = {None: "the same shape", "transpose": "the reversed shape",
                   "reshape": "as many elements"}[kind]
            hint = (" (declare (tf2_name, 'transpose') or 'reshape')" if kind is None else "")
            raise ValueError(f"pairs[{tf1!r}]: TF1 shape {list(tf1_shapes[tf1])} and TF2 {tf2!r} shape "
                             f"{list(tf2_shapes[tf2])}: {kind or 'a pair'} needs {how}{hint}")
        decided[tf1] = tf2
        if kind is not None:
            kinds[tf1] = kind
    taken = set(decided.values())
    kept = {a: b for a, b in mapping.pairs.items() if a not in decided and b not in taken}
    kept.update(decided)
    ordered = OrderedDict((n, kept[n]) for n in tf1_shapes if n in kept)
    mapped_tf2 = set(ordered.values())
    ambiguous = []
    for what, tf1, tf2 in mapping.ambiguous:
        rest1 = tuple(n for n in tf1 if n not in ordered)
        rest2 = tuple(n for n in tf2 if n not in mapped_tf2)
        if rest1 and rest2:
            ambiguous.append((what, rest1, rest2))
    refused = tuple(r for r in mapping.refused if not (set(r[0]) & set(ordered) or set(r[1]) & mapped_tf2))
    in_other = {n for _, a, b in ambiguous for n in a + b} | {n for a, b, _ in refused for n in a + b}
    transforms = tuple((a, k) for a, k in mapping.transforms if a not in decided) + tuple(kinds.items())
    rules, exact = mapping_rules(ordered, list(tf1_shapes), list(tf2_shapes))
    return replace(mapping, pairs=ordered,
                   unmapped_tf1=tuple(n for n in tf1_shapes if n not in ordered and n not in in_other),
                   unmapped_tf2=tuple(n for n in tf2_shapes if n not in mapped_tf2 and n not in in_other),
                   ambiguous=tuple(ambiguous), rules=rules, exact=exact, refused=refused,
                   by_order=tuple(n for n in mapping.by_order if n in ordered and n not in decided),
                   transforms=tuple((a, k) for a, k in transforms if a in ordered))


def _lstm_refusals(tf1_by_name, tf2_by_name, pairs: dict) -> list:
    """``(TF1 names, TF2 names, why)`` for each Keras LSTM (split ``kernel`` and
    ``recurrent_kernel``) whose TF1 counterpart is a fused cell kernel
    ([inputs + units, 4 * units]): its gates are ordered i, j, f, o in TF1's
    ``LSTMCell`` and i, f, c, o in Keras, which no transpose or reshape expresses."""
    refusals = []
    mapped_tf2 = set(pairs.values())
    for name, info in tf2_by_name.items():
        scope, _, leaf = name.rpartition("/")
        if leaf != "recurrent_kernel" or name in mapped_tf2 or len(info.shape) != 2:
            continue
        kernel, bias = tf2_by_name.get(f"{scope}/kernel"), tf2_by_name.get(f"{scope}/bias")
        if kernel is None or len(kernel.shape) != 2:
            continue
        units4 = info.shape[1]
        fused = [n for n, i in tf1_by_name.items() if n not in pairs and len(i.shape) == 2
                 and tuple(i.shape) == (kernel.shape[0] + info.shape[0], units4)]
        if len(fused) != 1:
            continue
        tf1_scope = fused[0].rpartition("/")[0]
        tf1_names = [fused[0]] + [n for n in tf1_by_name if n == f"{tf1_scope}/bias"]
        tf2_names = [kernel.name, name] + ([bias.name] if bias is not None else [])
        refusals.append((tuple(tf1_names), tuple(tf2_names),
                         f"a fused LSTM kernel {list(tf1_by_name[fused[0]].shape)} (inputs + units rows, gates "
                         f"i, j, f, o: TF1 LSTMCell) against a split kernel {list(kernel.shape)} and "
                         f"recurrent_kernel {list(info.shape)} (gates i, f, c, o: Keras LSTM): no "
                         "transpose or reshape expresses it (the rows split and the gate blocks reorder); "
                         "convert these by hand or keep the TF1 cell (tf.compat.v1.nn.rnn_cell.LSTMCell)"))
    return refusals


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
    refused = _lstm_refusals(tf1_by_name, tf2_by_name, pairs)
    held = {n for a, b, _ in refused for n in a + b}
    attention, reshaped = _attention.attention_pairs(tf1_by_name, tf2_by_name,
                                                     set(pairs) | set(pairs.values()) | held)
    split_refusals = _attention.split_refusals(attention, reshaped, tf1_by_name, tf2_by_name, dict(tf1.head_splits))
    for tf1_names, _, _ in split_refusals:  # another head split: no declared transform expresses it
        for name in tf1_names:
            attention.pop(name, None)
            reshaped.pop(name, None)
    refused += split_refusals
    held |= {n for a, b, _ in split_refusals for n in a + b}
    pairs.update(attention)
    by_order, ambiguous = [], []
    # By signature and role first; what is left, by signature alone (a
    # ``table`` of its own shape is the ``embeddings``), and that alone only one to one.
    for keyed in (lambda info: _signature(info) + (_role(info.name),), _signature):
        groups: "OrderedDict[tuple, tuple]" = OrderedDict()
        taken = set(pairs.values())
        for name, info in tf1_by_name.items():
            if name not in pairs and name not in held:
                groups.setdefault(keyed(info), ([], []))[0].append(name)
        for name, info in tf2_by_name.items():
            if name not in taken and name not in held:
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
    in_ambiguity = {n for _, a, b in ambiguous for n in a + b} | held
    mapped_tf2 = set(ordered.values())
    unmapped_tf1 = tuple(n for n in tf1_by_name if n not in ordered and n not in in_ambiguity)
    unmapped_tf2 = tuple(n for n in tf2_by_name if n not in mapped_tf2 and n not in in_ambiguity)
    rules, exact = mapping_rules(ordered, tf1_by_name, tf2_by_name)
    return VariableMapping(ordered, unmapped_tf1, unmapped_tf2, tuple(ambiguous), rules, tuple(by_order),
                           exact, tuple(refused), tuple((n, k) for n, k in reshaped.items() if n in ordered),
                           tf1_shapes=OrderedDict((n, tuple(i.shape)) for n, i in tf1_by_name.items()),
                           tf2_shapes=OrderedDict((n, tuple(i.shape)) for n, i in tf2_by_name.items()))


def as_rename(rename: Any, argument: str = "rename"):
    """``rename`` as ``check_equivalence`` and ``convert_checkpoint`` take it: a
    :class:`VariableMapping` becomes its rules (refused when ambiguous or
    incomplete, naming every problem); anything else is returned as it is."""
    if isinstance(rename, VariableMapping):
        rename.require_complete(argument)
        return rename.renamer()
    return rename


# The report's note when a VariableMapping aligns the weights (equivtool.engine.align does it).
ALIGNED = ("weights aligned: every variable starts on both sides from a fixed value of its mapped name and "
           "shape (a native rewrite's initializers draw other numbers than TF1's, so initializers are not "
           "compared; the forward pass's random ops and arithmetic are)")


def aligned_weights(rename: Any) -> str | None:
    """How ``check_equivalence`` aligns the weights for ``rename``: a
    :class:`VariableMapping` (a native rewrite) aligns them (see
    ``equivtool.engine.align``); rules alone do not."""
    if isinstance(rename, VariableMapping):
        return ALIGNED
    return None


@contextlib.contextmanager
def fresh_layer_numbering():
    """Keras layers made in this scope are numbered as in a fresh process
    (``dense``, ``dense_1``...), whatever layers the process made before: the
    names :func:`map_variables` saw, for every layer a factory makes again.
    Keras' counters are given back on exit (exception included), so the
    process's own numbering goes on as if this scope had not run."""
    saved = [(write, read(), empty) for read, write, empty in keras_layer_name_state()]
    try:
        for write, _, empty in saved:
            write(empty())
        yield
    finally:
        for write, value, _ in reversed(saved):
            write(value)


def tf1_graph_variables(tf1_fn: Callable, inputs, training: bool = False) -> VariableSet:
    """Build ``tf1_fn`` in a fresh graph; its global variables, a partitioned
    variable once under its full name and shape."""
    graph = tf.Graph()
    with graph.as_default(), fast_graph_building():
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
        splits = _attention.head_splits(graph)
    return VariableSet(tuple(infos.values()), source="tf1", head_splits=tuple(splits.items()))


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
        with fresh_layer_numbering():
            layer = make_layer(tf2_layer)
            layer(tf.nest.map_structure(tf.convert_to_tensor, inputs), training=training)
    return propose(tf1, VariableSet.from_layer(layer))


def _is_factory(tf2_layer: Any) -> bool:
    """Whether ``tf2_layer`` is a factory (a class or function), not a layer (as :func:`make_layer` tells)."""
    return not (isinstance(tf2_layer, tf.Module) or hasattr(tf2_layer, "variables")
                and not isinstance(tf2_layer, type))
