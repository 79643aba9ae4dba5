"""Aligning a TF1 graph's ops with the ops a TF2 side runs: which ops are compared,
their canonical names (an outer scope stripped only when every op is under it;
uniquified ``_1`` suffixes; branch and loop graphs), and the ordered list of a
forward pass's TF1 ops. Used by a check's localization and by ``compare --localize``.
"""

from __future__ import annotations

import re

import tensorflow as tf

from equivtool._base.graph import ancestors


SKIPPED_TYPES = frozenset({
    "Const", "Placeholder", "PlaceholderWithDefault", "VarHandleOp", "VariableV2", "Variable",
    "ReadVariableOp", "NoOp", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
    "VarIsInitializedOp", "Shape", "ShapeN", "Size", "Rank", "StopGradient", "PyFunc", "EagerPyFunc",
    "PyFuncStateless", "DebugIdentityV2",
    "Fill",  # a constant of a given shape (eager batch norm's implicit gamma of ones)
})
# Ops whose extra outputs are implementation details (batch-norm reserve spaces).
FIRST_OUTPUT_ONLY = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
LIST_LIMIT = 10
WINDOW = 64


def is_float(dtype) -> bool:
    dtype = tf.as_dtype(dtype)
    return dtype.is_floating or dtype.is_complex


def compared_outputs(op_type: str, dtypes) -> list:
    indices = [i for i, d in enumerate(dtypes) if is_float(d)]
    if op_type in FIRST_OUTPUT_ONLY:
        indices = indices[:1]
    return indices


def canonical_scope(components: list, roots: frozenset) -> list:
    """The part of a scope that both sides name alike: what follows the last
    occurrence of the model's outer scope.

    The outer scope appears once or more depending on the side: a graph opens
    ``net/net/...`` where slim re-enters its variable scope, eager execution
    appends a re-entered absolute scope (``net/conv1/net/conv1``), and the Keras
    layer adds its own name in front. Without the outer scope (a model that
    opens none) the first component, the Keras layer's own scope, is dropped.
    """
    last = max((i for i, c in enumerate(components) if c in roots), default=None)
    if last is None:
        return components[1:]
    return components[last + 1:]


# The function graphs of tf.cond / tf.while_loop branches (control flow v2).
BRANCH_GRAPHS = frozenset({"CondBranchFuncGraph", "WhileCondFuncGraph", "WhileBodyFuncGraph"})
CONTROL_FLOW = frozenset({"If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase"})


class Naming:
    """How op names become the keys both sides are aligned on, decided from the
    TF1 side's compared op names.

    A model that opens one outer scope around every op (``net/conv1/...``,
    ``net/logits/...``) has it stripped on both sides, wherever it occurs (:func:`canonical_scope`).
    A model without one (top-level ``conv1/...``, ``conv2/...``, Keras layers
    built in a TF1 graph) keeps its names whole: taking every first component
    for an outer scope would make ``conv1/Conv2D`` and ``conv2/Conv2D`` both
    ``Conv2D``, and a model compared with itself would blame the wrong layer.
    The other side's names lose what comes before the first of the TF1 side's
    top-level scopes (the TF2 layer's own name scope, an exported function's
    ``StatefulPartitionedCall``), compared without uniquifying suffixes.
    """

    def __init__(self, names):
        names = list(names)
        firsts = {name.split("/", 1)[0] for name in names}
        scoped = all("/" in name for name in names)
        self.outer = next(iter(firsts)) if len(firsts) == 1 and scoped else None
        #: the outer scope, as a set for :func:`canonical_scope` (empty without one)
        self.roots = frozenset(firsts) if self.outer is not None else frozenset()
        #: every first name component of the TF1 side (where its ops live)
        self.tops = frozenset(name.split("/", 1)[0] for name in names)
        self._base_tops = frozenset(UNIQUIFIED_SUFFIX.sub("", top) for top in self.tops)

    def tf1_key(self, name: str) -> str:
        components = name.split("/")
        if self.outer is None or len(components) == 1:
            return name
        return "/".join(canonical_scope(components[:-1], self.roots) + components[-1:])

    def in_model(self, name: str) -> bool:
        """Whether a TF2 graph op ``name`` lies inside the model's scopes (an op
        outside every scope, such as a function's output identity, does not)."""
        parts = name.split("/")
        if not self.tops or any(c in self.tops for c in parts):
            return True
        return self.outer is None and len(parts) > 1  # an unscoped TF1 op, under the TF2 layer's scope

    def other_scope(self, parts: list, *, layer_scope: bool) -> list:
        """The other side's scope ``parts`` as the TF1 keys have it; ``layer_scope``:
        the first component is the TF2 layer's own name scope when nothing else
        marks where the model starts."""
        if self.outer is not None:
            return canonical_scope(parts, self.roots) if layer_scope or self.outer in parts else parts
        start = next((i for i, part in enumerate(parts) if UNIQUIFIED_SUFFIX.sub("", part) in self._base_tops),
                     None)
        if start is None:
            return parts[1:] if layer_scope else parts
        return parts[start:]


