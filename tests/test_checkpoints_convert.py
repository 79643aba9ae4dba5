"""convert_checkpoint: a TF1 checkpoint with its optimizer state written as a TF2 checkpoint; bad input named, nothing written."""

import os
import re

import equivtool
import numpy as np
import pytest
import tensorflow as tf

from equivtool.checkpoints.convert import convert
from equivtool.variables.mapping import VariableMapping
from tests import checkpoint_models as cm
from tests.checkpoint_models import rewrite_checkpoint as _rewrite

v1 = tf.compat.v1


@pytest.fixture(scope="module")
def mapping():
    return equivtool.map_variables(cm.slim_net, cm.NativeNet, cm.images())


@pytest.fixture(scope="module")
def adam_ckpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("adam")
    return cm.train_tf1(cm.slim_net, cm.images(), lambda: v1.train.AdamOptimizer(0.01), 5, str(folder / "model"))


def _read_back(prefix, make_optimizer):
    layer = cm.NativeNet()
    layer(cm.images(), training=False)
    optimizer = make_optimizer()
    optimizer.build(layer.trainable_variables)
    tf.train.Checkpoint(model=layer, optimizer=optimizer).read(prefix).assert_existing_objects_matched()
    slots = {v.name.split(":")[0].split("/")[0] + "/" + v.name.split("/", 1)[1].split(":")[0].replace(
        layer.name, "net", 1): v.numpy() for v in optimizer.variables() if "/" in v.name}
    return layer, optimizer, slots


def _slot(slots, keras_slot, layer_scope, leaf):
    found = [v for k, v in slots.items() if k.startswith(keras_slot + "/") and f"/{layer_scope}" in k
             and k.endswith("/" + leaf)]
    assert len(found) == 1, (keras_slot, layer_scope, leaf, list(slots))
    return found[0]


def test_adam_state_and_iterations_survive_the_round_trip(adam_ckpt, mapping, tmp_path):
    prefix = equivtool.convert_checkpoint(adam_ckpt, cm.NativeNet, cm.images(), tmp_path / "tf2", rename=mapping,
                                          optimizer=lambda: tf.keras.optimizers.Adam(0.01, epsilon=1e-8))
    assert prefix == str(tmp_path / "tf2") and sorted(os.listdir(tmp_path)) == [
        "tf2.data-00000-of-00001", "tf2.index"]
    reader = tf.train.load_checkpoint(adam_ckpt)
    layer, optimizer, slots = _read_back(prefix, lambda: tf.keras.optimizers.Adam(0.01))
    assert int(optimizer.iterations.numpy()) == 5
    np.testing.assert_array_equal(layer.conv.kernel.numpy(), reader.get_tensor("net/conv1/weights"))
    np.testing.assert_array_equal(layer.bn.moving_variance.numpy(), reader.get_tensor("net/bn1/moving_variance"))
    np.testing.assert_array_equal(_slot(slots, "m", "conv2d", "kernel"), reader.get_tensor("net/conv1/weights/Adam"))
    np.testing.assert_array_equal(_slot(slots, "v", "dense", "bias"), reader.get_tensor("net/logits/biases/Adam_1"))
    assert np.abs(reader.get_tensor("net/logits/biases/Adam_1")).max() > 0  # a slot that was really trained


def test_momentum_accumulator_becomes_a_velocity(mapping, tmp_path):
    path = cm.train_tf1(cm.slim_net, cm.images(), lambda: v1.train.MomentumOptimizer(0.05, 0.9, use_nesterov=True),
                        3, str(tmp_path / "tf1"))
    prefix = equivtool.convert_checkpoint(path, cm.NativeNet, cm.images(), tmp_path / "tf2", rename=mapping,
                                          optimizer=tf.keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True))
    _, optimizer, slots = _read_back(prefix, lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True))
    accumulation = tf.train.load_checkpoint(path).get_tensor("net/conv1/weights/Momentum")
    np.testing.assert_allclose(_slot(slots, "m", "conv2d", "kernel"), -0.05 * accumulation, rtol=1e-6)
    assert int(optimizer.iterations.numpy()) == 3


