"""Random numbers that agree between a TF1 graph/session and TF2 eager code.

Why this exists
---------------
Step 4 of a TF1 -> TF2 migration check compares numbers produced by code that
draws random numbers: variable initializers, dropout, noise. TensorFlow derives
the seeds of a stateful random op (``tf.random.uniform`` and friends) from a
global seed and a per-op seed, and the per-op seed is assigned differently in a
``tf.Graph`` (a counter per graph) and in eager execution (a per-context random
stream). The same program therefore draws different numbers in the two worlds,
even with ``tf.random.set_seed``.

``DeterministicRandomTestTool`` replaces, inside ``scope()``, the one function
every stateful random op asks for its seeds
(``tensorflow.python.framework.random_seed.get_seed``) with one that answers
from the tool's own counter, ignoring graph and context. It is a clone of
tf-keras' ``tf.compat.v1.keras.utils.DeterministicRandomTestTool``: for the
same program it hands out the same seeds and touches the same global seed, so
the numbers are bitwise identical to the original's. It then goes further: it
restores everything on exit, refuses overlapping scopes, covers tf-keras'
stateless initializers, and records a trace of the random ops it seeded.

The two modes
-------------
``"constant"``
    Every random op gets the same seeds ``(seed, operation_seed)``. Two ops
    with the same distribution and shape draw the same values. Least sensitive;
    robust to re-ordering.
``"num_random_ops"``
    The operation seed is the number of random ops seeded so far in the tool's
    scopes (0, 1, 2, ...), so values depend on program order and two weights
    never share numbers by accident. Set ``operation_seed`` to re-align a
    program that creates ops in another order. Handing out the same operation
    seed twice raises ``ValueError``.

What a scope covers
-------------------
Covered (the same as the original):
    every op whose Python wrapper calls ``random_seed.get_seed``:
    ``tf.random.uniform/normal/truncated_normal``, ``tf.random.shuffle``,
    ``tf.random.categorical``, gamma/poisson, ``tf.nn.dropout``, the
    ``tf.compat.v1`` initializers (glorot, truncated normal, variance scaling
    ...) used by ``get_variable``, tf-slim and ``tf.compat.v1.layers``, the
    dropout of tf-slim and of layers wrapped by ``track_tf1_style_variables``,
    tf-keras layers on their legacy stateful path (``Dropout``), and the seeds
    of ``tf.data`` shuffles. An explicit ``seed=`` argument of such an op is
    ignored inside the scope, as in the original.
Covered in addition:
    tf-keras initializers created without a seed (``GlorotUniform()``,
    ``HeNormal()``, the default of every native tf-keras layer) and tf-keras
    ``RandomGenerator``\\ s in "stateful" mode (``tf.random.Generator`` made by
    tf-keras after ``enable_tf_random_generator``). Since Keras 2.10 these draw
    a seed once per object from ``tf_keras.src.backend._SEED_GENERATOR``, not
    from ``get_seed``, so the original leaves them random. Inside a scope that
    seed comes from the tool: in constant mode it is the same for every object
    (same shape and distribution, same values); in num_random_ops mode it
    follows a second counter, the order of the objects' first use. This counter
    is separate so the seeds of the ops above stay exactly the original's.
    An initializer first used *outside* a scope keeps the seed it drew then.
Not covered (unchanged inside a scope):
    stateless ops (``tf.random.stateless_*``) with their explicit seeds (they
    are deterministic already); ``tf.random.Generator`` objects you create
    yourself (``from_seed`` is deterministic, ``from_non_deterministic_state``
    and ``get_global_generator()`` are not); Keras 3's ``keras.random``
    functions other than those below; NumPy and Python ``random``.
Keras 3 (the ``keras`` package, TensorFlow backend):
    its initializers, ``keras.random.uniform/normal/truncated_normal`` and
    ``dropout`` (so ``keras.layers.Dropout``) draw through stateless ops seeded
    from Python's ``random``. Inside a scope they draw through the stateful op
    a TF1 program uses for the same distribution, seeded by the tool, so they
    match the TF1 graph bit for bit (:mod:`equivtool.seeding._keras3`).

Safety
------
On every exit path (including an exception in the block, and an exit on
another thread, as when a generator holding the scope is closed elsewhere) the
scope puts back ``get_seed``, the tf-keras seed source of the thread that
entered it, and the global seeds it set (the eager global seed, and the seed of
every graph it touched). Entering a scope while
any equivtool scope is active, or while something else has replaced
``get_seed`` (for example the original tool's scope), raises ``RuntimeError``.

Threads: a scope belongs to the thread that entered it. Random ops created on
other threads during the scope get TensorFlow's normal seeds, do not advance
the counter and are not traced. (The original patches the module global for
all threads.) One global effect remains visible to them, as with the original:
the global seed value the scope sets.

The trace
---------
``tool.trace`` lists, in order, a ``RandomOpRecord`` per seed handed out: the
operation seed, the op type, its shape and dtype when known, and the user's
source line. ``compare_random_traces(a, b)`` finds the first position where two
traces diverge, which is how to find why num_random_ops values stop matching
after a layer moved.
"""

