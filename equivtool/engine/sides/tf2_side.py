"""The TF2 layer side: the user's Keras layer, called eagerly, inside
``tf.function`` (with the same graph rewrites off as the TF1 session), or under
a ``tf.distribute`` strategy. Its captures are NumPy values keyed by normalised
variable names, as the TF1 side's (:mod:`equivtool.engine.sides.tf1_side`).
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Mapping

import numpy as np
import tensorflow as tf
from equivtool._platform import graph_rewrites as _graph_rewrites
from equivtool._platform import tf_internals as _tf_internals
from equivtool._base.tree import dense_gradient, flatten_tensors, pack_like, tensor_values, to_numpy
from equivtool.engine.sides import CAPABILITIES, Side
from equivtool.engine import _sparse_squares
from equivtool.variables.mapping import tf1_value, tf2_value
from equivtool.engine.sides.tf1_side import FEED_ALIGNMENT, default_loss, variable_key
from equivtool.variables.flavour import layer_variables, variable_dtype, variable_name

# --------------------------------------------------------------------------
# TF2 side
# --------------------------------------------------------------------------

class TF2Side(Side):
    """The user's TF2 layer, called eagerly, inside ``tf.function``, or under a
    ``tf.distribute`` strategy.

    With a strategy the batch is split evenly across replicas (in replica
    order), outputs are gathered back into one batch, and gradients are summed
    across replicas from per-replica losses scaled by ``1 / replicas``: for a
    loss that is a mean over the batch (the default loss is), that is the
    gradient of the single-device loss.
    """

    KIND = "TF2 layer"
    CAPABILITIES = frozenset(CAPABILITIES)

    def __init__(self, layer, *, renamer: Callable[[str], str], loss_fn: Callable | None,
                 use_tf_function: bool = False, strategy=None, graph_rewrites: str = "as_written",
                 trace_scope: Callable | None = None):
        """``trace_scope``: a context-manager factory wrapping every ``tf.function``
        trace's body (the seed alignment of :mod:`equivtool.seeding.traced`)."""
        self.layer = layer
        self.graph_rewrites = graph_rewrites
        self.trace_scope = trace_scope
        self.renamer = renamer
        self.loss_fn = loss_fn or default_loss
        self.use_tf_function = use_tf_function
        self.strategy = strategy
        self._functions: dict = {}
        self.sparse_gradients: tuple = ()  # keys whose last gradient was tf.IndexedSlices
        self.repeated_rows: dict = {}  # key -> rows that gradient held more than once (engine._sparse_squares)

    @classmethod
    def create(cls, make_layer: Callable, inputs, *, renamer: Callable[[str], str], loss_fn: Callable | None,
               use_tf_function: bool = False, strategy=None, graph_rewrites: str = "as_written") -> "TF2Side":
        """Create the layer with ``make_layer()``; under a strategy, inside its
        scope, with a first (cross-replica) call that creates the variables."""
        with strategy_scope(strategy):
            layer = make_layer()
            if strategy is not None:
                layer(tf.nest.map_structure(tf.convert_to_tensor, inputs), training=False)
        return cls(layer, renamer=renamer, loss_fn=loss_fn, use_tf_function=use_tf_function,
                   strategy=strategy, graph_rewrites=graph_rewrites)

    # -- one replica's work ---------------------------------------------------

    def _replica_step(self, inputs, training: bool, with_gradients: bool, optimizer=None,
                      loss_scale: float = 1.0):
        layer = self.layer
        # No tape for a pass without gradients: one would keep every activation alive for
        # a backward pass that never comes (memory and recording time; the numbers are the same).
        with tf.GradientTape() if with_gradients else contextlib.nullcontext() as tape:
            outputs = layer(inputs, training=training)
            losses = layer.losses
            regularization = tf.add_n(losses) if losses else tf.constant(0.0)
            loss = scaled = None
            if with_gradients:
                loss = self.loss_fn(outputs, regularization)  # a zero scalar without regularizers, as TF1
                scaled = loss * loss_scale if loss_scale != 1.0 else loss
        gradients = None
        if with_gradients:
            trainable = layer.trainable_variables
            gradients = tape.gradient(scaled, trainable)
            if optimizer is not None:
                optimizer.apply_gradients([(g, v) for g, v in zip(gradients, trainable) if g is not None])
        return outputs, regularization, loss, gradients

    def _step_function(self, training, with_gradients, optimizer, fresh: bool):
        """The replica step, wrapped in ``tf.function`` when asked (cached unless ``fresh``)."""
        def step(x, scale):
            if self.use_tf_function and self.trace_scope is not None:
                with self.trace_scope():
                    return self._replica_step(x, training, with_gradients, optimizer, scale)
            return self._replica_step(x, training, with_gradients, optimizer, scale)
        if not self.use_tf_function:
            return step
        key = _function_key(training, with_gradients, optimizer)
        if fresh or key not in self._functions:
            self._functions[key] = tf.function(step)
        return self._functions[key]

    # -- calls --------------------------------------------------------------

    def _run(self, inputs, training, with_gradients, optimizer=None, fresh=False):
        # Function graphs run with the same rewrites off as the TF1 session.
        with _graph_rewrites.function_rewrites(self.graph_rewrites):
            return self._run_here(inputs, training, with_gradients, optimizer, fresh)

    def _run_here(self, inputs, training, with_gradients, optimizer, fresh):
        inputs = tf.nest.map_structure(tf.convert_to_tensor, inputs)
        step = self._step_function(training, with_gradients, optimizer, fresh)
        if self.strategy is None:
            return step(inputs, 1.0)
        strategy = self.strategy
        replicas = strategy.num_replicas_in_sync
        split = split_batch(inputs, replicas)
        distributed = strategy.experimental_distribute_values_from_function(
            lambda ctx: split[ctx.replica_id_in_sync_group])
        outputs, regularization, loss, gradients = strategy.run(step, args=(distributed, 1.0 / replicas))
        outputs = tf.nest.map_structure(lambda t: _gather(strategy, t), outputs)
        regularization = strategy.experimental_local_results(regularization)[0]
        if with_gradients:
            loss = strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None) / replicas
            if optimizer is None:
                gradients = [None if g is None else strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None)
                             for g in gradients]
        return outputs, regularization, loss, gradients

    def forward(self, inputs, training: bool, with_gradients: bool = False):
        """Return ``(outputs, regularization, loss, gradients_by_key)`` as NumPy."""
        try:
            outputs, regularization, loss, gradients = self._run(inputs, training, with_gradients)
        except Exception:
            # A tf.function whose first (variable-creating) trace failed returns
            # None when called again: drop it, so the next call traces anew and
            # raises its own error.
            self._functions.pop(_function_key(training, with_gradients, None), None)
            raise
        gradients_by_key = None
        if with_gradients:
            gradients_by_key, sparse, self.repeated_rows = {}, [], {}
            for v, g in zip(self.layer.trainable_variables, gradients):
                if g is not None:
                    key = variable_key(variable_name(v), self.renamer)
                    gradient, was_sparse = dense_gradient(g, v.shape)
                    gradients_by_key[key] = tf1_value(self.renamer, key, gradient)
                    if was_sparse:
                        sparse.append(key)
                        self.repeated_rows[key] = _sparse_squares.repeated_rows(g.indices)
            self.sparse_gradients = tuple(sparse)
            loss = float(loss.numpy())
        return to_numpy(outputs, keep_slices=True), float(regularization.numpy()), loss, gradients_by_key

    def train_step(self, inputs, optimizer, training: bool = True) -> float:
        """One optimizer step; with ``tf.function``, a new trace (so random ops start over)."""
        _, _, loss, _ = self._run(inputs, training, True, optimizer=optimizer, fresh=True)
        return float(loss.numpy())

    def keys(self) -> list[str]:
        return [variable_key(variable_name(v), self.renamer) for v in layer_variables(self.layer)]

    def read_variables(self, wanted: Callable[[str], bool] | None = None) -> dict:
        """``{key: value}`` of every variable, or of those whose key ``wanted`` accepts
        (the others are not read)."""
        # (each read as its tensor's own buffer, read-only: no model-sized copy; a later
        # update of the variable writes a new buffer while the read is alive)
        return {key: tf1_value(self.renamer, key, tensor_values(tf.convert_to_tensor(v)))
                for key, v in ((variable_key(variable_name(v), self.renamer), v) for v in layer_variables(self.layer))
                if wanted is None or wanted(key)}

    def assign_variables(self, values_by_key: Mapping[str, np.ndarray]) -> None:
        """Each variable whose key is in ``values_by_key`` set to its value. A
        mapping whose ``fresh_arrays`` is true (the fixed values: each array
        made on access, for this assignment alone) hands its arrays to
        TensorFlow without a copy where it can (:func:`_shared`)."""
        fresh = getattr(values_by_key, "fresh_arrays", False)
        for variable in layer_variables(self.layer):
            key = variable_key(variable_name(variable), self.renamer)
            if key in values_by_key:
                value = tf2_value(self.renamer, key, values_by_key[key])
                variable.assign(_shared(value, variable) if fresh else value)

    def make_optimizer(self, factory: Callable):
        """``factory()`` (under the strategy's scope), with its slot variables
        created now: made inside a traced step they would make it trace twice."""
        with strategy_scope(self.strategy):
            optimizer = factory()
            _build_optimizer(optimizer, self.layer.trainable_variables)
        return optimizer

    def load_checkpoint(self, path: str | os.PathLike, names: Mapping[str, str]) -> tuple[int, list]:
        """Assign every variable found in the TF1 checkpoint at ``path``, looked up
        as ``names[key]`` (default: the key itself); returns ``(loaded, absent names)``."""
        reader = tf.train.load_checkpoint(os.fspath(path))
        loaded, absent = 0, []
        for variable in layer_variables(self.layer):
            key = variable_key(variable_name(variable), self.renamer)
            name = names.get(key, key)
            if reader.has_tensor(name):
                variable.assign(tf2_value(self.renamer, key, reader.get_tensor(name)))
                loaded += 1
            else:
                absent.append(name)
        return loaded, absent

    def restore_checkpoint(self, path: str, optimizer) -> None:
        """The layer and ``optimizer`` restored from the TF2 checkpoint at ``path``, as
        its users restore it (``tf.train.Checkpoint(model=..., optimizer=...)``; restored,
        not read, since the file holds ``save_counter``); every object the layer
        and optimizer already hold must be matched in the file."""
        status = tf.train.Checkpoint(model=self.layer, optimizer=optimizer).restore(path)
        status.assert_existing_objects_matched()