def test_centered_rmsprop_and_adagrad_slots(mapping, tmp_path):
    path = cm.train_tf1(cm.slim_net, cm.images(), lambda: v1.train.RMSPropOptimizer(0.01, momentum=0.5, centered=True),
                        2, str(tmp_path / "rms"))
    with pytest.raises(ValueError, match=r"centered=False but the TF1 checkpoint is centered"):
        equivtool.convert_checkpoint(path, cm.NativeNet, cm.images(), tmp_path / "bad", rename=mapping,
                                     optimizer=tf.keras.optimizers.RMSprop(0.01, momentum=0.5))
    assert not [n for n in os.listdir(tmp_path) if n.startswith("bad")]
    prefix = equivtool.convert_checkpoint(path, cm.NativeNet, cm.images(), tmp_path / "rms2", rename=mapping,
                                          optimizer=tf.keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True))
    _, _, slots = _read_back(prefix, lambda: tf.keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True))
    reader = tf.train.load_checkpoint(path)
    for keras_slot, suffix in (("velocity", "RMSProp"), ("average_gradient", "RMSProp_1"), ("momentum", "RMSProp_2")):
        np.testing.assert_array_equal(_slot(slots, keras_slot, "dense", "kernel"),
                                      reader.get_tensor(f"net/logits/weights/{suffix}"))
    path = cm.train_tf1(cm.slim_net, cm.images(), lambda: v1.train.AdagradOptimizer(0.01), 2, str(tmp_path / "ada"))
    prefix = equivtool.convert_checkpoint(path, cm.NativeNet, cm.images(), tmp_path / "ada2", rename=mapping,
                                          optimizer=tf.keras.optimizers.Adagrad(0.01, epsilon=0.0))
    _, _, slots = _read_back(prefix, lambda: tf.keras.optimizers.Adagrad(0.01))
    np.testing.assert_array_equal(_slot(slots, "accumulator", "conv2d", "bias"),
                                  tf.train.load_checkpoint(path).get_tensor("net/conv1/biases/Adagrad"))


def test_partitioned_table_and_its_slots_are_stitched(tmp_path):
    mapping = equivtool.map_variables(cm.partitioned_embedding_net, cm.NativeEmbedding, cm.token_ids())
    path = cm.train_tf1(cm.partitioned_embedding_net, cm.token_ids(), lambda: v1.train.AdamOptimizer(0.1), 2,
                        str(tmp_path / "tf1"))
    prefix = equivtool.convert_checkpoint(path, cm.NativeEmbedding, cm.token_ids(), tmp_path / "tf2",
                                          rename=mapping, optimizer=tf.keras.optimizers.Adam(0.1))
    layer = cm.NativeEmbedding()
    layer(cm.token_ids())
    optimizer = tf.keras.optimizers.Adam(0.1)
    optimizer.build(layer.trainable_variables)
    tf.train.Checkpoint(model=layer, optimizer=optimizer).read(prefix).assert_existing_objects_matched()
    reader = tf.train.load_checkpoint(path)
    table = reader.get_tensor("emb/table")
    assert table.shape == (cm.VOCAB, cm.EMBED)
    np.testing.assert_array_equal(layer.table.embeddings.numpy(), table)
    m = [v for v in optimizer.variables() if v.name.startswith("m/") and "embeddings" in v.name][0]
    np.testing.assert_array_equal(m.numpy(), reader.get_tensor("emb/table/Adam"))
    assert np.count_nonzero(m.numpy().any(axis=1)) < cm.VOCAB  # sparse: only looked-up rows moved


def _refused(match, tmp_path, *args, **kwargs):
    before = sorted(os.listdir(tmp_path))
    with pytest.raises((ValueError, TypeError), match=match):
        equivtool.convert_checkpoint(*args, **kwargs)
    assert sorted(os.listdir(tmp_path)) == before, "a refused conversion wrote something"