from __future__ import annotations

import operator
import sys
import threading
from typing import Iterable, Optional, Tuple

from equivtool._base.stack import user_frame_location

import tensorflow as tf  # safe: importing the equivtool package applied the environment fix
from equivtool._platform import tf_internals as _tfi
from equivtool._platform.tf_internals import context as _context
from equivtool._platform.tf_internals import ops as _ops
from equivtool._platform.tf_internals import random_seed as _random_seed

__all__ = [
    "DeterministicRandomTestTool",
    "RandomOpRecord",
    "TraceDivergence",
    "compare_random_traces",
    "MODES",
]

from equivtool.seeding.modes import MODES  # noqa: E402  (defined once, TensorFlow-free)

# TensorFlow's own get_seed; a scope installs _seeded_get_seed in its place and
# always puts this object back. Taken from the public API symbol, which is bound
# at TensorFlow's import, so it is the real function even if this module is
# first imported while something (the original tool's scope) patches the module.
_TF_GET_SEED = tf.compat.v1.random.get_seed

_lock = threading.Lock()
_active: Optional["DeterministicRandomTestTool"] = None  # the tool whose scope is open
_get_ident = threading.get_ident
_MISSING = object()


def _seeded_get_seed(op_seed=None):
    """Stands in for ``random_seed.get_seed`` while a scope is open."""
    tool = _active
    if tool is None or tool._owner != _get_ident():
        return _TF_GET_SEED(op_seed)
    return tool._next_seeds()


from equivtool.seeding._keras3 import Keras3RandomPatch  # noqa: E402  (Keras 3's draws: its own module)
from equivtool.seeding._fresh_kernels import FreshKernels  # noqa: E402
from equivtool.seeding._trace import (  # noqa: E402  (the trace: its own module)
    RandomOpRecord, TraceDivergence, TraceRecorder, _KERAS_PLUMBING, _as_shape, _describe_tf_op,
    _dtype_name, compare_random_traces)


# --------------------------------------------------------------------------
# The tool


class _KerasSeedSource:
    """Put in ``tf_keras.src.backend._SEED_GENERATOR.generator`` during a scope.

    tf-keras asks it for ``randint(1, 10**9)`` once per unseeded initializer or
    RandomGenerator, where it would otherwise use Python's ``random``.
    """

    __slots__ = ("_tool",)

    def __init__(self, tool: "DeterministicRandomTestTool"):
        self._tool = tool

    def randint(self, a: int, b: int) -> int:
        # tf-keras 2.16-2.18 ask for randint(1, 1e9), a float bound. Python's
        # random.randint (3.11) takes an integral float and returns an int; so
        # must this, or TensorFlow gets a float seed ('Tseed' of float).
        bounds = []
        for name, value in (("a", a), ("b", b)):
            try:
                bounds.append(operator.index(value))
            except TypeError:
                if not (isinstance(value, float) and value.is_integer()):
                    raise TypeError(f"randint bound {name} must be an integer (or an "
                                    f"integral float), got {value!r}") from None
                bounds.append(int(value))
        return self._tool._next_keras_seed(*bounds)


class _Scope:
    """The context manager returned by ``DeterministicRandomTestTool.scope()``."""

    __slots__ = ("_tool",)

    def __init__(self, tool: "DeterministicRandomTestTool"):
        self._tool = tool

    def __enter__(self) -> "DeterministicRandomTestTool":
        self._tool._enter(user_frame_location())
        return self._tool

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._tool._exit()
        return False


