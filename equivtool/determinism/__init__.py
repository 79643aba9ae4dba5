"""Is a step reproducible? Run it several times from the same state and compare bits.

Why this exists
---------------
An equivalence check between a TF1 graph and its TF2 port means little when
either side does not even reproduce itself: the difference you chase may be
run-to-run noise. ``audit_determinism(fn)`` runs ``fn`` (a forward pass or a
training step: eager code, a ``tf.function``, or a function running a TF1
graph) ``runs`` times from the same starting state, compares every returned
value and every variable afterwards *bitwise*, and names the usual causes it
can see:

``unseeded_random_op``
    a stateful random op (``tf.random.uniform``, ``tf.nn.dropout``, an
    initializer ...) created with no op seed while no global seed was set: it
    draws new numbers on every run. Named by the user's source line.
``random_op_state_in_session``
    a seeded stateful random op in the graph of a ``tf.compat.v1.Session``
    that ``fn`` reuses: the session keeps the op's random state, so every
    ``session.run`` draws the next numbers and nothing can rewind it.
``nondeterministic_dataset``
    a ``tf.data`` transformation that may reorder elements: ``map``,
    ``interleave`` or ``batch`` with ``num_parallel_calls`` and
    ``deterministic=False`` (or ``Options.deterministic = False``), or the
    legacy ``sloppy=True``.
``reshuffling_dataset``
    a dataset ``fn`` iterates afresh on every run that contains
    ``shuffle(..., reshuffle_each_iteration=True)`` (the default): each new
    iteration is a new order.
``dataset_iterator``
    an iterator ``fn`` draws from: every run consumes the next elements.
``gpu_nondeterministic_op``
    an op with a non-deterministic GPU kernel (TensorFlow's cross-entropy
    ops, ``BiasAddGrad``, convolution backprops, segment sums, scatter ops
    ...), reported only when a GPU is visible and
    ``tf.config.experimental.enable_op_determinism()`` has not been called.

The verdict is what the runs showed; the causes are what inspection found.
A report *passes* only when the runs agree bit for bit and no cause was found
(a non-deterministic pipeline can produce the same order three times by luck).

What "the same starting state" means
------------------------------------
Variables
    ``variables`` (a list, a dict, a ``tf.Module``/Keras layer/model/optimizer,
    or a mix) are read before the first run and written back before each
    later run and after the last one, also when ``fn`` raises. With
    ``variables=None`` the audit finds them: the variables, modules, Keras
    objects and sessions that ``fn`` captures (its closure, the module globals
    it names, ``self`` of a bound method, the arguments of a
    ``functools.partial``, one level into lists, dicts and plain objects), the
    variables of ``fn``'s concrete graph when ``fn`` is a ``tf.function``
    (traced first, without running), and the global and local variables of a
    captured session's graph. Variables created eagerly during the first run
    (a Keras optimizer's slots, a layer built on first call) are put back to
    their initial values before each later run and at the end.
Seeds
    With ``seed=None`` (the default) every run starts from the random state
    found when the audit started: TensorFlow's global seed *and* its op-seed
    counter, NumPy's global ``RandomState`` and Python's ``random``. Resetting
    the global seed also clears TensorFlow's kernel cache, so seeded eager ops
    and the random ops of ``tf.function``\\ s start their sequences again.
    A program with no global seed therefore keeps its unseeded ops random, as
    it would be in production. With ``seed=<int>`` each run starts with
    ``tf.random.set_seed(seed)`` instead (NumPy and Python as above). The
    starting random state is put back at the end.
    Not reset: the state kept by a ``tf.compat.v1.Session`` (see
    ``random_op_state_in_session``), ``tf.random.Generator`` objects unless
    their state variable is among the variables, and iterators.

Sparse gradients
----------------
The gradient of ``tf.gather``/``tf.nn.embedding_lookup`` with respect to the
table is sparse (``tf.IndexedSlices``; ``IndexedSlicesValue`` from a session).
Returned from ``fn``, it is scattered into a dense array and compared
densely, and the report names it (``sparse_outputs``). Applied by an
optimizer inside ``fn``, the variables that the sparse update ops wrote are
named too (``sparse_updates``: the table for TF1's optimizers, the slots for
Keras's); ``report.sparse_note`` says both, in the text, JSON and HTML.

Endpoints
---------
With ``endpoints="end_points"`` (a key of the dict ``fn`` returns) or a
zero-argument callable returning a dict (``lambda: model.end_points``, called
after each run), the report names the first endpoint, in the dict's order, that
differs between runs: where non-determinism enters the forward pass.

Example::

    tf.random.set_seed(0)
    tf.config.experimental.enable_op_determinism()

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        return {"loss": loss}

    report = equivtool.audit_determinism(train_step, runs=3)
    print(report)              # verdict, differing leaves, causes with source lines
    report.raise_for_failure()

From the command line, ``equivtool audit MODULE:FN --runs N`` (see
``equivtool.cli``).

The package: ``_report`` (the report model and its rendering), ``_capture``
(the state a step captures: variables, sessions, random state), ``_causes``
(the op recorder and the cause rules), ``_audit`` (the audit loop) and
``_tf`` (every private TensorFlow symbol it uses).
"""

from __future__ import annotations

from equivtool.determinism.audit import audit_determinism
from equivtool.determinism._causes import CAUSE_KINDS, GPU_NONDETERMINISTIC_OPS, STATEFUL_RANDOM_OPS
from equivtool.determinism._report import Cause, DeterminismReport, LeafDifference

__all__ = [
    "audit_determinism",
    "DeterminismReport",
    "Cause",
    "LeafDifference",
    "CAUSE_KINDS",
    "STATEFUL_RANDOM_OPS",
    "GPU_NONDETERMINISTIC_OPS",
]