def _shared(value, variable):
    """``value`` as a tensor on the array's own memory (imported by DLPack) where
    TensorFlow can use that memory as it is: a writable, C-contiguous NumPy array
    of the variable's dtype whose data starts on ``FEED_ALIGNMENT`` (Eigen's
    alignment; the fixed values are made so); else ``value`` itself.

    ``variable.assign(array)`` copies an array twice (``convert_to_eager_tensor``
    copies every NumPy array it is given, then the assignment copies that):
    0.23 s of alexnet_v2's 58 million values per TF2 layer. With the array's
    memory, the variable takes it as its buffer; a write to the variable
    (an optimizer step, ``assign_add``) then goes to a buffer of its own, as
    TensorFlow never writes in place into memory a tensor does not own
    (``tests/test_fixed_values.py`` checks that the array stays as made). Only
    for arrays no one else holds or changes: the variable reads the memory
    until its first write."""
    if (isinstance(value, np.ndarray) and value.size and value.flags.c_contiguous
            and value.flags.writeable and value.ctypes.data % FEED_ALIGNMENT == 0
            and value.dtype == variable_dtype(variable).as_numpy_dtype):
        try:
            return tf.experimental.dlpack.from_dlpack(value.__dlpack__())
        except (AttributeError, BufferError, TypeError, ValueError, tf.errors.InvalidArgumentError):
            pass  # a NumPy or dtype without DLPack export: the copying path
    return value


