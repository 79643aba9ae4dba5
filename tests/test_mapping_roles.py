"""The mapping needs no hand work on real layouts: roles (depthwise, LSTM), Keras' layer
renumbering, mapping.resolve() and declared transforms (transpose, reshape)."""

import re

import equivtool
import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

from equivtool.variables.mapping import fresh_layer_numbering, propose, renumbering_hint
from equivtool.variables import VariableInfo, VariableSet

v1 = tf.compat.v1


def _set(*items):
    return VariableSet(tuple(VariableInfo(n, tuple(s), "float32", True) for n, s in items), "")


def _images():
    return np.random.RandomState(0).uniform(-1, 1, (2, 6, 6, 3)).astype(np.float32)


# -- a MobileNet-v1-like net: conv, then two depthwise-separable blocks -----------

def slim_mobilenet(inputs, training):
    with v1.variable_scope("MobilenetV1"):
        with slim.arg_scope([slim.conv2d, slim.separable_conv2d], normalizer_fn=slim.batch_norm,
                            normalizer_params={"is_training": training, "decay": 0.9, "epsilon": 1e-3,
                                               "scale": True}):
            net = slim.conv2d(inputs, 4, 3, scope="Conv2d_0")
            for i in (1, 2):
                net = slim.separable_conv2d(net, None, 3, depth_multiplier=1, scope=f"Conv2d_{i}_depthwise")
                net = slim.conv2d(net, 4, 1, scope=f"Conv2d_{i}_pointwise")
    return net


class NativeMobilenet(tf.keras.layers.Layer):
    """Auto-named sublayers: Keras numbers them per process (conv2d, conv2d_1...)."""

    def __init__(self, **kwargs):
        super().__init__(name="MobilenetV1", **kwargs)
        block = lambda layer: [layer, tf.keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-3),  # noqa: E731
                               tf.keras.layers.ReLU()]
        self.body = block(tf.keras.layers.Conv2D(4, 3, padding="same", use_bias=False))
        for _ in (1, 2):
            self.body += block(tf.keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False))
            self.body += block(tf.keras.layers.Conv2D(4, 1, use_bias=False))

    def call(self, inputs, training=None):
        net = inputs
        for layer in self.body:
            net = layer(net, training=training) if isinstance(layer, tf.keras.layers.BatchNormalization) \
                else layer(net)
        return net


def test_mobilenet_depthwise_weights_map_to_depthwise_kernels_with_no_ambiguity():
    mapping = equivtool.map_variables(slim_mobilenet, NativeMobilenet, _images())
    assert mapping.complete and not mapping.ambiguous, mapping.problems()
    for i in (1, 2):
        assert re.fullmatch(r"MobilenetV1/depthwise_conv2d(_\d+)?/depthwise_kernel",
                            mapping.pairs[f"MobilenetV1/Conv2d_{i}_depthwise/depthwise_weights"])
    # The first depthwise layer is paired with the first one, the second with the second.
    first, second = (mapping.pairs[f"MobilenetV1/Conv2d_{i}_depthwise/depthwise_weights"] for i in (1, 2))
    assert first == "MobilenetV1/depthwise_conv2d/depthwise_kernel"
    assert second == "MobilenetV1/depthwise_conv2d_1/depthwise_kernel"


def test_without_the_depthwise_role_the_same_net_would_be_ambiguous():
    # The planted fault for the role: two depthwise kernels whose leaf names are unrelated roles.
    tf1 = _set(("n/a/depthwise_weights", [3, 3, 4, 1]), ("n/b/depthwise_weights", [3, 3, 4, 1]))
    assert propose(tf1, _set(("m/x/depthwise_kernel", [3, 3, 4, 1]),
                             ("m/y/depthwise_kernel", [3, 3, 4, 1]))).complete
    unrelated = propose(tf1, _set(("m/x/other", [3, 3, 4, 1]), ("m/y/other", [3, 3, 4, 1])))
    assert unrelated.ambiguous and not unrelated.pairs


