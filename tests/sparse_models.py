"""Two small NLP models with embedding lookups (sparse gradients), TF1 code and TF2 shims.

* ``lstm_lm``: token embedding, one LSTM layer under ``dynamic_rnn``, a softmax
  projection to the vocabulary (an LSTM language model).
* ``bert_encoder``: token, position and segment-free embeddings, two
  transformer blocks (multi-head self-attention, layer norm, GELU feed-forward,
  dropout), and a tanh pooler over the first token (a BERT-style encoder).

Both are written with ``tf.compat.v1`` (``get_variable``, ``layers.dense``),
the way TF1 NLP code was; the shims run the same code under
``track_tf1_style_variables``.
"""

from __future__ import annotations

import equivtool  # noqa: F401  (environment fix before TensorFlow)
import numpy as np
import tensorflow as tf

v1 = tf.compat.v1

VOCAB, EMBED, HIDDEN, SEQ, BATCH = 50, 16, 16, 6, 2
HEADS, LAYERS = 2, 2


def token_ids(seed: int = 0) -> np.ndarray:
    """A batch of token ids with a repeated id (its gradient rows add up)."""
    ids = np.random.RandomState(seed).randint(0, VOCAB, size=(BATCH, SEQ)).astype(np.int32)
    ids[0, 0] = ids[1, 3] = 7
    return ids


def lstm_lm(ids, training: bool, dropout: float = 0.0):
    with v1.variable_scope("lstm_lm"):
        table = v1.get_variable("embedding", [VOCAB, EMBED],
                                initializer=v1.random_uniform_initializer(-0.1, 0.1))
        inputs = tf.nn.embedding_lookup(table, ids)
        cell = v1.nn.rnn_cell.LSTMCell(HIDDEN, name="lstm_cell")
        if dropout and training:
            cell = v1.nn.rnn_cell.DropoutWrapper(cell, output_keep_prob=1.0 - dropout)
        outputs, _ = v1.nn.dynamic_rnn(cell, inputs, dtype=tf.float32)
        logits = v1.layers.dense(outputs, VOCAB, name="softmax")
    return {"embedded": inputs, "lstm": outputs, "logits": logits}


def _layer_norm(x, name):
    with v1.variable_scope(name):
        gamma = v1.get_variable("gamma", [x.shape[-1]], initializer=v1.ones_initializer())
        beta = v1.get_variable("beta", [x.shape[-1]], initializer=v1.zeros_initializer())
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(variance + 1e-12) * gamma + beta


def _dropout(x, training):
    return v1.layers.dropout(x, rate=0.1, training=training)


def bert_encoder(ids, training: bool):
    end_points = {}
    init = v1.truncated_normal_initializer(stddev=0.02)
    with v1.variable_scope("bert"):
        with v1.variable_scope("embeddings"):
            words = v1.get_variable("word_embeddings", [VOCAB, HIDDEN], initializer=init)
            positions = v1.get_variable("position_embeddings", [SEQ, HIDDEN], initializer=init)
            x = tf.gather(words, ids) + positions[tf.newaxis]
            x = _dropout(_layer_norm(x, "LayerNorm"), training)
        end_points["embeddings"] = x
        head = HIDDEN // HEADS
        for i in range(LAYERS):
            with v1.variable_scope(f"layer_{i}"):
                def split(t):
                    return tf.transpose(tf.reshape(t, [BATCH, SEQ, HEADS, head]), [0, 2, 1, 3])
                q = split(v1.layers.dense(x, HIDDEN, kernel_initializer=init, name="query"))
                k = split(v1.layers.dense(x, HIDDEN, kernel_initializer=init, name="key"))
                v = split(v1.layers.dense(x, HIDDEN, kernel_initializer=init, name="value"))
                scores = tf.matmul(q, k, transpose_b=True) / float(np.sqrt(head))
                probs = _dropout(tf.nn.softmax(scores), training)
                context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [BATCH, SEQ, HIDDEN])
                attention = _dropout(v1.layers.dense(context, HIDDEN, kernel_initializer=init, name="output"),
                                     training)
                x = _layer_norm(x + attention, "attention_LayerNorm")
                inner = v1.layers.dense(x, 4 * HIDDEN, activation=tf.nn.gelu, kernel_initializer=init,
                                        name="intermediate")
                out = _dropout(v1.layers.dense(inner, HIDDEN, kernel_initializer=init, name="ffn_output"),
                               training)
                x = _layer_norm(x + out, "output_LayerNorm")
            end_points[f"layer_{i}"] = x
        pooled = v1.layers.dense(x[:, 0], HIDDEN, activation=tf.tanh, kernel_initializer=init, name="pooler")
        end_points["pooled"] = pooled
    return end_points


class Shim(tf.keras.layers.Layer):
    """Any of the TF1 functions above, run as a TF2 layer."""

    def __init__(self, fn, **kwargs):
        super().__init__()
        self.fn = fn
        self.fn_kwargs = kwargs

    @v1.keras.utils.track_tf1_style_variables
    def call(self, ids, training=None):
        return self.fn(ids, bool(training), **self.fn_kwargs)