UNIQUIFIED_SUFFIX = re.compile(r"_\d+$")


def base_scope(scope: str) -> str:
    """``scope`` with each component's uniquifying suffix removed (``x_2/y_1`` -> ``x/y``)."""
    return "/".join(UNIQUIFIED_SUFFIX.sub("", part) for part in scope.split("/"))


# --------------------------------------------------------------------------
# TF1 side: the forward pass's ops
# --------------------------------------------------------------------------

class TF1Op:
    __slots__ = ("index", "op", "name", "key", "scope", "type", "outputs", "matched")

    def __init__(self, index, op, outputs, key):
        self.index = index
        self.op = op
        self.name = op.name
        self.key = key  # the name aligned on (a second pass's "net_1/..." as "net/...")
        self.scope = key.rsplit("/", 1)[0] if "/" in key else ""
        self.type = op.type
        self.outputs = outputs  # indices of compared outputs
        self.matched = False


def writes_a_variable(op_type: str) -> bool:
    """An op that changes a variable when it runs (fetching it would write)."""
    return op_type.startswith(("Assign", "Scatter", "ResourceScatter", "Apply", "ResourceApply"))


def tf1_forward_ops(graph, outputs) -> tuple:
    """The compared ops among the ancestors of ``outputs``, in creation order,
    and the count of those inside v1 control flow (not fetchable)."""
    roots = [t.op for t in tf.nest.flatten(outputs) if hasattr(t, "op")]
    # A training pass's UPDATE_OPS (batch norm's moving averages) are applied where
    # the TF2 call applies them: their inputs are compared too (a decay slip is
    # found where the decay is used), the writes themselves never fetched.
    # (A pass described by another interpreter names its updates among ``outputs``.)
    updates = graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS) if hasattr(graph, "get_collection") else ()
    roots += [t.op for update in updates for t in getattr(getattr(update, "op", update), "inputs", ())]
    wanted = ancestors(roots)
    result, in_loops = [], 0
    for op in graph.get_operations():  # creation order: a topological order
        if op not in wanted or op.type in SKIPPED_TYPES or writes_a_variable(op.type):
            continue
        if op.type == "Identity" and op.inputs and op.inputs[0].op.type in ("VariableV2", "VarHandleOp"):
            continue
        indices = compared_outputs(op.type, [t.dtype for t in op.outputs])
        if not indices:
            continue
        if op._get_control_flow_context() is not None:  # inside a v1 while loop or cond
            in_loops += 1
            continue
        if not all(graph.is_fetchable(op.outputs[i]) for i in indices):
            continue
        result.append((op, indices))
    # A second pass built in the same graph lives under a uniquified outer scope
    # ("net_1/...") while the TF2 layer's ops are named "net/...": align on "net".
    other_roots = {op.name.split("/", 1)[0] for op in graph.get_operations() if op not in wanted}
    renamed = {}
    for op, _ in result:
        root = op.name.split("/", 1)[0]
        base = re.sub(r"_\d+$", "", root)
        if "/" in op.name and base != root and base in other_roots:
            renamed[root] = base
    names = []
    for op, _ in result:
        root, _, rest = op.name.partition("/")
        names.append(f"{renamed[root]}/{rest}" if root in renamed and rest else op.name)
    naming = Naming(names)
    ops = [TF1Op(i, op, indices, naming.tf1_key(name)) for i, ((op, indices), name) in enumerate(zip(result, names))]
    return ops, in_loops, naming


# --------------------------------------------------------------------------
# Alignment and comparison in order
# --------------------------------------------------------------------------