def test_rules_hold_for_layers_renumbered_by_keras_in_the_same_process(tmp_path):
    mapping = equivtool.map_variables(slim_mobilenet, NativeMobilenet, _images())
    for _ in range(3):  # the process makes more layers: a fresh NativeMobilenet() is conv2d_9...
        NativeMobilenet()(_images())
    report = equivtool.check_equivalence(slim_mobilenet, NativeMobilenet, _images(),
                                         steps=["parity", "fixed_weights"], rename=mapping)
    assert report.passed, str(report)
    # A checkpoint converts through the same mapping.
    graph = tf.Graph()
    with graph.as_default(), v1.Session() as session:
        slim_mobilenet(tf.constant(_images()), False)
        session.run(v1.global_variables_initializer())
        prefix = v1.train.Saver().save(session, str(tmp_path / "tf1"))
    written = equivtool.convert_checkpoint(prefix, NativeMobilenet, _images(), str(tmp_path / "tf2"),
                                           rename=mapping)
    assert written.endswith("tf2")


def test_a_renumbered_layer_instance_is_said_to_be_renumbered(tmp_path):
    mapping = equivtool.map_variables(slim_mobilenet, NativeMobilenet, _images())
    graph = tf.Graph()
    with graph.as_default(), v1.Session() as session:
        slim_mobilenet(tf.constant(_images()), False)
        session.run(v1.global_variables_initializer())
        prefix = v1.train.Saver().save(session, str(tmp_path / "tf1"))
    from equivtool.checkpoints.convert import convert
    NativeMobilenet()  # the process's numbering moves on
    made_here = NativeMobilenet()  # conv2d_N with N > 2: made outside the fresh numbering
    made_here(_images())
    with pytest.raises(ValueError, match=r"layer renumbering: .*'MobilenetV1/conv2d_\d+/kernel' here, "
                                         r"'MobilenetV1/conv2d(_\d+)?/kernel' when the mapping was made"):
        convert(prefix, None, _images(), str(tmp_path / "tf2"), rename=mapping, layer=made_here)
    assert not (tmp_path / "tf2.index").exists()
    # The parity step says so with the same sentence (its input: the TF2 names the rules left unmapped).
    hint = renumbering_hint(["MobilenetV1/conv2d_7/kernel"], mapping.renamer())
    assert hint.startswith("layer renumbering: 1 of these") and "'MobilenetV1/conv2d_7/kernel' here" in hint
    assert renumbering_hint(["MobilenetV1/other/kernel"], mapping.renamer()) is None
    assert renumbering_hint(["MobilenetV1/conv2d_7/kernel"], lambda name: name) is None  # plain rules: unknown
    # A mapping that simply does not fit is not called renumbering.
    other = propose(_set(("a/w", [1])), _set(("b/w", [1])))
    with pytest.raises(ValueError) as refused:
        convert(prefix, None, _images(), str(tmp_path / "tf2"), rename=other, layer=made_here)
    assert "renumbering" not in str(refused.value)


def test_fresh_layer_numbering_gives_the_counters_back_even_on_an_exception():
    before = tf.keras.layers.Dense(1).name
    with pytest.raises(RuntimeError):
        with fresh_layer_numbering():
            assert tf.keras.layers.Dense(1).name == "dense"
            raise RuntimeError("inside")
    after = tf.keras.layers.Dense(1).name
    number = lambda name: int(name.rpartition("_")[2]) if "_" in name else 0  # noqa: E731
    assert number(after) == number(before) + 1  # the process's numbering went on as before


# -- LSTM: a fused TF1 cell against Keras' split kernels ---------------------------

def test_fused_lstm_kernel_against_split_keras_kernels_is_refused_by_name():
    tf1 = _set(("rnn/lstm_cell/kernel", [4 + 3, 12]), ("rnn/lstm_cell/bias", [12]))
    tf2 = _set(("lstm/lstm_cell/kernel", [4, 12]), ("lstm/lstm_cell/recurrent_kernel", [3, 12]),
               ("lstm/lstm_cell/bias", [12]))
    mapping = propose(tf1, tf2)
    assert not mapping.complete and not mapping.pairs  # the bias's gate order differs too: not paired
    (tf1_names, tf2_names, why), = mapping.refused
    assert set(tf1_names) == {"rnn/lstm_cell/kernel", "rnn/lstm_cell/bias"}
    assert "lstm/lstm_cell/recurrent_kernel" in tf2_names and "gates" in why
    with pytest.raises(ValueError, match=r"refused: TF1 \['rnn/lstm_cell/kernel'"):
        mapping.require_complete("rename")
    # Not every recurrent_kernel is an LSTM refusal: Keras on both sides maps.
    assert propose(tf2, tf2).complete and not propose(tf2, tf2).refused


