"""Every private TensorFlow and tf-keras symbol equivtool uses, reached through this one module.

equivtool patches and reads a few things no public API offers (the op-seed
function the random tool replaces, the eager context's seed and generator,
tf-keras' seed source, op callbacks, a dataset's graph...). They can move or
vanish in any TensorFlow release, so they are all named here, and
``tests/test_tf_internals.py`` resolves every one: after an upgrade, that test
says what broke and this is the one file to fix.

Symbols (:data:`SYMBOLS`) are ``"module:attribute"`` references resolved with
:func:`pkgutil.resolve_name` on first access (``from equivtool._platform.tf_internals
import context``), so importing this module imports nothing. Private
*attributes* of public objects are reached through the small functions below.
"""

from __future__ import annotations

import pkgutil
import sys
from typing import Any

#: name -> ``"module"`` or ``"module:attribute"``, and who uses it.
SYMBOLS: dict[str, str] = {
    # seeding (the random tool), determinism (the audit)
    "context": "tensorflow.python.eager.context",
    # seeding: the graph whose seed a scope saves and restores; equivtool.ops: gradient registration;
    # _platform/graph_building.py: executing_eagerly_outside_functions answered at once in a plain graph
    "ops": "tensorflow.python.framework.ops",
    # seeding: get_seed is replaced during a random-tool scope (a module attribute, patched in place)
    "random_seed": "tensorflow.python.framework.random_seed",
    # seeding: constant mode's eager random ops served by their stateless twins (seeding._fresh_kernels)
    "random_ops": "tensorflow.python.ops.random_ops",
    # seeding: num_random_ops mode's kernel-cache clear, made at the first draw no twin serves
    "pywrap_tfe": "tensorflow.python.pywrap_tfe",
    "gen_random_ops": "tensorflow.python.ops.gen_random_ops",
    "gen_stateless_random_ops_v2": "tensorflow.python.ops.gen_stateless_random_ops_v2",
    # seeding: static shapes of random ops in the trace
    "tensor_util": "tensorflow.python.framework.tensor_util",
    # variables: creates_variables_once keeps the method's signature visible to Keras
    "tf_decorator": "tensorflow.python.util.tf_decorator",
    # _platform/graph_rewrites.py: Grappler's numerics-changing passes switched off (TF1 session, TF2 function calls)
    "RewriterConfig": "tensorflow.core.protobuf.rewriter_config_pb2:RewriterConfig",
    # _platform/graph_rewrites.py: each thread's function-call options and the run metadata of function calls
    "EagerContext": "tensorflow.python.eager.context:Context",
    # _platform/graph_rewrites.py: whether oneDNN is on (the report header, doctor)
    "util_port": "tensorflow.python.util._pywrap_util_port",
    # determinism: sessions found in the audited state, datasets' graphs, op recording; localize: op taps
    "BaseSession": "tensorflow.python.client.session:BaseSession",
    "GraphDef": "tensorflow.core.framework.graph_pb2:GraphDef",
    # _compat: write_graph as text, repaired on TensorFlow 2.16-2.20 with protobuf 7
    "graph_io": "tensorflow.python.framework.graph_io",
    "op_callbacks": "tensorflow.python.framework.op_callbacks",
    "is_op_determinism_enabled": "tensorflow.python.framework.config:is_op_determinism_enabled",
    "ExternalStatePolicy": "tensorflow.python.data.ops.options:ExternalStatePolicy",
    "Trackable": "tensorflow:__internal__.tracking.Trackable",
    # equivtool.ops: the swap's routes; whether a graph is compiled by XLA
    "nn": "tensorflow.python.ops.nn",
    "control_flow_util": "tensorflow.python.ops.control_flow_util",
    "nn_ops": "tensorflow.python.ops.nn_ops",
    # equivtool.ops: whether a gradient tape records the logits (the fused training-step path)
    "record": "tensorflow.python.eager.record",
    # exported: unregistered ops found before loading; a TF2 signature's bodies inlined into one graph
    # (Grappler's function inlining, the first step of convert_variables_to_constants_v2)
    "op_def_registry": "tensorflow.python.framework.op_def_registry",
    "inline_graph_optimization":
        "tensorflow.python.framework.convert_to_constants:_run_inline_graph_optimization",
    # exported --localize: a TF1 session's nodes dumped in one run (tfdbg v1's file watches)
    "debug_utils": "tensorflow.python.debug.lib.debug_utils",
    "debug_data": "tensorflow.python.debug.lib.debug_data",
    "TensorProto": "tensorflow.core.framework.tensor_pb2:TensorProto",
    "SavedModel": "tensorflow.core.protobuf.saved_model_pb2:SavedModel",
}

