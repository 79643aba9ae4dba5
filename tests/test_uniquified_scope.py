"""Issue 23, item 2: the variables_once hint names a uniquified scope
(``bert_1/`` beside ``bert/``, as ``variable_scope(None, default_name=...)``
gives on every call) and says what to do."""

import re

import numpy as np
import pytest
import tensorflow as tf

import equivtool
from equivtool.variables.guards import second_call_message, uniquified_scope

GENERIC = ("Variable bert_1/word_embeddings was about to be created inside assert_no_variable_creations(): "
           "shape=(11, 8), dtype=float32, trainable=True, requested at m.py:3 in f. Every variable must be "
           "created on the first call and reused afterwards; in a shim layer, create variables with ...")


@pytest.mark.parametrize("created, existing, expected", [
    ("bert_1/word_embeddings", ["bert/word_embeddings:0"], ("bert_1", "bert")),
    ("layer/bert_1/attention/query/kernel:0", ["layer/bert/attention/query/kernel:0"],
     ("layer/bert_1", "layer/bert")),
    ("enc/block_2/w", ["x/enc/block/w:0"], ("enc/block_2", "enc/block")),
    ("bert_3/kernel", ["bert_2/kernel:0"], ("bert_3", "bert_2")),  # after earlier copies
    ("a_1/kernel", ["b/kernel:0"], None),
    ("bert_1/kernel", ["bert_1/kernel:0"], None),  # the same variable is no copy
    ("bert_1/word_embeddings", ["bert/other:0"], None),
    ("word_embeddings_1", ["word_embeddings:0"], None),  # the variable's own name is no scope
])
def test_uniquified_scope_is_matched_by_structure(created, existing, expected):
    assert uniquified_scope(created, existing) == expected


def test_message_names_the_cause_and_the_remedy_only_when_it_applies():
    message = second_call_message(GENERIC, ["bert/word_embeddings:0"])
    assert "scope bert_1/ is a uniquified copy of bert/" in message
    assert "default_name" in message and "Pass an explicit scope, or reuse" in message
    assert "get_variable or tf-slim" not in message
    assert second_call_message(GENERIC, ["other/w:0"]) == GENERIC


def _default_name_tf1(x, training):
    with tf.compat.v1.variable_scope(None, default_name="bert"):  # a new name on every call
        w = tf.compat.v1.get_variable("kernel", [4, 3], initializer=tf.compat.v1.ones_initializer())
        return tf.matmul(x, w)


class DefaultNameShim(tf.keras.layers.Layer):
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, x, training=None):
        return _default_name_tf1(x, training)


X = np.ones((2, 4), np.float32)


def test_default_name_layer_fails_variables_once_with_the_hint():
    report = equivtool.check_equivalence(_default_name_tf1, DefaultNameShim, X, steps=["variables_once"])
    step = report.step("variables_once")
    assert step.status == "failed", step.message
    # the suffixes depend on how often this process has entered "bert" scopes before
    found = re.search(r"scope (bert(?:_\d+)?)/ is a uniquified copy of (bert(?:_\d+)?)/", step.message)
    assert found and found.group(1) != found.group(2), step.message
    assert "Pass an explicit scope, or reuse" in step.message and "default_name" in step.message


def test_creates_variables_once_decorator_gives_the_same_hint():
    class Shim(tf.keras.layers.Layer):
        @equivtool.creates_variables_once
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, x, training=None):
            return _default_name_tf1(x, training)

    layer = Shim()
    layer(X)
    with pytest.raises(equivtool.VariableCreationError, match="Pass an explicit scope, or reuse"):
        layer(X)


def test_default_name_under_tf_function_gets_the_same_remedy():
    from equivtool._base.errors import SINGLETON_HINT
    from published_models import EncoderShim, encoder, token_inputs
    report = equivtool.check_equivalence(encoder, lambda: EncoderShim(scope=None), token_inputs(),
                                         steps=["parity"], tf_function=True)
    step = report.step("parity")
    assert step.status == "error" and step.message.endswith(SINGLETON_HINT), step.message