# -- resolve() --------------------------------------------------------------------

def test_the_refusal_prints_the_resolve_call_that_completes_the_mapping():
    tf1 = _set(("a/w1", [4, 4]), ("a/w2", [4, 4]), ("a/b", [4]))
    tf2 = _set(("k/x", [4, 4]), ("k/y", [4, 4]), ("k/bias", [4]))
    mapping = propose(tf1, _set(("k/x", [4, 4]), ("k/bias", [4]), ("k/y", [4, 4]), ("k/z", [4, 4])))
    with pytest.raises(ValueError) as refused:
        mapping.require_complete("rename")
    message = str(refused.value)
    assert "the weights cannot be aligned" in message
    call = re.search(r"mapping = mapping\.resolve\(\{.*\}\)", message).group(0)
    assert "'a/w1': 'k/x'" in call and "'a/w2': 'k/y'" in call
    mapping = propose(tf1, tf2)  # names of these shapes, left ambiguous by unrelated roles
    assert mapping.ambiguous
    namespace = {"mapping": mapping}
    with pytest.raises(ValueError) as refused:
        mapping.require_complete("rename")
    exec(re.search(r"mapping = mapping\.resolve\(\{.*\}\)", str(refused.value)).group(0), namespace)
    resolved = namespace["mapping"]
    assert resolved.complete and resolved.pairs == {"a/w1": "k/x", "a/w2": "k/y", "a/b": "k/bias"}
    assert mapping.ambiguous  # the original is left as it was (frozen)


def test_resolve_overrides_a_proposed_pair_and_refuses_what_cannot_be():
    mapping = propose(_set(("a/p", [2, 3]), ("a/q", [2, 3])), _set(("b/p", [2, 3]), ("b/q", [2, 3])))
    assert mapping.pairs == {"a/p": "b/p", "a/q": "b/q"}
    swapped = mapping.resolve({"a/p": "b/q"})  # takes b/q from a/q: a/q is left unmapped
    assert swapped.pairs == {"a/p": "b/q"} and swapped.unmapped_tf1 == ("a/q",)
    assert swapped.unmapped_tf2 == ("b/p",)
    assert swapped.resolve({"a/q": "b/p"}).complete
    with pytest.raises(ValueError, match=r"pairs: 'a/nope' is not a TF1 variable"):
        mapping.resolve({"a/nope": "b/p"})
    with pytest.raises(ValueError, match=r"pairs\['a/p'\]: 'b/nope' is not a TF2 variable"):
        mapping.resolve({"a/p": "b/nope"})
    with pytest.raises(ValueError, match="given for two TF1 variables"):
        mapping.resolve({"a/p": "b/p", "a/q": "b/p"})
    with pytest.raises(TypeError, match=r"pairs\['a/p'\]: expected a TF2 name"):
        mapping.resolve({"a/p": ("b/p", "rotate")})
    with pytest.raises(TypeError, match="pairs: expected a non-empty"):
        mapping.resolve({})
    transposed = propose(_set(("a/w", [3, 16])), _set(("b/kernel", [16, 3])))
    with pytest.raises(ValueError, match=r"needs the same shape \(declare \(tf2_name, 'transpose'\)"):
        transposed.resolve({"a/w": "b/kernel"})
    with pytest.raises(ValueError, match="reshape needs as many elements"):
        propose(_set(("a/w", [3, 15])), _set(("b/kernel", [16, 3]))).resolve({"a/w": ("b/kernel", "reshape")})
    declared = transposed.resolve({"a/w": ("b/kernel", "transpose")})
    assert declared.transforms == (("a/w", "transpose"),)
    # What check_equivalence uses reaches worker processes (workers=2): it pickles, transforms and all.
    import pickle
    renamer = pickle.loads(pickle.dumps(declared.renamer()))
    assert renamer("b/kernel") == "a/w" and renamer.tf1_shape("a/w", (16, 3)) == (3, 16)
    value = np.arange(48.0).reshape(3, 16)
    np.testing.assert_array_equal(renamer.tf1_value("a/w", renamer.tf2_value("a/w", value)), value)
    assert renamer.tf2_value("a/w", value).shape == (16, 3)


# -- declared transforms: a BERT-like head and attention kernels ------------------

HIDDEN, HEADS, CLASSES = 16, 2, 3


