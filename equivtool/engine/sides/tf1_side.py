"""The TF1 graph side, and what both sides share (variable keys, fixed values, losses, chunks).

``TF1Side`` builds the user's TF1 forward function in a fresh ``tf.Graph`` and
runs it in a ``tf.compat.v1.Session``; ``TF2Side``
(:mod:`equivtool.engine.sides.tf2_side`) calls the user's Keras layer eagerly
or inside ``tf.function``. Both return captures as NumPy values keyed by
normalised variable names, so everything downstream is plain data.

A ``TF1Side`` can hold several forward passes, the later ones reusing the
first one's variables; a later pass's name scopes are uniquified (``net_1/``),
so a pass whose outputs are compared gets a ``TF1Side`` of its own (see
``equivalence``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import tensorflow as tf
from equivtool._platform import graph_rewrites as _graph_rewrites
from equivtool._platform.graph_building import fast_graph_building
from equivtool._platform import tf_internals as _tf_internals
from equivtool._platform.graph_rewrites import remapper_aborts_on_layer_norm  # noqa: F401 (tests, COMPATIBILITY)
from equivtool.engine import noise_floor
from equivtool.engine.sides.tf1_graph_reading import STATEFUL_RANDOM_OPS, align_pass_keys, loop_random_ops
from equivtool.engine.sides._fed_reads import ReadPlan, read_plan
from equivtool._base.graph import ancestors
from equivtool._base.names import strip_output_index
from equivtool._base.tree import expand_composites, flatten_tensors, pack_like
from equivtool.engine.sides import CAPABILITIES, Side

def variable_key(name: str, renamer: Callable[[str], str]) -> str:
    """The name both sides are matched by: no ``:N`` suffix, then the user's rename rules."""
    return renamer(strip_output_index(name))


def load_by_initializer(session, pairs) -> None:
    """Set TF1 ``(variable, value)`` pairs in one ``session.run`` by feeding their
    initializers' initial-value inputs: no new op in the graph (what the
    deprecated ``Variable.load`` did)."""
    pairs = list(pairs)
    if pairs:
        session.run([v.initializer for v, _ in pairs],
                    feed_dict={v.initializer.inputs[1]: value for v, value in pairs})


# A whole model's values held at once, as NumPy arrays and again as the tensors
# fed from them, raise a process's peak memory by twice the model's size (and
# freed heap memory is rarely given back); moved a chunk at a time, only one
# chunk's worth is held.
CHUNK_BYTES = 32 << 20


def variable_bytes(variable) -> int:
    """A TF1 variable's size in bytes (0 when its shape is not fully known)."""
    count = variable.shape.num_elements()
    return 0 if count is None else count * variable.dtype.base_dtype.size


def chunked(items: list, size: Callable, limit: int | None = None):
    """``items`` in order, in runs whose ``size`` adds up to at most ``limit``
    (default :data:`CHUNK_BYTES`; an item larger than that is a run of its own)."""
    limit = CHUNK_BYTES if limit is None else limit
    run, total = [], 0
    for item in items:
        if run and total + size(item) > limit:
            yield run
            run, total = [], 0
        run.append(item)
        total += size(item)
    if run:
        yield run


# --------------------------------------------------------------------------
# Deterministic, non-random variable values (workflow step 3)
# --------------------------------------------------------------------------

_ONE_CENTRED = ("variance", "gamma", "scale")
_ZERO_CENTRED = ("mean", "beta", "bias", "biases")


