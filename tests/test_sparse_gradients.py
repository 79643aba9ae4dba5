"""Sparse gradients (tf.IndexedSlices) through the engine and the determinism audit.

The gradient of ``tf.nn.embedding_lookup``/``tf.gather`` w.r.t. the table is
``tf.IndexedSlices`` (eager) or an ``IndexedSlicesValue`` (session). Both are
compared densely, and the steps say that they were sparse. Two NLP models of
our own (tests/sparse_models.py): an LSTM language model and a BERT-style
encoder, each through every default step plus one SGD step.
"""

import equivtool
import numpy as np
import pytest
import tensorflow as tf

from equivtool._base.tree import dense_gradient, to_numpy
from tests import sparse_models as sm

SGD = (lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1), lambda: tf.keras.optimizers.SGD(0.1))
ALL_STEPS = ["variables_once", "parity", "fixed_weights", "random/constant/inference",
             "random/constant/training", "random/num_random_ops/inference",
             "random/num_random_ops/training", "gradients", "optimizer"]


# -- densifying ---------------------------------------------------------------

def test_dense_gradient_sums_repeated_rows_of_eager_indexed_slices():
    table = tf.Variable(tf.ones([5, 2]))
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(tf.gather(table, [1, 3, 1]) * [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    grad = tape.gradient(y, table)
    assert isinstance(grad, tf.IndexedSlices)
    dense, sparse = dense_gradient(grad)
    assert sparse
    np.testing.assert_array_equal(dense, [[0, 0], [6, 8], [0, 0], [3, 4], [0, 0]])
    np.testing.assert_array_equal(to_numpy({"g": grad})["g"], dense)


def test_dense_gradient_of_a_session_value_and_of_a_dense_tensor():
    with tf.Graph().as_default():
        table = tf.compat.v1.get_variable("t", [4, 3], initializer=tf.compat.v1.ones_initializer())
        grad = tf.gradients(tf.reduce_sum(tf.gather(table, [2, 2, 0])), table)[0]
        with tf.compat.v1.Session() as session:
            session.run(table.initializer)
            value = session.run(grad)
    assert type(value).__name__ == "IndexedSlicesValue"
    dense, sparse = dense_gradient(value)
    assert sparse
    np.testing.assert_array_equal(dense, [[1, 1, 1], [0, 0, 0], [2, 2, 2], [0, 0, 0]])
    plain, sparse = dense_gradient(tf.constant([1.0, 2.0]))
    assert not sparse
    np.testing.assert_array_equal(plain, [1.0, 2.0])


def test_dense_gradient_without_dense_shape_needs_the_variable_shape():
    slices = tf.IndexedSlices(tf.constant([[1.0, 2.0]]), tf.constant([1]))
    with pytest.raises(ValueError, match="variable's shape"):
        dense_gradient(slices)
    np.testing.assert_array_equal(dense_gradient(slices, (3, 2))[0], [[0, 0], [1, 2], [0, 0]])


# -- the two models ------------------------------------------------------------

def _statuses(report):
    return {step.name: step.status for step in report.steps}


def _check_sparse_model(report, table_key, table_shape):
    assert _statuses(report) == {name: "passed" for name in ALL_STEPS}, str(report)
    gradients = next(s for s in report.steps if s.name == "gradients")
    assert any("sparse gradients" in note and table_key in note for note in gradients.notes)
    leaf = next(leaf for c in gradients.comparisons for leaf in c.leaves if leaf.name.endswith(table_key))
    # the sparse gradient was really compared: every element of the dense table
    assert leaf.values_compared and leaf.size == int(np.prod(table_shape)) and leaf.mismatched == 0
    optimizer = next(s for s in report.steps if s.name == "optimizer")
    assert any("sparse gradients" in note for note in optimizer.notes)


def test_lstm_language_model_passes_every_step_eagerly():
    report = equivtool.check_equivalence(sm.lstm_lm, lambda: sm.Shim(sm.lstm_lm), sm.token_ids(),
                                         optimizers=SGD, train_steps=1)
    _check_sparse_model(report, "lstm_lm/embedding", (sm.VOCAB, sm.EMBED))


def test_bert_style_encoder_passes_every_step_with_tf_function():
    report = equivtool.check_equivalence(sm.bert_encoder, lambda: sm.Shim(sm.bert_encoder), sm.token_ids(),
                                         optimizers=SGD, train_steps=1, tf_function=True)
    _check_sparse_model(report, "bert/embeddings/word_embeddings", (sm.VOCAB, sm.HIDDEN))


def _halved_embedding_gradient(ids, training):
    """The LSTM LM, but the TF2 side's embedding gradient is halved (same forward values)."""
    original = tf.nn.embedding_lookup

    def lookup(table, ids_):
        looked_up = original(table, ids_)
        return 0.5 * looked_up + 0.5 * tf.stop_gradient(looked_up)

    tf.nn.embedding_lookup = lookup
    try:
        return sm.lstm_lm(ids, training)
    finally:
        tf.nn.embedding_lookup = original


def test_a_wrong_sparse_gradient_fails_the_gradients_step_at_the_table():
    report = equivtool.check_equivalence(sm.lstm_lm, lambda: sm.Shim(_halved_embedding_gradient),
                                         sm.token_ids(), steps=["gradients"])
    gradients = report.steps[0]
    assert gradients.status == "failed"
    failures = [leaf.name for c in gradients.comparisons for leaf in c.failures]
    assert failures == ["gradients/lstm_lm/embedding"], failures


# -- audit_determinism -----------------------------------------------------------

def test_audit_determinism_compares_sparse_gradients_densely():
    table = tf.Variable(tf.reshape(tf.range(12, dtype=tf.float32), [6, 2]))
    ids = tf.constant([0, 4, 4, 1])

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.gather(table, ids)))
        return {"loss": loss, "table_gradient": tape.gradient(loss, table)}

    report = equivtool.audit_determinism(step, runs=2, variables=[table])
    assert report.reproducible, str(report)
    leaf = next(leaf for c in report.comparisons for leaf in c.leaves if leaf.name.endswith("table_gradient"))
    assert leaf.values_compared and leaf.size == 12