class DeterministicRandomTestTool(TraceRecorder):
    """Make stateful random ops draw the same numbers in TF1 graphs and in eager code.

    A clone of tf-keras' ``tf.compat.v1.keras.utils.DeterministicRandomTestTool``
    (bitwise the same numbers for the same program, in both modes) with safe
    scopes, tf-keras initializer coverage and a trace; the module docstring of
    ``equivtool.seeding`` lists exactly what a scope covers.

    Args:
      seed: the global seed every op receives, as the first of its two seeds;
        an integer in [-2**63, 2**63 - 1] (TensorFlow's seeds are int64). With
        ``seed=0`` the op that would get the pair ``(0, 0)``, which TensorFlow
        reads as "draw a random seed", gets ``(0, 2**31 - 1)`` instead, as
        TensorFlow's own ``get_seed`` does.
      mode: ``"constant"`` (every op gets the operation seed ``operation_seed``,
        so equal shapes give equal values) or ``"num_random_ops"`` (the
        operation seed counts the random ops seeded so far, so values follow
        program order).
      record_trace: keep ``trace`` (on by default; it costs a stack walk per op).

    Example::

        tool = DeterministicRandomTestTool(mode="num_random_ops")
        with tool.scope():
            with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
                graph_value = sess.run(tf.random.uniform([3]))
        tool2 = DeterministicRandomTestTool(mode="num_random_ops")
        with tool2.scope():
            eager_value = tf.random.uniform([3]).numpy()
        # graph_value == eager_value, bit for bit
    """

    def __init__(self, seed: int = 42, mode: str = "constant", *, record_trace: bool = True):
        if mode not in MODES:
            raise ValueError(
                f"DeterministicRandomTestTool: mode must be one of {list(MODES)}, "
                f"got {mode!r}. Use 'constant' for the same seeds on every op, "
                "or 'num_random_ops' for seeds that follow program order.")
        self._seed = _as_int64("seed", seed)
        self._mode = mode
        self._constant = mode == "constant"
        self._operation_seed = 0
        self._observed_seeds: set = set()
        self._keras_draws = 0
        self._record = bool(record_trace)
        self._trace: list = []
        # tf.function alignment (equivtool.seeding.traced): seeds to hand out again,
        # the log of a first trace's forward seeds, and the depth of variable creation
        self._replay: Optional[list] = None
        self._forward_log: Optional[list] = None
        self._creating = 0
        # scope state
        self._owner: Optional[int] = None
        self._entered_at = ""
        self._saved_global_seeds: dict = {}
        self._saved_keras = _MISSING
        self._keras_slots: Optional[dict] = None
        self._keras3: Optional[Keras3RandomPatch] = None
        self._fresh: Optional[FreshKernels] = None  # eager draws served without a cache clear
        self._clear_owed = False  # num_random_ops: the entry's kernel-cache clear not made yet

    # ---- public surface --------------------------------------------------

    @property
    def seed(self) -> int:
        """The global seed (first element of every op's seed pair)."""
        return self._seed

    @property
    def mode(self) -> str:
        """``"constant"`` or ``"num_random_ops"``."""
        return self._mode

    @property
    def operation_seed(self) -> int:
        """The operation seed the next random op will get."""
        return self._operation_seed

    @operation_seed.setter
    def operation_seed(self, value: int) -> None:
        value = _as_int("operation_seed", value)
        if not 0 <= value <= _INT64_MAX:
            raise ValueError(
                f"DeterministicRandomTestTool.operation_seed must be a non-negative "
                f"integer in [0, {_INT64_MAX}] (it becomes the op's second seed, an "
                f"int64), got {value}. Set it to 0 or a positive integer in that range.")
        self._operation_seed = value

    @property
    def trace(self) -> Tuple[RandomOpRecord, ...]:
        """The seeds handed out so far, in order, across all of this tool's scopes."""
        return tuple(self._trace)

    @property
    def active(self) -> bool:
        """True while this tool's scope is open."""
        return _active is self

    def scope(self) -> _Scope:
        """A context manager inside which random ops take their seeds from this tool.

        The scope sets TensorFlow's global seed to ``seed`` on entry (as the
        original does) and restores every global it changed on exit.
        """
        return _Scope(self)

    def __repr__(self) -> str:
        return (f"DeterministicRandomTestTool(seed={self._seed}, mode={self._mode!r}, "
                f"operation_seed={self._operation_seed}, traced={len(self._trace)})")

    # ---- scope entry and exit ---------------------------------------------

    def _enter(self, location: str) -> None:
        global _active
        with _lock:
            if _active is not None:
                if _active is self:
                    what = "this tool's scope is already active"
                else:
                    what = f"the scope of another tool, {_active!r}, is active"
                raise RuntimeError(
                    f"Cannot enter a DeterministicRandomTestTool scope at {location}: "
                    f"{what} (entered at {_active._entered_at}). Scopes of these "
                    "tools cannot nest or overlap, because they would interleave "
                    "one seed counter. Exit the first scope before entering another, "
                    "or use a single tool for the whole program.")
            current = _random_seed.get_seed
            if current is not _TF_GET_SEED:
                raise RuntimeError(
                    f"Cannot enter a DeterministicRandomTestTool scope at {location}: "
                    f"tensorflow.python.framework.random_seed.get_seed is already "
                    f"replaced by {current!r} (for example by the scope of "
                    "tf.compat.v1.keras.utils.DeterministicRandomTestTool or a mock). "
                    "Exit that patch first; two seed sources cannot be combined.")
            self._owner = _get_ident()
            self._entered_at = location
            self._saved_global_seeds = {}
            _active = self
            try:
                # As the original: the global seed is the tool's seed to start with.
                # Eagerly that clears the kernel cache too; in num_random_ops mode the
                # clear is owed until the first draw no stateless twin serves (a served
                # draw is a fresh kernel's; see _next_seeds and seeding._fresh_kernels).
                self._clear_owed = not self._constant and _context.executing_eagerly()
                self._set_global_seed(self._seed, keep_kernels=self._clear_owed)
                holder = _tfi.keras_seed_generator()
                if holder is not None:
                    # _SEED_GENERATOR is a threading.local: its __dict__ is the
                    # entering thread's own slot dict. Keeping that dict (not
                    # the holder) lets an exit on any thread restore the slot
                    # the entering thread sees.
                    slots = holder.__dict__
                    self._keras_slots = slots
                    self._saved_keras = slots.get("generator", _MISSING)
                    slots["generator"] = _KerasSeedSource(self)
                self._keras3 = Keras3RandomPatch(self._owns_thread)
                self._keras3.install()
                if self._constant or self._clear_owed:
                    self._fresh = FreshKernels(self._owns_thread)
                    self._fresh.install()
                _random_seed.get_seed = _seeded_get_seed
            except BaseException:
                self._restore()
                raise

    def _owns_thread(self) -> bool:
        """True while this tool's scope is open and the caller is on its thread."""
        return _active is self and self._owner == _get_ident()

    def _exit(self) -> None:
        with _lock:
            if _active is self:
                self._restore()

    def _restore(self) -> None:
        """Put back every global the scope changed; runs on every exit path."""
        global _active
        try:
            _random_seed.get_seed = _TF_GET_SEED
            if self._keras3 is not None:
                self._keras3.restore()
            if self._fresh is not None:
                self._fresh.restore()
            slots = self._keras_slots
            if slots is not None:
                if self._saved_keras is _MISSING:
                    slots.pop("generator", None)
                else:
                    slots["generator"] = self._saved_keras
            self._restore_global_seeds()
        finally:
            self._keras_slots = None
            self._saved_keras = _MISSING
            self._keras3 = None
            self._fresh = None
            self._clear_owed = False
            self._saved_global_seeds = {}
            self._owner = None
            if _active is self:
                _active = None

    def _set_global_seed(self, value: int, keep_kernels: bool = False) -> None:
        """``tf.random.set_seed(value)``, remembering what it replaced; with
        ``keep_kernels``, eagerly, without clearing the kernel cache (the next
        draw is served by a stateless twin: see :mod:`equivtool.seeding._fresh_kernels`)."""
        saved = self._saved_global_seeds
        if _context.executing_eagerly():
            if "eager" not in saved:
                saved["eager"] = (_tfi.eager_global_seed(), _tfi.eager_rng(_MISSING))
            if keep_kernels:
                _tfi.set_eager_seed_keeping_kernels(value)
                return
        else:
            graph = _ops.get_default_graph()
            key = id(graph)
            if key not in saved:
                saved[key] = (graph, graph.seed)
        _random_seed.set_seed(value)

    def _restore_global_seeds(self) -> None:
        for key, saved in self._saved_global_seeds.items():
            if key == "eager":
                seed, rng = saved
                _context.set_global_seed(seed)  # also clears the kernel cache
                if rng is not _MISSING:
                    _tfi.set_eager_rng(rng)
            else:
                graph, seed = saved
                graph.seed = seed

    # ---- seeds ------------------------------------------------------------

    def _next_seeds(self) -> tuple:
        """The seed pair for the next stateful random op (the original's arithmetic)."""
        op_seed = self._operation_seed
        # An eager draw whose kernel call FreshKernels serves needs no cache clear.
        fresh = self._fresh if (self._fresh is not None
                                and self._fresh.can_serve(sys._getframe(2).f_code)) else None
        if self._constant:
            self._set_global_seed(op_seed, keep_kernels=fresh is not None)
        else:
            if fresh is None and self._clear_owed:  # the scope entry's clear, before the first draw it matters to
                self._clear_owed = False
                _tfi.clear_eager_kernel_cache()
            op_seed = self._next_counted_seed(op_seed)
        if self._seed == 0 and op_seed == 0:
            # TensorFlow reads the pair (0, 0) as "no seed" and draws a random
            # one per op; its own get_seed substitutes (0, 2**31 - 1), so do we.
            op_seed = _ZERO_PAIR_OPERATION_SEED
        if fresh is not None:
            fresh.expect((self._seed, op_seed))
        if self._record:
            frame = sys._getframe(2)  # the op's Python wrapper
            try:
                op_type, shape, dtype = _describe_tf_op(frame)
            finally:
                del frame
            self._trace.append(RandomOpRecord(
                len(self._trace), op_seed, op_type, shape, dtype,
                user_frame_location(2)))
        return (self._seed, op_seed)

    def _next_counted_seed(self, op_seed: int) -> int:
        """num_random_ops mode: the counter's next seed (a retrace: the first trace's)."""
        if self._replay:  # a retrace: the first trace's seed for this op
            return self._replay.pop(0)
        if op_seed in self._observed_seeds:
            raise ValueError(self._reuse_message(op_seed))
        self._observed_seeds.add(op_seed)
        self._operation_seed = op_seed + 1
        if self._forward_log is not None and not self._creating:
            self._forward_log.append(op_seed)
        return op_seed

    def _next_keras_seed(self, low: int, high: int) -> int:
        """A seed for a tf-keras initializer or RandomGenerator, from the tool's mode."""
        if self._constant:
            key = self._operation_seed
        else:
            key = self._keras_draws
            self._keras_draws += 1
        # Distinct keys give distinct seeds (1_000_003 is prime to the span).
        value = low + (self._seed + 1_000_003 * key) % (high - low + 1)
        if self._record:
            frame = sys._getframe(2)
            try:
                while frame is not None and frame.f_code.co_name in _KERAS_PLUMBING:
                    frame = frame.f_back
                if frame is None:
                    op_type, shape, dtype = "initializer", None, None
                else:
                    local = frame.f_locals
                    op_type = frame.f_code.co_name
                    shape = _as_shape(local.get("shape"))
                    dtype = _dtype_name(local.get("dtype"))
            finally:
                del frame
            self._trace.append(RandomOpRecord(
                len(self._trace), key, op_type, shape, dtype,
                user_frame_location(2), kind="keras"))
        return value

    def _reuse_message(self, op_seed: int) -> str:
        used = sorted(self._observed_seeds)
        fresh = used[-1] + 1 if used else 0
        return (
            f"DeterministicRandomTestTool(mode='num_random_ops') was asked to hand "
            f"out operation seed {op_seed} a second time, at {user_frame_location(2)}. "
            "Two random ops with the same operation seed would draw the same "
            "numbers, so random numbers could no longer be trusted to match "
            "between sessions and eager code. This happens when `operation_seed` "
            "is set explicitly to a value from which the counter runs into seeds "
            f"already used ({_summarise(used)}). Set `operation_seed` to a value "
            f"whose sequence stays clear of them (for example {fresh}), or use a "
            "new tool for the new program.")


_INT64_MIN, _INT64_MAX = -(2 ** 63), 2 ** 63 - 1
_ZERO_PAIR_OPERATION_SEED = 2 ** 31 - 1  # TensorFlow's substitute for the pair (0, 0)


def _as_int64(name: str, value) -> int:
    """An integer that fits TensorFlow's int64 seed attributes."""
    value = _as_int(name, value)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(
            f"DeterministicRandomTestTool: {name} must be an integer in "
            f"[{_INT64_MIN}, {_INT64_MAX}] (TensorFlow's seeds are int64), got "
            f"{value}. Pick a seed in that range, for example 42.")
    return value


def _as_int(name: str, value) -> int:
    """Python or NumPy integers (not bools, floats or strings) as a Python int."""
    if isinstance(value, bool):
        raise TypeError(f"DeterministicRandomTestTool: {name} must be an integer, got {value!r}.")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(
            f"DeterministicRandomTestTool: {name} must be an integer, got {value!r} "
            f"of type {type(value).__name__}.") from None


def _summarise(values: Iterable[int]) -> str:
    values = list(values)
    if len(values) <= 8:
        return ", ".join(map(str, values))
    return ", ".join(map(str, values[:4])) + ", ..., " + ", ".join(map(str, values[-2:]))
