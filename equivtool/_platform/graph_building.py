"""TF1 graphs built at the speed of their ops, not of a quadratic hash.

Every ``add_weight`` of a TF1-style layer (tf-slim's, ``tf.compat.v1.layers``,
tf-keras' legacy layers) builds ``set(tf.compat.v1.global_variables())``: a
hash of every variable the graph holds so far, so a graph's build hashes its
variables N^2/2 times. A variable's ``__hash__`` asks
``ops.executing_eagerly_outside_functions()``, which walks the context stack and
enters the outermost graph to find the answer. For Inception-ResNet-v2's
1114 variables that is most of the TF1 graph's build (17.4 s against 7.8 s
with the shortcut below, on the same machine in one run).

:func:`fast_graph_building` answers that question directly in the one case a
TF1 graph's build asks it: not executing eagerly, with the innermost entry of
the context-switch stack a graph (its ``as_default``) that builds no function.
TensorFlow would find that entry first and enter it: False. Every other case
(eager, inside a ``tf.function`` or ``init_scope``, eager mode entered inside a
graph and graph mode inside that) goes to TensorFlow's own function.
``tests/test_graph_building.py`` compares the two answers in every nesting of
graphs, functions, eager and graph modes and init scopes it draws.
"""

from __future__ import annotations

import contextlib
import threading

from equivtool._platform import tf_internals as _tfi

_lock = threading.Lock()
_depth = 0
_original = None


def shortcut():
    """``executing_eagerly_outside_functions`` with the plain-graph case answered at once."""
    ctx = _tfi.context.context()  # (called N^2/2 times a build: one lookup of each)
    if not ctx.executing_eagerly():
        switches = ctx.context_switches.stack
        if switches:
            entry = switches[-1]
            if not entry.is_building_function and isinstance(getattr(entry.enter_context_fn, "__self__", None),
                                                             _tfi.ops.Graph):
                return False  # the innermost switch enters a graph that builds no function
    return _original()


@contextlib.contextmanager
def fast_graph_building():
    """Inside: ``ops.executing_eagerly_outside_functions`` is :func:`shortcut` (any thread:
    the answers are TensorFlow's). Nests; the last exit puts TensorFlow's function back,
    on every exit path."""
    global _depth, _original
    ops = _tfi.ops
    with _lock:
        if _depth == 0:
            _original = ops.executing_eagerly_outside_functions
            ops.executing_eagerly_outside_functions = shortcut
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                ops.executing_eagerly_outside_functions = _original
