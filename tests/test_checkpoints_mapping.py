"""map_variables / VariableMapping: proposed from shapes, dtypes, roles and creation order; never a silent guess."""

import re

import equivtool
import numpy as np
import pytest

from equivtool.variables.mapping import mapping_rules, propose
from equivtool.variables import VariableInfo, VariableSet
from tests import checkpoint_models as cm


def _set(*items, source=""):
    return VariableSet(tuple(VariableInfo(n, tuple(s), "float32", t) for n, s, t in items), source)


def test_native_rewrite_of_a_slim_model_is_mapped_completely_and_str_is_python():
    mapping = equivtool.map_variables(cm.slim_net, cm.NativeNet, cm.images())
    assert mapping.complete
    # Keras numbers auto-named layers per process: conv2d, conv2d_1, ...
    assert re.fullmatch(r"net/conv2d(_\d+)?/kernel", mapping.pairs["net/conv1/weights"])
    assert re.fullmatch(r"net/batch_normalization(_\d+)?/moving_variance", mapping.pairs["net/bn1/moving_variance"])
    assert re.fullmatch(r"net/dense(_\d+)?/bias", mapping.pairs["net/logits/biases"])
    assert len(mapping.pairs) == 8 and not mapping.by_order
    namespace = {}
    exec(str(mapping), namespace)  # the printed rules are Python the user can commit
    assert namespace["rename"] == list(mapping.rules)


def test_rules_hold_for_a_layer_made_again_in_the_same_process():
    mapping = equivtool.map_variables(cm.slim_net, cm.NativeNet, cm.images())
    report = equivtool.check_equivalence(cm.slim_net, cm.NativeNet, cm.images(),
                                         steps=["parity", "fixed_weights"], rename=mapping)
    assert report.passed, str(report)


def test_same_shape_layers_are_paired_by_creation_order_and_said_so():
    mapping = equivtool.map_variables(cm.two_dense, cm.TwoDense, cm.images())
    assert mapping.complete
    assert [mapping.pairs[f"mlp/fc{i}/weights"] for i in (1, 2, 3)] == [
        "mlp/first/kernel", "mlp/hidden/kernel", "mlp/top/kernel"]
    assert "mlp/fc2/weights" in mapping.by_order and "mlp/fc3/weights" in mapping.by_order
    assert "paired by creation order" in str(mapping)


def test_uneven_groups_are_ambiguous_never_guessed():
    tf1 = _set(("a/w1", [4, 4], True), ("a/w2", [4, 4], True), ("a/b", [4], True))
    tf2 = _set(("k/kernel", [4, 4], True), ("k/bias", [4], True), ("k/extra", [7], True))
    mapping = propose(tf1, tf2)
    assert not mapping.complete
    assert mapping.ambiguous and set(mapping.ambiguous[0][1]) == {"a/w1", "a/w2"}
    assert "a/w1" not in mapping.pairs and "a/w2" not in mapping.pairs
    assert mapping.pairs == {"a/b": "k/bias"}
    assert mapping.unmapped_tf2 == ("k/extra",)
    with pytest.raises(ValueError, match=r"(?s)rename: the variable mapping is incomplete.*k/extra.*a/w1"):
        equivtool.check_equivalence(cm.slim_net, cm.NativeNet, cm.images(), rename=mapping)


def test_partitioned_tf1_variable_is_one_variable_mapped_by_its_full_shape():
    mapping = equivtool.map_variables(cm.partitioned_embedding_net, cm.NativeEmbedding, cm.token_ids())
    assert mapping.complete, mapping.problems()
    assert re.fullmatch(r"emb/embedding(_\d+)?/embeddings", mapping.pairs["emb/table"])


def test_rules_refuse_a_tf1_name_that_is_another_tf2_name():
    with pytest.raises(ValueError, match="TF1 variable 'x' would become 'y'"):
        mapping_rules({"y": "x", "x": "z"}, tf1_names=["x", "y"], tf2_names=["x", "z"])


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="tf1_fn"):
        equivtool.map_variables(None, cm.NativeNet, cm.images())
    with pytest.raises(TypeError, match="tf2_layer"):
        equivtool.map_variables(cm.slim_net, 3, cm.images())
    with pytest.raises(ValueError, match="inputs"):
        equivtool.map_variables(cm.slim_net, cm.NativeNet, np.zeros([0, 6, 6, 3], np.float32))


def test_scope_similarity_decides_before_creation_order():
    # Same shape, role and count; created in other orders: the layer names agree.
    tf1 = _set(("net/fc_b/weights", [8, 8], True), ("net/fc_a/weights", [8, 8], True),
               ("net/fc_c/weights", [8, 8], True), ("net/x/weights", [8, 8], True))
    tf2 = _set(("model/fc_a_1/kernel", [8, 8], True), ("model/fc_b/kernel", [8, 8], True),
               ("model/dense/kernel", [8, 8], True), ("model/fc_c/kernel", [8, 8], True))
    mapping = propose(tf1, tf2)
    assert mapping.pairs["net/fc_a/weights"] == "model/fc_a_1/kernel"
    assert mapping.pairs["net/fc_b/weights"] == "model/fc_b/kernel"
    assert mapping.pairs["net/fc_c/weights"] == "model/fc_c/kernel"
    assert mapping.pairs["net/x/weights"] == "model/dense/kernel"  # the one left
    assert mapping.by_order == ()  # nothing was decided by order alone
    # Without scope evidence, creation order decides, and says so.
    order = propose(_set(("a/p/w", [2], True), ("a/q/w", [2], True)),
                    _set(("b/r/w", [2], True), ("b/s/w", [2], True)))
    assert order.pairs == {"a/p/w": "b/r/w", "a/q/w": "b/s/w"} and order.by_order == ("a/p/w", "a/q/w")