def test_every_bad_input_is_named_and_nothing_is_written(adam_ckpt, mapping, tmp_path):
    out = tmp_path / "out"
    adam = lambda: tf.keras.optimizers.Adam(0.01)  # noqa: E731
    _refused(r"tf1_checkpoint: .* is not a checkpoint", tmp_path, str(tmp_path / "nothing"), cm.NativeNet,
             cm.images(), out)
    # every unmapped variable, both ways, listed
    _refused(r"(?s)\b16 variables do not map.*names differ.*'net/conv2d(_\d+)?/kernel' has no TF1.*TF2 variable .*moving_variance.*12 optimizer slots of those TF1 variables",
             tmp_path, adam_ckpt, cm.NativeNet, cm.images(), out, optimizer=adam)
    _refused(r"(?s)TF1 variable 'net/logits/weights' has no TF2 counterpart", tmp_path, adam_ckpt,
             cm.NativeNet, cm.images(), out, rename=[(r"/dense(_\d+)?/kernel$", "/x")] + list(mapping.rules))
    _refused(r"'net/conv1/weights': shape \[3, 3, 3, 4\] in the checkpoint, \[144, 3\]", tmp_path, adam_ckpt,
             cm.NativeNet, cm.images(), out,
             rename=[(r"^net(_\d+)?/dense(_\d+)?/kernel$", "net/conv1/weights")] + list(mapping.rules))
    ambiguous = VariableMapping(mapping.pairs, ambiguous=(("kernel", ("a", "b"), ("c",)),), rules=mapping.rules)
    _refused(r"rename: the variable mapping is incomplete", tmp_path, adam_ckpt, cm.NativeNet, cm.images(), out,
             rename=ambiguous)
    _refused(r"optimizer: the slot layout of .*Nadam is unknown", tmp_path, adam_ckpt, cm.NativeNet, cm.images(),
             out, rename=mapping, optimizer=tf.keras.optimizers.Nadam())
    _refused(r"optimizer: the checkpoint holds Adam state; it converts to tf.keras.optimizers.Adam, not SGD",
             tmp_path, adam_ckpt, cm.NativeNet, cm.images(), out, rename=mapping, optimizer=tf.keras.optimizers.SGD())
    _refused("optimizer: expected a tf-keras optimizer", tmp_path, adam_ckpt, cm.NativeNet, cm.images(), out,
             rename=mapping, optimizer="adam")
    _refused("tf2_layer: expected a zero-argument factory", tmp_path, adam_ckpt, 5, cm.images(), out)
    _refused(r"tf2_layer: .*a layer instance would have its weights replaced", tmp_path, adam_ckpt, cm.NativeNet(),
             cm.images(), out)
    (tmp_path / "file").write_text("")
    _refused("output: .*file' is not a folder", tmp_path, adam_ckpt, cm.NativeNet, cm.images(),
             tmp_path / "file" / "x")