def _tokens():
    return np.random.RandomState(1).uniform(-1, 1, (2, 5, HIDDEN)).astype(np.float32)


def tf1_bert_head(inputs, training):
    with v1.variable_scope("bert"):
        query = v1.layers.dense(inputs, HIDDEN, name="query")  # kernel [hidden, hidden]
        pooled = tf.reduce_mean(query, axis=1)
        weights = v1.get_variable("output_weights", [CLASSES, HIDDEN],
                                  initializer=v1.truncated_normal_initializer(stddev=0.02))
        bias = v1.get_variable("output_bias", [CLASSES], initializer=v1.zeros_initializer())
        return tf.matmul(pooled, weights, transpose_b=True) + bias


class NativeBertHead(tf.keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(name="bert", **kwargs)
        self.query = tf.keras.layers.EinsumDense("abc,cde->abde", output_shape=(None, HEADS, HIDDEN // HEADS),
                                                 bias_axes="de", name="query")
        self.head = tf.keras.layers.Dense(CLASSES, name="classifier")

    def call(self, inputs, training=None):
        query = self.query(inputs)
        query = tf.reshape(query, tf.concat([tf.shape(query)[:2], [HIDDEN]], 0))
        return self.head(tf.reduce_mean(query, axis=1))


BERT_PAIRS = {"bert/output_weights": ("bert/classifier/kernel", "transpose"),
              "bert/query/kernel": ("bert/query/kernel", "reshape"),
              "bert/query/bias": ("bert/query/bias", "reshape")}


@pytest.fixture(scope="module")
def bert_mapping():
    return equivtool.map_variables(tf1_bert_head, NativeBertHead, _tokens())


def test_bert_head_and_attention_kernels_map_through_declared_transforms(bert_mapping):
    assert not bert_mapping.complete  # [3,16] against [16,3], [16,16] against [16,2,8]
    # The refusal suggests the transforms (never applied unasked): its call is the one that completes it.
    assert bert_mapping.suggestions() == BERT_PAIRS
    with pytest.raises(ValueError) as refused:
        bert_mapping.require_complete("rename")
    namespace = {"mapping": bert_mapping}
    exec(re.search(r"mapping = mapping\.resolve\(\{.*\}\)", str(refused.value)).group(0), namespace)
    assert namespace["mapping"].complete
    mapping = bert_mapping.resolve(BERT_PAIRS)
    assert mapping.complete, mapping.problems()
    assert "transpose (declared)" in str(mapping)
    report = equivtool.check_equivalence(tf1_bert_head, NativeBertHead, _tokens(),
                                         steps=["parity", "fixed_weights", "gradients"], rename=mapping)
    assert report.passed, str(report)


def test_a_transposed_kernel_left_untransposed_is_caught(bert_mapping):
    # 'reshape' keeps the element order: the kernel is read as stored, untransposed.
    slip = bert_mapping.resolve(dict(BERT_PAIRS, **{"bert/output_weights": ("bert/classifier/kernel", "reshape")}))
    assert slip.complete
    report = equivtool.check_equivalence(tf1_bert_head, NativeBertHead, _tokens(),
                                         steps=["parity", "fixed_weights"], rename=slip)
    assert not report.passed
    assert report.step("fixed_weights").status == "failed", str(report)


def test_a_checkpoint_converts_through_the_transforms_and_the_slip_is_caught(bert_mapping, tmp_path):
    graph = tf.Graph()
    with graph.as_default(), v1.Session() as session:
        logits = tf1_bert_head(tf.constant(_tokens()), False)
        session.run(v1.global_variables_initializer())
        expected = session.run(logits)
        prefix = v1.train.Saver().save(session, str(tmp_path / "tf1"))

    def converted_logits(mapping, name):
        path = equivtool.convert_checkpoint(prefix, NativeBertHead, _tokens(), str(tmp_path / name),
                                            rename=mapping)
        layer = NativeBertHead()
        layer(_tokens())
        tf.train.Checkpoint(model=layer).read(path).assert_existing_objects_matched()
        return layer(_tokens()).numpy()

    np.testing.assert_allclose(converted_logits(bert_mapping.resolve(BERT_PAIRS), "ok"), expected,
                               rtol=1e-5, atol=1e-6)
    slip = bert_mapping.resolve(dict(BERT_PAIRS, **{"bert/output_weights": ("bert/classifier/kernel", "reshape")}))
    assert not np.allclose(converted_logits(slip, "slip"), expected, rtol=1e-5, atol=1e-6)


# -- a declared optimizer layout: BERT's AdamWeightDecayOptimizer -------------------

def _bert_adam_weight_decay_checkpoint(prefix: str) -> str:
    """The layout BERT's optimizer saves: m and v as plain variables <var>/adam_m, <var>/adam_v."""
    graph = tf.Graph()
    with graph.as_default(), v1.Session() as session:
        tf1_bert_head(tf.constant(_tokens()), True)
        for variable in v1.trainable_variables():
            for suffix in ("adam_m", "adam_v"):
                v1.get_variable(f"{variable.op.name}/{suffix}", variable.shape, trainable=False,
                                initializer=v1.random_uniform_initializer(0.0, 1.0, seed=len(suffix)))
        step = v1.train.get_or_create_global_step()
        session.run(v1.global_variables_initializer())
        session.run(step.assign(7))
        return v1.train.Saver().save(session, prefix)


def test_bert_adam_weight_decay_state_converts_through_slot_layout(bert_mapping, tmp_path):
    from equivtool.checkpoints.convert import convert
    path = _bert_adam_weight_decay_checkpoint(str(tmp_path / "bert"))
    reader = tf.train.load_checkpoint(path)
    mapping = bert_mapping.resolve(BERT_PAIRS)
    with pytest.raises(ValueError, match=r"unknown TF1 optimizer slot layout 'adam_m'.*slot_layout="):
        convert(path, NativeBertHead, _tokens(), str(tmp_path / "refused"), rename=mapping,
                optimizer=lambda: tf.keras.optimizers.AdamW(0.01, weight_decay=0.01))
    conversion, layer, optimizer = convert(
        path, NativeBertHead, _tokens(), str(tmp_path / "tf2"), rename=mapping,
        optimizer=lambda: tf.keras.optimizers.AdamW(0.01, weight_decay=0.01, epsilon=1e-6),
        slot_layout=equivtool.ADAM_WEIGHT_DECAY)
    assert conversion.iterations == 7 and len(conversion.slots) == 2 * len(layer.trainable_variables)
    slots = {v.name.split(":")[0]: v.numpy() for v in optimizer.variables()}
    kernel_m = [value for name, value in slots.items() if re.fullmatch(r"m/bert/classifier/kernel", name)]
    query_v = [value for name, value in slots.items() if re.fullmatch(r"v/bert/query/kernel", name)]
    # The declared transforms apply to the slots as to the variables.
    np.testing.assert_array_equal(kernel_m[0], reader.get_tensor("bert/output_weights/adam_m").T)
    np.testing.assert_array_equal(query_v[0], reader.get_tensor("bert/query/kernel/adam_v").reshape(16, 2, 8))
    text = str(conversion)
    for stated in ("bias correction", "weight decay", "exclusion list", "weight_decay=0.01"):
        assert stated in text, text
    with pytest.raises(ValueError, match="converts to tf.keras.optimizers.AdamW or tf.keras.optimizers.Adam, not SGD"):
        convert(path, NativeBertHead, _tokens(), str(tmp_path / "sgd"), rename=mapping,
                optimizer=lambda: tf.keras.optimizers.SGD(0.1), slot_layout=equivtool.ADAM_WEIGHT_DECAY)
    with pytest.raises(TypeError, match="slot_layout: expected an equivtool.SlotLayout"):
        convert(path, NativeBertHead, _tokens(), str(tmp_path / "x"), rename=mapping, slot_layout="bert")
    assert not any(p.name.startswith(("sgd", "x.", "refused")) for p in tmp_path.iterdir())


def test_suggestions_are_one_to_one_or_none():
    # Two transposed candidates for one TF1 kernel: nothing is suggested (it would be a guess).
    two = propose(_set(("a/w", [3, 16])), _set(("b/kernel", [16, 3]), ("c/kernel", [16, 3])))
    assert two.suggestions() == {} and not two.complete
    one = propose(_set(("a/w", [3, 16]), ("a/q/kernel", [4, 4])), _set(("b/kernel", [16, 3]), ("c/kernel", [2, 8])))
    assert one.suggestions() == {"a/w": ("b/kernel", "transpose"), "a/q/kernel": ("c/kernel", "reshape")}
    # A reshape needs the same role: an unrelated variable of as many elements is not suggested.
    assert propose(_set(("a/moving_mean", [16])), _set(("b/kernel", [2, 8]))).suggestions() == {}


class WeightDecayAdam(v1.train.Optimizer):
    """The state layout of BERT's AdamWeightDecayOptimizer, written for this test: m and v as plain
    variables <var>/adam_m and <var>/adam_v, no bias correction, decay added to the update."""

    def __init__(self, learning_rate=0.01, weight_decay=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-6):
        super().__init__(False, "WeightDecayAdam")
        self.hyper = (learning_rate, weight_decay, beta_1, beta_2, epsilon)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        lr, decay, beta_1, beta_2, epsilon = self.hyper
        updates = []
        for gradient, variable in grads_and_vars:
            state = [v1.get_variable(f"{variable.op.name}/{suffix}", variable.shape, variable.dtype.base_dtype,
                                     trainable=False, initializer=v1.zeros_initializer())
                     for suffix in ("adam_m", "adam_v")]
            m = beta_1 * state[0] + (1 - beta_1) * gradient
            v = beta_2 * state[1] + (1 - beta_2) * tf.square(gradient)
            step = m / (tf.sqrt(v) + epsilon) + (0.0 if "bias" in variable.op.name else decay * variable)
            updates += [variable.assign_sub(lr * step), state[0].assign(m), state[1].assign(v)]
        if global_step is not None:
            updates.append(global_step.assign_add(1))
        return tf.group(*updates)


def _late_in_training(path: str, prefix: str, global_step: int) -> str:
    """The checkpoint at ``path`` with ``global_step`` set: far enough into training that tf-keras'
    bias correction is 1 in float32 (0.999 ** 100001 underflows), so the two updates are the same."""
    reader = tf.train.load_checkpoint(path)
    graph = tf.Graph()
    with graph.as_default(), v1.Session() as session:
        values = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
        values["global_step"] = np.int64(global_step)
        variables = {name: v1.Variable(value, name=name) for name, value in values.items()}
        session.run(v1.global_variables_initializer())
        return v1.train.Saver(var_list=variables).save(session, prefix)


def _adamw(epsilon=1e-6):
    optimizer = tf.keras.optimizers.AdamW(0.01, weight_decay=0.01, epsilon=epsilon)
    optimizer.exclude_from_weight_decay(var_names=["bias"])  # as WeightDecayAdam's exclusion
    return optimizer


def test_the_resume_step_converts_through_slot_layout_and_states_the_differences(bert_mapping, tmp_path):
    from tests.checkpoint_models import train_tf1
    early = train_tf1(tf1_bert_head, _tokens(), WeightDecayAdam, 3, str(tmp_path / "bert"))
    assert tf.train.load_checkpoint(early).has_tensor("bert/query/kernel/adam_v")
    late = _late_in_training(early, str(tmp_path / "late"), 100000)
    mapping = bert_mapping.resolve(BERT_PAIRS)

    def run(path, make_tf2=_adamw, **kwargs):
        return equivtool.check_equivalence(
            tf1_bert_head, NativeBertHead, _tokens(), rename=mapping, checkpoint=path,
            optimizers=(WeightDecayAdam, make_tf2), steps=["resume"], train_steps=2, **kwargs).step("resume")

    undeclared = run(late)
    assert undeclared.status == "error" and "unknown TF1 optimizer slot layout 'adam_m'" in undeclared.message
    # Late in training the updates agree: the converted m, v (transposed, reshaped) resume exactly.
    resumed = run(late, slot_layout=equivtool.ADAM_WEIGHT_DECAY)
    assert resumed.status == "passed", resumed.message
    notes = "\n".join(resumed.notes)
    assert "iterations=100000" in notes and "conversion: bias correction: AdamWeightDecayOptimizer has none" in notes
    # Early in training tf-keras' bias correction makes them differ: stated, and not hidden.
    assert run(early, slot_layout=equivtool.ADAM_WEIGHT_DECAY).status == "failed"
    # A planted slip: AdamW's default epsilon instead of the TF1 run's.
    assert run(late, make_tf2=lambda: _adamw(epsilon=1e-7), slot_layout=equivtool.ADAM_WEIGHT_DECAY).status == "failed"
    with pytest.raises(TypeError, match="slot_layout: expected an equivtool.SlotLayout"):
        run(late, slot_layout="bert")