def fixed_value(name: str, shape, dtype) -> np.ndarray:
    """A value that depends only on the variable's (normalised) name and shape.

    The pattern varies along every element, so a transposed or permuted
    kernel is caught; its scale keeps activations of deep networks bounded:
    kernels get amplitude ``sqrt(3 / fan_in)``, batch-norm variances and
    scales stay near one (and positive), means, offsets and biases near zero.
    """
    shape = tuple(int(d) for d in shape)
    dtype = tf.as_dtype(dtype)
    size = int(np.prod(shape)) if shape else 1
    if not (dtype.is_floating or dtype.is_complex):
        return np.zeros(shape, dtype.as_numpy_dtype)
    offset, amplitude, phase = _pattern(name, shape)
    values = aligned_empty(size, dtype.as_numpy_dtype)
    chunk = _PATTERN_ROWS * _PATTERN_STEP
    grid = np.empty((min(_PATTERN_ROWS, -(-size // _PATTERN_STEP)), _PATTERN_STEP))
    scratch = np.empty_like(grid)
    for start in range(0, size, chunk):
        block = values[start:start + chunk]
        run = _sine_run(start, block.size, phase, grid, scratch)
        run *= amplitude
        run += offset
        block[:] = run
    return values.reshape(shape)


def _pattern(name: str, shape: tuple) -> tuple:
    """``(offset, amplitude, phase)`` of a variable's values: ``offset + amplitude * sin(_ANGLE * k + phase)``."""
    size = int(np.prod(shape)) if shape else 1
    phase = (zlib.crc32(name.encode("utf-8")) % 10007) / 10007.0 * 2.0 * math.pi
    leaf = name.rsplit("/", 1)[-1].lower()
    if any(key in leaf for key in _ONE_CENTRED):
        return 1.0, 0.25, phase
    if any(leaf == key or leaf.endswith(key) for key in _ZERO_CENTRED):
        return 0.0, 0.1, phase
    fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else max(size, 1)
    return 0.0, math.sqrt(3.0 / max(fan_in, 1)), phase


#: TensorFlow feeds an array whose data starts on this boundary without copying it
#: (NumPy's own arrays start on 16 bytes: a fed model's worth of them is copied once more).
FEED_ALIGNMENT = 64


def aligned_empty(size: int, dtype) -> np.ndarray:
    """An uninitialised 1-D array of ``size`` elements whose data starts on :data:`FEED_ALIGNMENT`."""
    dtype = np.dtype(dtype)
    raw = np.empty(size * dtype.itemsize + FEED_ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % FEED_ALIGNMENT
    return raw[start:start + size * dtype.itemsize].view(dtype)


def feedable(value) -> np.ndarray:
    """``value`` as an array TensorFlow feeds without copying: itself when its data is
    contiguous and starts on :data:`FEED_ALIGNMENT` (a session's fetched values do
    not), else such a copy."""
    value = np.asarray(value)
    if value.flags.c_contiguous and value.ctypes.data % FEED_ALIGNMENT == 0:
        return value
    copy = aligned_empty(value.size, value.dtype).reshape(value.shape)
    copy[...] = value
    return copy


# The pattern is sin(2 * 0.61803398875 * k + phase) for element k. np.sin per
# element cost a 50-million-parameter model seconds per side; the angle-addition
# formula makes it two multiplications and an addition per element, from a table
# of one run of _PATTERN_STEP angles. The values differ from np.sin(k * angle +
# phase) only by that argument's own float64 rounding (about 4e-9 at k = 3e7:
# the last float32 bit of 3% of a 26M-element kernel), and both sides make
# theirs with this function.
_PATTERN_STEP, _PATTERN_ROWS = 4096, 256  # a run's length; runs per chunk (1 Mi elements, 8 MiB of float64)
_ANGLE = 0.61803398875 * 2.0
_RUN = np.arange(_PATTERN_STEP, dtype=np.float64) * _ANGLE
_RUN_SIN, _RUN_COS = np.sin(_RUN), np.cos(_RUN)


def _sine_run(start: int, count: int, phase: float, grid: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """sin(_ANGLE * k + phase) for k in [start, start + count), float64, written in
    ``grid`` (rows of _PATTERN_STEP; ``scratch`` alike): a view of it. The same
    operations, in the same order, as a fresh array per chunk, without a
    chunk's fresh pages to fault in twice over (2.3x faster for a 26M-element
    kernel; ``tests/test_fixed_values.py`` checks the bits are unchanged)."""
    rows = -(-count // _PATTERN_STEP)
    base = (start + np.arange(rows, dtype=np.float64) * _PATTERN_STEP) * _ANGLE + phase
    grid, scratch = grid[:rows], scratch[:rows]
    np.multiply(np.sin(base)[:, None], _RUN_COS[None, :], out=grid)
    np.multiply(np.cos(base)[:, None], _RUN_SIN[None, :], out=scratch)
    grid += scratch
    return grid.reshape(-1)[:count]


# --------------------------------------------------------------------------
# Outputs and losses
# --------------------------------------------------------------------------

def primary_output(outputs):
    """The output the default loss is built from (one rule, also in docs/verdict.md and
    ``check_equivalence``'s docstring): a tensor itself; of a tuple or list, the
    first element (slim's ``(logits, end_points)``); of a dict, the last entry in
    insertion order (end points are in forward order, so the last is the head);
    applied until a tensor is reached. :func:`primary_output_path` names it."""
    return _primary(outputs)[0]


def primary_output_path(outputs) -> str:
    """Where :func:`primary_output` is in ``outputs``, as an index path
    (``"[0]"``, ``"['logits']"``; ``""`` for a bare tensor)."""
    return _primary(outputs)[1]


def _primary(outputs) -> tuple:
    path = ""
    while True:
        if isinstance(outputs, Mapping):
            if not outputs:
                raise ValueError("the default loss needs an output: the model returned an empty dict; pass loss_fn")
            key = list(outputs)[-1]
            outputs, path = outputs[key], path + f"[{key!r}]"
        elif isinstance(outputs, (list, tuple)):
            if not outputs:
                raise ValueError("the default loss needs an output: the model returned an empty sequence; "
                                 "pass loss_fn")
            outputs, path = outputs[0], path + "[0]"
        else:
            return outputs, path


def default_loss(outputs, regularization_loss):
    """Mean of squares of the primary output (see :func:`primary_output`), plus the
    regularization losses.

    A scalar loss that touches every weight feeding the primary output; pass
    ``loss_fn`` to ``check_equivalence`` for anything more specific (the
    gradients step lists trainable variables the loss does not reach).
    """
    loss = tf.reduce_mean(tf.square(tf.cast(primary_output(outputs), tf.float32)))
    if regularization_loss is not None:
        loss = loss + tf.cast(regularization_loss, tf.float32)
    return loss


def session_config(graph_rewrites: str = "as_written") -> tf.compat.v1.ConfigProto:
    """The TF1 side's session options: under ``"as_written"`` every Grappler pass
    that can change a float result is off, so the session computes what was
    written (see :mod:`equivtool._platform.graph_rewrites`); the remapper is off on TensorFlow
    2.16 whatever is asked, since there it crashes."""
    return _graph_rewrites.rewrite_config(graph_rewrites)


# --------------------------------------------------------------------------
# TF1 side
# --------------------------------------------------------------------------

@dataclass
class TF1Forward:
    outputs: Any            # structure of tensors
    regularization: Any     # scalar tensor (0 without regularizers)
    gradients: dict | None  # key -> tensor
    loss: Any               # scalar tensor or None
    update_ops: list        # the UPDATE_OPS this pass added (batch-norm statistics)
    loop_random_ops: dict = dataclasses.field(default_factory=dict)  # see loop_random_ops()


@dataclass
class TF1Training:
    """A training pass built by :meth:`TF1Side.build_training`."""

    loss: Any               # scalar tensor
    train_op: Any           # the optimizer's minimize op
    optimizer: Any          # the tf.compat.v1.train optimizer
    loop_random_ops: dict = dataclasses.field(default_factory=dict)  # its forward pass's, see loop_random_ops()


class TF1Side(Side):
    """The user's TF1 function in one graph and session.

    ``forward(training, with_gradients)`` adds a forward pass; the second and
    later ones reuse the first one's variables, so they add no variable and no
    initializer.
    """

    KIND = "TF1 graph"
    CAPABILITIES = frozenset(CAPABILITIES)

    def __init__(self, tf1_fn: Callable, inputs, *, renamer: Callable[[str], str],
                 loss_fn: Callable | None, graph_rewrites: str = "as_written",
                 random_tool=None):
        self.tf1_fn = tf1_fn
        self.renamer = renamer
        self.loss_fn = loss_fn or default_loss
        self.random_tool = random_tool
        self.graph = tf.Graph()
        self._inputs_value = inputs
        self._forwards: list[TF1Forward] = []
        with self.graph.as_default():
            self.placeholders = pack_like(inputs, [
                tf.compat.v1.placeholder(tf.as_dtype(np.asarray(leaf).dtype), np.shape(leaf),
                                         name=f"equivtool_input_{i}")
                for i, leaf in enumerate(flatten_tensors(inputs))])
        self._config = session_config(graph_rewrites)
        self.session = tf.compat.v1.Session(graph=self.graph, config=self._config)
        self._initialized = False
        self.variables: list = []
        self.keys: list[str] = []
        self.trainable_keys: set = set()

    # -- building -----------------------------------------------------------

    def _scoped(self, fn):
        if self.random_tool is None:
            return fn()
        with self.random_tool.scope():
            return fn()

    def forward(self, training: bool, with_gradients: bool = False) -> TF1Forward:
        def build():
            with self.graph.as_default():
                updates_before = len(self.graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))
                ops_before = len(self.graph.get_operations())
                reuse = tf.compat.v1.AUTO_REUSE if self._forwards else None
                with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=reuse):
                    outputs = self.tf1_fn(self.placeholders, training)
                reg_list = tf.compat.v1.losses.get_regularization_losses()
                # 0 without regularizers, like the TF2 side's empty `layer.losses`.
                regularization = tf.add_n(reg_list) if reg_list else tf.constant(0.0)
                loss = gradients = None
                if with_gradients:
                    loss = self.loss_fn(outputs, regularization)
                    trainable = self.graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
                    grads = tf.gradients(loss, trainable)
                    gradients = {variable_key(v.name, self.renamer): g
                                 for v, g in zip(trainable, grads) if g is not None}
                update_ops = self.graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)[updates_before:]
                loops = loop_random_ops(self.graph, self.graph.get_operations()[ops_before:])
                return TF1Forward(outputs, regularization, gradients, loss, update_ops, loops)

        with fast_graph_building():  # equivtool._platform.graph_building: a build's hashes at the speed of ops
            result = self._scoped(build)
        if self._forwards:
            result.outputs = align_pass_keys(result.outputs, self._forwards[0].outputs)
        self._forwards.append(result)
        self._collect_variables()
        return result

    def _collect_variables(self) -> None:
        self.variables = list(self.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES))
        self.keys = [variable_key(v.name, self.renamer) for v in self.variables]
        self.trainable_keys = {variable_key(v.name, self.renamer) for v in
                               self.graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}

    def initialize(self) -> None:
        with self.graph.as_default():
            self.session.run(tf.compat.v1.global_variables_initializer())
        self._initialized = True

    def trainable_variables(self) -> list:
        return self.graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)

    # -- running ------------------------------------------------------------

    def feed(self, inputs=None) -> dict:
        values = flatten_tensors(self._inputs_value if inputs is None else inputs)
        return dict(zip(flatten_tensors(self.placeholders), values))

    def run(self, fetches, inputs=None, update_ops=()):
        """Run ``fetches``; ``update_ops`` (a pass's batch-norm updates) run alongside."""
        if not self._initialized:
            self.initialize()
        result, _ = self.session.run((fetches, list(update_ops)), feed_dict=self.feed(inputs))
        return expand_composites(result)  # ragged/sparse values as their parts, as the TF2 side's

    def read_plan(self, fetches, update_ops=()) -> ReadPlan:
        """Which variables a run of ``fetches`` and ``update_ops`` only reads (their
        reads can be fed) and which it needs in the session (:mod:`._fed_reads`)."""
        flat = [x for x in tf.nest.flatten(fetches, expand_composites=True) if x is not None]
        return read_plan(self.variables, flat + list(update_ops))

    def run_fed(self, fetches, feeds: Mapping, update_ops=()):
        """:meth:`run` with ``feeds`` (read tensor -> value, from :meth:`read_plan`) added to
        the inputs, and nothing initialised first: the variables the run needs in the
        session are the caller's to set."""
        result, _ = self.session.run((fetches, list(update_ops)), feed_dict={**self.feed(), **feeds})
        return expand_composites(result)

    def initialize_variables(self, variables) -> None:
        """Run the initializers of ``variables`` only (no new op in the graph)."""
        if variables:
            self.session.run([v.initializer for v in variables])

    def read_variables(self, wanted: Callable[[str], bool] | None = None) -> dict:
        """``{key: value}`` of every variable, or of those whose key ``wanted`` accepts
        (the others are not fetched)."""
        if not self._initialized:
            self.initialize()
        pairs = [(v, k) for v, k in zip(self.variables, self.keys) if wanted is None or wanted(k)]
        values = self.session.run([v for v, _ in pairs])
        return dict(zip((k for _, k in pairs), values))

    def assign_variables(self, values_by_key: Mapping[str, np.ndarray]) -> None:
        """Set every variable whose key is in ``values_by_key``, a chunk at a time
        (a mapping that computes its values on access holds one chunk only)."""
        wanted = [(variable, key) for variable, key in zip(self.variables, self.keys) if key in values_by_key]
        for run in chunked(wanted, lambda pair: variable_bytes(pair[0])):
            load_by_initializer(self.session, [(variable, values_by_key[key]) for variable, key in run])
        self._initialized = True

    def copy_variables_from(self, other: "TF1Side", keys=None) -> None:
        """Give every variable that ``other`` has under the same key (of ``keys``, when
        given) ``other``'s current value, a chunk at a time; in a session not yet
        initialised, the other variables are initialised first (a copied variable's
        initializer is not run: its values would be overwritten)."""
        if not other._initialized:
            other.initialize()
        source = dict(zip(other.keys, other.variables))
        if keys is not None:
            source = {key: variable for key, variable in source.items() if key in keys}
        pairs = [(variable, source[key]) for variable, key in zip(self.variables, self.keys) if key in source]
        if not self._initialized:
            rest = [variable for variable, key in zip(self.variables, self.keys) if key not in source]
            if rest:
                with self.graph.as_default():
                    self.session.run(tf.compat.v1.variables_initializer(rest))
        for run in chunked(pairs, lambda pair: variable_bytes(pair[0])):
            values = other.session.run([theirs for _, theirs in run])
            load_by_initializer(self.session, [(mine, value) for (mine, _), value in zip(run, values)])
        self._initialized = True

    def renew_session(self) -> None:
        """Move every variable's value into a new session.

        A stateful random op keeps its position in its random stream inside
        the session; a new session restarts every op at its first draw, which
        is what an eager TF2 call (a new op each time) sees.
        """
        with self.graph.as_default():
            everything = tf.compat.v1.global_variables()
        values = self.session.run(everything)
        self.session.close()
        self.session = tf.compat.v1.Session(graph=self.graph, config=self._config)
        load_by_initializer(self.session, zip(everything, values))

    def global_state(self) -> dict:
        """``{op name: value}`` of every global variable: the model's, and the
        optimizer's slots, step powers and counters."""
        if not self._initialized:
            self.initialize()
        with self.graph.as_default():
            everything = tf.compat.v1.global_variables()
        return dict(zip((v.op.name for v in everything), self.session.run(everything)))

    def load_global_state(self, values: Mapping[str, np.ndarray]) -> None:
        """Set every global variable named in ``values`` (by op name), a chunk at a time."""
        with self.graph.as_default():
            wanted = [v for v in tf.compat.v1.global_variables() if v.op.name in values]
        for run in chunked(wanted, variable_bytes):
            load_by_initializer(self.session, [(variable, values[variable.op.name]) for variable in run])
        self._initialized = True

    @contextlib.contextmanager
    def perturbed(self, start: Mapping[str, np.ndarray], seed: int):
        """Every global variable at ``start`` with each float one ULP away
        (:class:`equivtool.engine.noise_floor.Perturbed`), for a noise-floor
        run; ``start`` is loaded back on every exit path."""
        try:
            self.load_global_state(noise_floor.Perturbed(start, seed))
            yield
        finally:
            self.load_global_state(start)

    # -- training and checkpoints ----------------------------------------------

    def build_training(self, make_optimizer: Callable, training: bool) -> TF1Training:
        """A forward pass of its own (its random ops are not shared with another
        pass), its loss, and ``make_optimizer().minimize`` over the trainable
        variables after the pass's UPDATE_OPS; the optimizer's new variables
        (slots, step counters) are initialised."""
        forward = self.forward(training=training, with_gradients=False)
        with self.graph.as_default():
            loss = self.loss_fn(forward.outputs, forward.regularization)
            optimizer = make_optimizer()
            with tf.control_dependencies(forward.update_ops):
                train_op = optimizer.minimize(loss, var_list=self.trainable_variables())
            known = set(self.variables)
            new_vars = [v for v in tf.compat.v1.global_variables() if v not in known]
            self.session.run(tf.compat.v1.variables_initializer(new_vars))
        return TF1Training(loss, train_op, optimizer, forward.loop_random_ops)

    def train_step(self, training: TF1Training) -> float:
        """One optimizer step in a new session (so every random op starts at its
        first draw, as an eager TF2 call does); returns the loss before the step."""
        self.renew_session()
        loss, _ = self.run((training.loss, training.train_op))
        return float(loss)

    def _saver(self):
        if getattr(self, "_checkpoint_saver", None) is None:
            with self.graph.as_default():
                self._checkpoint_saver = tf.compat.v1.train.Saver(var_list=self.variables)
        return self._checkpoint_saver

    def save_checkpoint(self, prefix: str | os.PathLike) -> str:
        """Write the variables with ``tf.compat.v1.train.Saver``; returns the checkpoint path."""
        saver = self._saver()
        with self.graph.as_default():
            return saver.save(self.session, os.fspath(prefix))

    def restore_checkpoint(self, path: str | os.PathLike) -> None:
        saver = self._saver()
        with self.graph.as_default():
            saver.restore(self.session, os.fspath(path))
        self._initialized = True

    def checkpoint_names(self) -> dict:
        """Matching key -> the name a TF1 checkpoint stores the variable under."""
        return {variable_key(v.name, self.renamer): v.op.name for v in self.variables}

    def restore_training(self, path: str, optimizer) -> tuple:
        """Every variable of the training graph (the model's, the optimizer's slots
        and its own, such as Adam's beta powers) restored from the TF1 checkpoint
        at ``path``; a ``ValueError`` names what the checkpoint lacks. Returns
        ``(slots, non_slot)``: ``(variable, slot)`` pairs of the trainable
        variables, and the optimizer's own variables that a TF1 checkpoint holds."""
        with self.graph.as_default():
            everything = tf.compat.v1.global_variables()
            stored = tf.train.load_checkpoint(path).get_variable_to_shape_map()
            absent = sorted({_tf_internals.save_slice_info(v).full_name if _tf_internals.save_slice_info(v)
                             else v.op.name for v in everything} - set(stored))
            if absent:
                raise ValueError(f"checkpoint: {path!r} lacks {absent}, which the TF1 training graph "
                                 f"({type(optimizer).__name__}) has: was it written by this model and optimizer?")
            tf.compat.v1.train.Saver(var_list=everything).restore(self.session, path)
            self._initialized = True  # every variable restored
            trainable = self.trainable_variables()
            slots = [(v, optimizer.get_slot(v, name)) for name in optimizer.get_slot_names() for v in trainable]
            non_slot = [v for v in optimizer.variables() if v.op.name in ("beta1_power", "beta2_power")]
        return [(v, s) for v, s in slots if s is not None], non_slot

    def fetch(self, fetches):
        """The values of ``fetches`` (tensors or variables of this graph), in one run."""
        return self.session.run(fetches)

    def op_runner(self, outputs) -> Callable[[list], list]:
        """``run(tensors) -> values`` of any tensors of this pass (localization fetches
        every op's outputs with it), the inputs fed.

        A stateful random op moves along its stream on every ``Session.run``; when
        the pass has one (dropout in training mode), each run gets a new session
        holding the current variable values, so every run sees the first draws, as
        the step's own single run did. The step's session is left untouched.
        """
        upstream = ancestors(t.op for t in tf.nest.flatten(outputs) if hasattr(t, "op"))
        feed = self.feed()
        if not any(op.type in STATEFUL_RANDOM_OPS for op in upstream):
            return lambda tensors: self.session.run(tensors, feed_dict=feed)
        with self.graph.as_default():
            everything = tf.compat.v1.global_variables()
        values = self.session.run(everything)

        def run(tensors):
            with tf.compat.v1.Session(graph=self.graph, config=self._config) as session:
                session.run([v.initializer for v in everything],
                            feed_dict={v.initializer.inputs[1]: value for v, value in zip(everything, values)})
                return session.run(tensors, feed_dict=feed)
        return run

    def close(self) -> None:
        self.session.close()


def checkpoint_exists(path: str | os.PathLike) -> bool:
    """A TF1 checkpoint at ``path``: a V2 prefix (``path.index`` exists) or a V1 file."""
    path = os.fspath(path)
    return tf.io.gfile.exists(path + ".index") or (
        tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path))