def _lstm_train_step(use_tf_function: bool):
    """A Keras SGD training step of the LSTM LM's shim; returns the step and the table variable."""
    model, optimizer, ids = sm.Shim(sm.lstm_lm), tf.keras.optimizers.SGD(0.1), tf.constant(sm.token_ids())
    model(ids, training=True)  # build the variables
    table = next(v for v in model.trainable_variables if "embedding" in v.name)

    def step():
        with tf.GradientTape() as tape:
            logits = model(ids, training=True)["logits"]
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids, logits=logits))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {"loss": loss, "table_gradient": grads[model.trainable_variables.index(table)]}

    return (tf.function(step) if use_tf_function else step), model, table


@pytest.mark.parametrize("use_tf_function", [False, True], ids=["eager", "tf_function"])
def test_audit_of_a_tf2_embedding_training_step_names_its_sparse_gradients(use_tf_function):
    step, model, table = _lstm_train_step(use_tf_function)
    before = [v.numpy() for v in model.variables]
    report = equivtool.audit_determinism(step, runs=2)
    assert report.passed, str(report)
    table_leaf = "variables/" + table.name.rsplit(":", 1)[0]
    assert table_leaf in report.leaf_names
    assert report.sparse_outputs == ("outputs/table_gradient",), report.sparse_outputs
    # Keras's SGD scatters the sparse gradient into its momentum slot for the table, then adds that; the
    # slot is a compared leaf (created in run 1 eagerly, found in the traced graph with tf.function)
    (slot,) = [name for name in report.leaf_names if name.startswith("variables/SGD/m/" + table_leaf[10:])]
    assert report.sparse_updates == (f"{slot} by ResourceScatterAdd",), report.sparse_updates
    assert f"note: {report.sparse_note}" in str(report)
    assert "outputs/table_gradient" in report.sparse_note and slot in report.sparse_note
    leaf = next(leaf for leaf in report.comparisons[0].leaves if leaf.name == "outputs/table_gradient")
    assert leaf.values_compared and leaf.size == sm.VOCAB * sm.EMBED  # compared densely
    for v, value in zip(model.variables, before):  # the audit put the trained variables back
        np.testing.assert_array_equal(v.numpy(), value)


def test_audit_of_a_tf1_session_embedding_training_step_names_its_sparse_gradients():
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.constant(sm.token_ids())
        logits = sm.lstm_lm(ids, training=True)["logits"]
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids, logits=logits))
        table = next(v for v in tf.compat.v1.trainable_variables() if "embedding" in v.name)
        optimizer = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
        grads_and_vars = optimizer.compute_gradients(loss)
        table_gradient = next(g for g, v in grads_and_vars if v is table)
        train_op = optimizer.apply_gradients(grads_and_vars)
        init = tf.compat.v1.global_variables_initializer()
    session = tf.compat.v1.Session(graph=graph)
    session.run(init)

    def step():
        fetched = session.run({"loss": loss, "table_gradient": table_gradient, "train": train_op})
        return {"loss": fetched["loss"], "table_gradient": fetched["table_gradient"]}

    try:
        report = equivtool.audit_determinism(step, runs=2, session=session)
        # reproducible; the graph's (unseeded, never re-run) initializers are reported as causes
        assert report.reproducible and report.compared_anything, str(report)
        assert type(session.run(table_gradient)).__name__ == "IndexedSlicesValue"
        assert report.sparse_outputs == ("outputs/table_gradient",), report.sparse_outputs
        assert report.sparse_updates == ("variables/lstm_lm/embedding by ResourceSparseApplyMomentum",), \
            report.sparse_updates
        assert "variables/lstm_lm/embedding" in report.leaf_names
    finally:
        session.close()


@pytest.mark.parametrize("use_tf_function", [False, True], ids=["eager", "tf_function"])
def test_audit_of_a_dense_training_step_has_no_sparse_note(use_tf_function):
    w = tf.Variable(tf.reshape(tf.range(6, dtype=tf.float32), [3, 2]))
    x = tf.constant([[1.0, 0.0, 2.0]])
    optimizer = tf.keras.optimizers.SGD(0.1)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(x @ w))
        grad = tape.gradient(loss, w)
        optimizer.apply_gradients([(grad, w)])
        return {"loss": loss, "gradient": grad}

    report = equivtool.audit_determinism(tf.function(step) if use_tf_function else step, runs=2)
    assert report.passed, str(report)
    assert report.sparse_outputs == () and report.sparse_updates == () and report.sparse_note is None
    assert "sparse gradients" not in str(report)
    assert report.to_dict()["sparse_note"] is None