_XENT_NAMES = ("sparse_softmax_cross_entropy_with_logits", "sparse_softmax_cross_entropy_with_logits_v2",
               "softmax_cross_entropy_with_logits", "softmax_cross_entropy_with_logits_v2")

#: Attributes equivtool reads on the symbols above (the test checks each one).
ATTRIBUTES: dict[str, tuple] = {
    "context": ("context", "executing_eagerly", "set_global_seed"),  # + Context().context_switches.stack
    "control_flow_util": ("GraphOrParentsInXlaContext",),
    "record": ("should_record_backprop",),
    "ops": ("get_default_graph", "RegisterGradient", "executing_eagerly_outside_functions"),
    "random_seed": ("get_seed", "set_seed"),
    "random_ops": ("random_uniform", "random_normal", "truncated_normal"),
    "gen_random_ops": ("random_uniform", "random_uniform_int", "random_standard_normal", "truncated_normal"),
    "gen_stateless_random_ops_v2": ("stateless_random_uniform_v2", "stateless_random_uniform_int_v2",
                                    "stateless_random_normal_v2", "stateless_truncated_normal_v2"),
    "tensor_util": ("constant_value",),
    "tf_decorator": ("make_decorator",),
    "RewriterConfig": ("OFF",),
    "EagerContext": ("function_call_options", "enable_run_metadata", "export_run_metadata",
                     "disable_run_metadata"),
    "util_port": ("IsMklEnabled",),
    "debug_utils": ("watch_graph",),
    "debug_data": ("DebugDumpDir",),
    "op_callbacks": ("add_op_callback", "remove_op_callback", "should_invoke_op_callbacks"),
    "ExternalStatePolicy": ("IGNORE",),
    "nn": _XENT_NAMES,
    "nn_ops": _XENT_NAMES + ("softmax_cross_entropy_with_logits_v2_helper",),
}

#: tf-keras' seed source, patched by the random tool (optional: absent without tf-keras).
KERAS_BACKEND = "tf_keras.src.backend"
#: Keras 3's TensorFlow-backend random functions, replaced by the random tool (optional: absent
#: without Keras 3, or before it is imported).
KERAS3_TF_RANDOM = "keras.src.backend.tensorflow.random"
#: Keras 3's TensorFlow-backend variable class, whose _initialize weight alignment wraps.
KERAS3_TF_CORE = "keras.src.backend.tensorflow.core"
#: Keras 3's "am I inside a shape-inference (stateless) run" query.
KERAS3_STATELESS_SCOPE = "keras.src.backend.common.stateless_scope"
#: Where tf-keras moved the legacy layers tf-slim imports (equivtool._platform.env aliases the old name).
KERAS_LEGACY_TF_LAYERS = "tf_keras.src.legacy_tf_layers"


def __getattr__(name: str) -> Any:
    target = SYMBOLS.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = pkgutil.resolve_name(target)
    globals()[name] = value
    return value


