"""Sides as one protocol: a step asks its sides what they can do, and is skipped
with the side's reason when one refuses, before anything is built."""

import numpy as np
import pytest
import tensorflow as tf

from options_support import equivalence_arguments

import equivtool
from equivtool.engine import pair, registry, sides
from equivtool.engine.options import Options
from equivtool.engine.run import Engine
from equivtool.engine.sides.tf1_side import TF1Side
from equivtool.engine.sides.tf2_side import TF2Side

X = np.ones([2, 4], np.float32)


def dense_tf1(x, training):
    return tf.compat.v1.layers.dense(x, 3, name="d")


class Dense(tf.keras.layers.Layer):
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, x, training=None):
        return tf.compat.v1.layers.dense(x, 3, name="d")


def _engine(**kwargs) -> Engine:
    arguments = equivalence_arguments(modes=("constant",), train_steps=1, **kwargs)
    return Engine(Options.build(dense_tf1, Dense, X, **arguments))


def test_every_step_asks_for_known_capabilities_and_todays_sides_refuse_none():
    assert all(step.needs and set(step.needs) <= set(sides.CAPABILITIES) for step in registry.REGISTRY)
    for side in (TF1Side, TF2Side):
        assert issubclass(side, sides.Side)
        assert [side.refuses(c) for c in sides.CAPABILITIES] == [None] * len(sides.CAPABILITIES)


def test_an_unknown_capability_is_refused_by_name():
    with pytest.raises(ValueError, match=r"capability: expected one of .*'forward'.*got 'flying'"):
        TF1Side.refuses("flying")


class NoGradients(TF2Side):
    KIND = "planted"
    CAPABILITIES = frozenset(sides.CAPABILITIES) - {sides.GRADIENTS}
    REFUSALS = {sides.GRADIENTS: "planted: this side has no gradients"}


class RefusesNothing(TF2Side):  # the planted fault's control: a subclass alone skips nothing
    KIND = "control"


def _statuses(engine: Engine) -> dict:
    return {r.name: (r.status, r.message) for r in engine.run()}


@pytest.mark.parametrize("side", ["tf1", "tf2"])
def test_a_side_that_refuses_a_capability_skips_the_steps_that_need_it_with_its_reason(side):
    engine = _engine()
    engine.side_classes[side] = NoGradients
    results = _statuses(engine)
    assert results["gradients"] == ("skipped", "planted: this side has no gradients")
    others = {name: status for name, (status, _) in results.items() if name != "gradients"}
    assert others and set(others.values()) == {"passed"}, others


def test_a_side_that_refuses_nothing_skips_nothing():
    engine = _engine()
    engine.side_classes["tf2"] = RefusesNothing
    results = _statuses(engine)
    assert results["gradients"][0] == "passed" and len(results) == len(equivtool.DEFAULT_STEPS) + 1


def test_a_refusal_comes_before_any_model_is_built(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a half was built for a step its side refuses")

    monkeypatch.setattr(pair.TF1Half, "__init__", never)
    monkeypatch.setattr(pair.TF2Half, "__init__", never)

    class Refuses(sides.Side):
        KIND = "record"
        REFUSALS = {sides.VARIABLES: "a golden record holds outputs only"}

    engine = _engine(steps=["variables_once", "parity", "fixed_weights", "gradients"])
    engine.side_classes["tf2"] = Refuses
    results = _statuses(engine)
    assert results["parity"] == ("skipped", "a golden record holds outputs only")
    assert results["gradients"] == ("skipped", "the record side has no gradients")
    assert set(status for status, _ in results.values()) == {"skipped"}
    # the TF1 side is asked first: with both sides refusing, its reason is given
    engine = _engine(steps=["gradients"])
    engine.side_classes.update(tf1=NoGradients, tf2=Refuses)
    assert _statuses(engine)["gradients"] == ("skipped", "planted: this side has no gradients")