def strategy_scope(strategy):
    """``strategy.scope()``, or nothing without a strategy."""
    return contextlib.nullcontext() if strategy is None else strategy.scope()


def _build_optimizer(optimizer, variables) -> None:
    """Create a Keras optimizer's slot variables now (new and legacy optimizers)."""
    if hasattr(optimizer, "build") and not getattr(optimizer, "built", False):
        optimizer.build(variables)
    else:
        _tf_internals.build_legacy_optimizer(optimizer, variables)


def _function_key(training: bool, with_gradients: bool, optimizer) -> tuple:
    return (training, with_gradients, id(optimizer))


def split_batch(inputs, parts: int) -> list:
    """Split every input leaf into ``parts`` equal consecutive slices along axis 0."""
    leaves = flatten_tensors(inputs)
    batch = int(leaves[0].shape[0]) if leaves[0].shape.rank else 0
    if batch % parts or batch == 0:
        raise ValueError(
            f"inputs: a batch of {batch} cannot be split evenly across {parts} replicas; use a "
            f"batch size that is a multiple of {parts}")
    size = batch // parts
    return [pack_like(inputs, [leaf[i * size:(i + 1) * size] for leaf in leaves]) for i in range(parts)]


def _gather(strategy, value):
    first = strategy.experimental_local_results(value)[0]
    if first.shape.rank == 0:  # a per-replica scalar cannot be concatenated; take replica 0's
        return first
    return strategy.gather(value, axis=0)


def snapshot_layer(layer) -> list:
    """The layer's variables and their current values (for restoring later), as
    tensors read now: TensorFlow copies a variable's buffer before it writes it
    while such a read is alive, so no later assignment or update changes them,
    and nothing is copied out to NumPy and back in (a model's worth each way)."""
    return [(v, tf.convert_to_tensor(v)) for v in layer_variables(layer)]


def restore_snapshot(snapshot: list) -> None:
    for variable, value in snapshot:
        variable.assign(value)


# --------------------------------------------------------------------------
# Localization's extra pass: the layer's forward pass with an op tap installed
# --------------------------------------------------------------------------

def run_tapped(tap, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` with ``tap`` installed as an op callback (the hook
    tfdbg v2 is built on: it sees every eager op, and every op of a graph being
    traced), removed again on every exit path, an exception included."""
    _tf_internals.op_callbacks.add_op_callback(tap)
    try:
        return fn(*args, **kwargs)
    finally:
        _tf_internals.op_callbacks.remove_op_callback(tap)


def call_layer(layer, inputs, training: bool, use_tf_function: bool, graph_rewrites: str = "as_written",
               tap=None):
    """The TF2 layer's forward pass alone (no losses), eagerly or in a new ``tf.function``
    (a new trace, which a tap sees being built; run with ``graph_rewrites``' passes
    off, as the step's own call); with ``tap``, under :func:`run_tapped`."""
    def call():
        tensors = tf.nest.map_structure(tf.convert_to_tensor, inputs)
        if use_tf_function:
            with _graph_rewrites.function_rewrites(graph_rewrites):
                return tf.function(lambda x: layer(x, training=training))(tensors)
        return layer(tensors, training=training)
    return call() if tap is None else run_tapped(tap, call)