def resolve(name: str) -> Any:
    """The symbol registered as ``name``; the error names it and where it was looked for."""
    try:
        return __getattr__(name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ImportError(f"TensorFlow internal {name!r} ({SYMBOLS.get(name)}) is not available in this "
                          f"TensorFlow version: {exc}") from exc


# --------------------------------------------------------------------------
# Private attributes of public objects
# --------------------------------------------------------------------------

def save_slice_info(variable):
    """A TF1 partitioned variable part's ``(full_name, full_shape, var_offset,
    var_shape)`` holder (``Variable._save_slice_info``), or None for a whole
    variable. checkpoints: a partition is mapped, compared and converted whole."""
    return getattr(variable, "_save_slice_info", None)


def eager_global_seed():
    """The eager context's global seed (``tf.random.set_seed``'s value, or None)."""
    return resolve("context").context()._seed


def eager_rng(default=None):
    """The eager context's Python ``random.Random`` that draws op seeds, or ``default``."""
    return getattr(resolve("context").context(), "_rng", default)


def set_eager_rng(rng) -> None:
    resolve("context").context()._rng = rng


def set_eager_seed_keeping_kernels(seed: int) -> None:
    """``tf.random.set_seed(seed)`` eagerly (the context's seed and the generator of
    its op seeds) without ``Context._set_global_seed``'s kernel-cache clear."""
    import random

    ctx = resolve("context").context()
    ctx._seed = seed
    ctx._rng = random.Random(int(seed))


def clear_eager_kernel_cache() -> None:
    """What ``tf.random.set_seed`` clears eagerly besides setting the seed: the eager
    context's kernel cache (each stateful random kernel's state with it)."""
    ctx = resolve("context").context()
    if ctx._context_handle is not None:
        resolve("pywrap_tfe").TFE_ContextClearCaches(ctx._context_handle)


def keras_seed_generator():
    """tf-keras' seed-source holder (``backend._SEED_GENERATOR``), or None without tf-keras."""
    try:
        backend = pkgutil.resolve_name(KERAS_BACKEND)
    except ImportError:
        return None
    return getattr(backend, "_SEED_GENERATOR", None)


def keras3_random_backend():
    """Keras 3's TensorFlow-backend random module, or None when Keras 3 (with the
    TensorFlow backend) has not been imported: nothing can have drawn from it yet."""
    return sys.modules.get(KERAS3_TF_RANDOM)


def keras3_variable_class():
    """Keras 3's TensorFlow-backend ``Variable`` class (its ``_initialize(value)``
    creates the ``tf.Variable`` it wraps), or None when Keras 3 is not imported."""
    module = sys.modules.get(KERAS3_TF_CORE)
    return getattr(module, "Variable", None)


def keras3_in_stateless_scope() -> bool:
    """True inside Keras 3's stateless scope: the symbolic run by which a Keras 3
    model infers shapes on its first call, whose values are thrown away."""
    module = sys.modules.get(KERAS3_STATELESS_SCOPE)
    return module is not None and bool(module.in_stateless_scope())


def variable_creator_slots(graph) -> dict:
    """The calling thread's slot dict of ``graph``'s thread-local variable-creator stack.

    The stack (``"_variable_creator_stack"``, ``(priority, creator)`` pairs) is
    what ``tf.variable_creator_scope`` edits. ``Graph._thread_local`` is a
    ``threading.local``, so its ``__dict__`` is this thread's own dict: kept,
    it lets another thread restore the stack this thread sees.
    """
    graph._variable_creator_stack  # creates this thread's empty stack if missing
    return graph._thread_local.__dict__


def serialized_dataset_graph(dataset):
    """A ``tf.data.Dataset``'s graph as a serialized ``GraphDef`` (external state ignored)."""
    policy = resolve("ExternalStatePolicy").IGNORE
    return dataset._as_serialized_graph(external_state_policy=policy)


def iterator_dataset(iterator):
    """The dataset an ``iter(dataset)`` iterator reads, or None for other objects."""
    return getattr(iterator, "_dataset", None)


def tensor_equality_enabled() -> bool:
    """Whether TF2's element-wise ``==`` for tensors and variables is on
    (``tf.compat.v1.enable/disable_tensor_equality`` set it). Unknown on a
    TensorFlow without the switch: then True, the TF2 default."""
    import tensorflow as tf
    return bool(getattr(tf.Tensor, "_USE_EQUALITY", True))


def build_legacy_optimizer(optimizer, variables) -> bool:
    """Create a legacy Keras optimizer's slot variables now; False if it has no such method."""
    create = getattr(optimizer, "_create_all_weights", None)
    if create is None:
        return False
    create(variables)
    return True


def keras_layer_name_state() -> list:
    """Keras' per-process layer-name counters, as ``(read, write)`` pairs: tf-keras'
    ``backend.PER_GRAPH_OBJECT_NAME_UIDS[default graph]`` and ``OBSERVED_NAMES``,
    Keras 3's ``object_name_uids`` global attribute (each only when installed).
    ``read()`` returns what to give back to ``write`` (``None``: there was none);
    ``empty()`` is a fresh process's value."""
    import collections
    import importlib
    import tensorflow as tf
    state = []
    try:
        backend = importlib.import_module(KERAS_BACKEND)
    except ImportError:
        backend = None
    if backend is not None:
        uids, observed, graph = backend.PER_GRAPH_OBJECT_NAME_UIDS, backend.OBSERVED_NAMES, \
            tf.compat.v1.get_default_graph()

        def write_uids(value):
            if value is None:
                uids.pop(graph, None)
            else:
                uids[graph] = value

        def write_observed(value):
            observed.clear()
            observed.update(value or ())
        state += [(lambda: uids.get(graph), write_uids, lambda: collections.defaultdict(int)),
                  (lambda: set(observed), write_observed, set)]
    try:
        global_state = importlib.import_module("keras.src.backend.common.global_state")
    except ImportError:
        global_state = None
    if global_state is not None:
        state.append((lambda: global_state.get_global_attribute("object_name_uids"),
                      lambda value: global_state.set_global_attribute("object_name_uids", value),
                      lambda: collections.defaultdict(int)))
    return state