def test_beta_powers_that_disagree_with_global_step_are_refused(adam_ckpt, mapping, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    wrong_step = _rewrite(adam_ckpt, str(folder / "step"), global_step=7)
    mine = tf.keras.optimizers.Adam(0.01)
    _refused(r"beta powers say 5 steps .* global_step says 7", tmp_path, wrong_step, cm.NativeNet, cm.images(),
             tmp_path / "out", rename=mapping, optimizer=mine)
    # the caller's optimizer is left as it was: no slot value, no step count
    assert int(mine.iterations.numpy()) == 0
    assert all(not np.any(v.numpy()) for v in mine.variables())
    wrong_beta = _rewrite(adam_ckpt, str(folder / "beta"), beta2_power=0.5)
    _refused(r"beta2_power = 0.5 is not a power of the optimizer's beta", tmp_path, wrong_beta, cm.NativeNet,
             cm.images(), tmp_path / "out", rename=mapping, optimizer=tf.keras.optimizers.Adam(0.01))
    no_slot = _rewrite(adam_ckpt, str(folder / "slot"), **{"net/bn1/beta/Adam_1": None})
    _refused(r"slot 'net/bn1/beta/Adam_1' \(Adam v of 'net/bn1/beta'\) is not in the checkpoint", tmp_path, no_slot,
             cm.NativeNet, cm.images(), tmp_path / "out", rename=mapping, optimizer=tf.keras.optimizers.Adam(0.01))
    # the beta powers alone (no global_step) still give the step count
    no_step = _rewrite(adam_ckpt, str(folder / "nostep"), global_step=None)
    equivtool.convert_checkpoint(no_step, cm.NativeNet, cm.images(), tmp_path / "ok", rename=mapping,
                                 optimizer=tf.keras.optimizers.Adam(0.01))
    _, optimizer, _ = _read_back(str(tmp_path / "ok"), lambda: tf.keras.optimizers.Adam(0.01))
    assert int(optimizer.iterations.numpy()) == 5


def test_existing_output_is_refused_unless_overwrite_and_a_symlink_always(adam_ckpt, mapping, tmp_path):
    out = tmp_path / "tf2"
    equivtool.convert_checkpoint(adam_ckpt, cm.NativeNet, cm.images(), out, rename=mapping)
    _refused(r"output: a checkpoint exists at .*tf2.*overwrite=True", tmp_path, adam_ckpt, cm.NativeNet,
             cm.images(), out, rename=mapping)
    equivtool.convert_checkpoint(adam_ckpt, cm.NativeNet, cm.images(), out, rename=mapping, overwrite=True)
    target = tmp_path / "elsewhere.index"
    target.write_text("not yours")
    os.symlink(target, tmp_path / "linked.index")
    _refused(r"output: .*linked.index' is a symlink", tmp_path, adam_ckpt, cm.NativeNet, cm.images(),
             tmp_path / "linked", rename=mapping, overwrite=True)
    assert target.read_text() == "not yours"


def _slot_of(optimizer, layer, keras_slot, leaf_pattern):
    found = [v.numpy() for v in optimizer.variables()
             if v.name.startswith(keras_slot + "/") and re.search(leaf_pattern, v.name)]
    assert len(found) == 1, [v.name for v in optimizer.variables()]
    return found[0]


def test_slots_are_found_under_the_optimizers_own_name(mapping, tmp_path):
    path = cm.train_tf1(cm.slim_net, cm.images(), lambda: v1.train.AdamOptimizer(0.01, name="MyAdam"), 4,
                        str(tmp_path / "my_adam"))
    reader = tf.train.load_checkpoint(path)
    assert reader.has_tensor("net/conv1/weights/MyAdam_1") and not reader.has_tensor("net/conv1/weights/Adam")
    conversion, layer, optimizer = convert(path, cm.NativeNet, cm.images(), str(tmp_path / "tf2"), rename=mapping,
                                           optimizer=cm.keras_adam)
    assert conversion.iterations == 4 and len(conversion.slots) == 2 * len(layer.trainable_variables)
    np.testing.assert_array_equal(_slot_of(optimizer, layer, "v", r"/conv2d(_\d+)?/kernel"),
                                  reader.get_tensor("net/conv1/weights/MyAdam_1"))
    assert "named 'MyAdam': Adam read from its slots' structure" in str(conversion)
    # The structure decides, not the name: these slots are Adam's, so SGD is refused.
    with pytest.raises(ValueError, match="holds Adam state; it converts to tf.keras.optimizers.Adam, not SGD"):
        convert(path, cm.NativeNet, cm.images(), str(tmp_path / "bad"), rename=mapping,
                optimizer=lambda: tf.keras.optimizers.SGD(0.1, momentum=0.9))
    # One slot per variable under another name: Momentum with SGD, refused with Adam.
    momentum = cm.train_tf1(cm.slim_net, cm.images(), lambda: v1.train.MomentumOptimizer(0.05, 0.9, name="Mo"),
                            2, str(tmp_path / "mo"))
    conversion, _, _ = convert(momentum, cm.NativeNet, cm.images(), str(tmp_path / "tf2mo"), rename=mapping,
                               optimizer=lambda: tf.keras.optimizers.SGD(0.05, momentum=0.9))
    assert conversion.iterations == 2 and all(how == "times_minus_lr" for *_, how in conversion.slots)
    with pytest.raises(ValueError, match=r"slots named 'Mo' .*1 per variable: Momentum or Adagrad"):
        convert(momentum, cm.NativeNet, cm.images(), str(tmp_path / "bad"), rename=mapping, optimizer=cm.keras_adam)
    assert not os.path.exists(str(tmp_path / "bad.index"))


def test_without_an_optimizer_the_slots_left_out_are_one_line_that_names_the_option(adam_ckpt, mapping, tmp_path):
    conversion, _, _ = convert(adam_ckpt, cm.NativeNet, cm.images(), str(tmp_path / "model_only"), rename=mapping)
    text = str(conversion)
    lines = [line for line in text.splitlines() if "not converted" in line]
    assert len(lines) == 1 and len(conversion.left_out) > 10, text
    assert f"{len(conversion.left_out)} optimizer variables" in lines[0] and "--optimizer" in lines[0]
