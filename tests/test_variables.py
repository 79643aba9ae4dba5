"""Steps 1 and 2: variable-creation guards and variable parity."""

import threading

import numpy as np
import pytest

import equivtool
import tensorflow as tf

from small_models import INPUT_SHAPE, RecreatingDense, ReusingDense, SlimNetShim, slim_net

X = np.random.RandomState(0).rand(*INPUT_SHAPE).astype(np.float32)


# ---------------------------------------------------------------- step 1

def test_assert_no_variable_creations_names_variable_and_user_line():
    with pytest.raises(equivtool.VariableCreationError) as info:
        with equivtool.assert_no_variable_creations():
            tf.Variable(tf.zeros([2, 3]), name="forbidden", trainable=False)
    message = str(info.value)
    assert "forbidden" in message
    assert "shape=(2, 3)" in message and "dtype=float32" in message
    assert "trainable=False" in message
    assert "test_variables.py:" in message  # the user's line, not TensorFlow's


def test_variable_creation_error_is_a_value_error():
    assert issubclass(equivtool.VariableCreationError, ValueError)


def test_assert_no_variable_creations_catches_get_variable_in_graph():
    with tf.Graph().as_default():
        with pytest.raises(equivtool.VariableCreationError, match="outer/w"):
            with equivtool.assert_no_variable_creations():
                with tf.compat.v1.variable_scope("outer"):
                    tf.compat.v1.get_variable("w", shape=[4, 5])


def test_assert_no_variable_creations_catches_keras_add_weight():
    layer = tf.keras.layers.Dense(3)
    with pytest.raises(equivtool.VariableCreationError, match=r"kernel.*shape=\(4, 3\)"):
        with equivtool.assert_no_variable_creations():
            layer(tf.ones([1, 4]))


def test_assert_no_variable_creations_catches_creation_during_tf_function_tracing():
    @tf.function
    def make():
        return tf.Variable(1.0, name="traced") + 1.0

    with pytest.raises(equivtool.VariableCreationError, match="traced"):
        with equivtool.assert_no_variable_creations():
            make()


def test_assert_no_variable_creations_works_as_decorator():
    @equivtool.assert_no_variable_creations()
    def create():
        return tf.Variable(1.0, name="decorated")

    with pytest.raises(equivtool.VariableCreationError, match="decorated"):
        create()
    assert tf.Variable(2.0).numpy() == 2.0  # the guard is gone after the call


def test_assert_no_variable_creations_allows_reuse():
    layer = ReusingDense()
    first = layer(tf.ones([1, 4]))
    with equivtool.assert_no_variable_creations():
        second = layer(tf.ones([1, 4]))
    np.testing.assert_array_equal(first.numpy(), second.numpy())


def test_guide_faulty_layer_is_caught_on_second_call():
    layer = RecreatingDense()
    layer(tf.ones([1, 4]))
    with pytest.raises(equivtool.VariableCreationError, match="kernel"):
        with equivtool.assert_no_variable_creations():
            layer(tf.ones([1, 4]))


def test_catch_and_raise_lists_every_variable_grouped_by_scope():
    layer = RecreatingDense()
    layer(tf.ones([1, 4]))
    with pytest.raises(equivtool.VariableCreationError) as info:
        with equivtool.catch_and_raise_created_variables():
            layer(tf.ones([1, 4]))
    message = str(info.value)
    assert message.startswith("2 variable(s) were created")
    assert "kernel" in message and "bias" in message
    assert "shape=(4, 3)" in message and "shape=(3,)" in message


def test_catch_and_raise_lets_inner_exception_propagate_unchanged():
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with equivtool.catch_and_raise_created_variables():
            tf.Variable(1.0)
            raise Boom()


def test_catch_and_raise_passes_when_nothing_is_created():
    layer = ReusingDense()
    layer(tf.ones([1, 4]))
    with equivtool.catch_and_raise_created_variables() as guard:
        layer(tf.ones([1, 4]))
    assert guard.created == []


def test_guards_are_removed_after_an_exception():
    with pytest.raises(equivtool.VariableCreationError):
        with equivtool.assert_no_variable_creations():
            tf.Variable(1.0)
    assert float(tf.Variable(3.0).numpy()) == 3.0


def test_creates_variables_once_allows_first_call_and_rejects_later_creation():
    class Leaky(tf.keras.layers.Layer):
        @equivtool.creates_variables_once
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, inputs):
            return tf.keras.layers.Dense(2, name="leak")(inputs)

    layer = Leaky()
    layer(tf.ones([1, 3]))
    with pytest.raises(equivtool.VariableCreationError, match="leak"):
        layer(tf.ones([1, 3]))


@pytest.mark.parametrize("order", ["guard_outside", "guard_inside"])
def test_creates_variables_once_stacks_with_shim_in_either_order(order):
    def body(self, inputs):
        with tf.compat.v1.variable_scope("dense"):
            kernel = tf.compat.v1.get_variable("kernel", shape=[3, 2])
        return tf.matmul(inputs, kernel)

    shim = tf.compat.v1.keras.utils.track_tf1_style_variables
    guard = equivtool.creates_variables_once
    call = guard(shim(body)) if order == "guard_outside" else shim(guard(body))
    Layer = type("Layer_" + order, (tf.keras.layers.Layer,), {"call": call})
    layer = Layer()
    first = layer(tf.ones([1, 3]))
    second = layer(tf.ones([1, 3]))
    np.testing.assert_array_equal(first.numpy(), second.numpy())
    assert [v.name for v in layer.variables] == ["dense/kernel:0"]


def test_creates_variables_once_tracks_instances_separately():
    first, second = SlimNetShim(), SlimNetShim()
    first(X)
    first(X)
    second(X)  # its own first call may create variables
    assert len(first.variables) == len(second.variables) == 8


def test_creates_variables_once_rejects_non_callable():
    with pytest.raises(TypeError, match="method"):
        equivtool.creates_variables_once(42)


# ---------------------------------------------------------------- step 2

def tf1_net():
    return slim_net(tf.compat.v1.placeholder(tf.float32, INPUT_SHAPE), True)


def test_slim_graph_and_shim_have_identical_variables():
    expected = equivtool.tf1_variables(tf1_net)
    actual = equivtool.tf2_variables(SlimNetShim(), X, training=True)
    parity = equivtool.assert_variable_parity(expected, actual)
    assert parity.ok and len(parity.matched) == 8
    assert len(expected) == 8 and len(expected.trainable) == 6
    assert "small_net/bn1/moving_mean" in expected.names
    assert not dict((v.name, v.trainable) for v in expected)["small_net/bn1/moving_mean"]


def test_tf1_variables_counts_parameters():
    variables = equivtool.tf1_variables(tf1_net)
    # conv 3*3*3*4 + 4, bn gamma/beta 4+4, fc (4*4*4)*5 + 5
    assert variables.num_trainable_parameters == 108 + 4 + 8 + 320 + 5
    assert "6 trainable" in str(variables)


def test_missing_variable_is_reported():
    expected = equivtool.tf1_variables(
        lambda: slim_net(tf.compat.v1.placeholder(tf.float32, INPUT_SHAPE), True, extra_variable=True))
    actual = equivtool.tf2_variables(SlimNetShim(), X)
    parity = equivtool.compare_variables(expected, actual)
    assert parity.missing == ("small_net/unexpected",)
    with pytest.raises(AssertionError, match=r"missing in TF2\s+small_net/unexpected"):
        equivtool.assert_variable_parity(expected, actual)


def test_extra_and_renamed_variables_are_reported():
    expected = equivtool.tf1_variables(tf1_net)
    actual = equivtool.tf2_variables(SlimNetShim(fc_scope="fc"), X)
    parity = equivtool.compare_variables(expected, actual)
    assert set(parity.missing) == {"small_net/logits/weights", "small_net/logits/biases"}
    assert set(parity.extra) == {"small_net/fc/weights", "small_net/fc/biases"}
    assert not parity.ok


def test_rename_rules_normalise_names():
    expected = equivtool.tf1_variables(tf1_net)
    actual = equivtool.tf2_variables(SlimNetShim(fc_scope="fc"), X)
    assert equivtool.compare_variables(expected, actual, rename={r"/fc/": "/logits/"}).ok
    assert equivtool.compare_variables(expected, actual, rename=[(r"/fc/", "/logits/")]).ok
    assert equivtool.compare_variables(
        expected, actual, rename=lambda n: n.replace("/fc/", "/logits/")).ok


def test_shape_mismatch_is_reported():
    expected = equivtool.tf1_variables(tf1_net)
    actual = equivtool.tf2_variables(SlimNetShim(), np.ones([2, 10, 10, 3], np.float32))
    parity = equivtool.compare_variables(expected, actual)
    assert parity.shape_mismatches == (("small_net/logits/weights", (64, 5), (100, 5)),)
    assert "(64, 5)" in str(parity) and "(100, 5)" in str(parity)


def test_trainable_flag_mismatch_is_reported():
    expected = equivtool.tf1_variables(tf1_net)
    layer = SlimNetShim()
    layer(X)
    actual = equivtool.VariableSet.from_layer(layer)
    frozen = equivtool.VariableSet(tuple(
        equivtool.VariableInfo(v.name, v.shape, v.dtype, False if v.name.endswith("gamma") else v.trainable)
        for v in actual))
    parity = equivtool.compare_variables(expected, frozen)
    assert parity.trainable_mismatches == (("small_net/bn1/gamma", True, False),)
    with pytest.raises(AssertionError, match="trainable"):
        equivtool.assert_variable_parity(expected, frozen)


def test_duplicate_names_are_counted_not_collapsed():
    class Twins(tf.keras.layers.Layer):
        def build(self, input_shape):
            self.a = self.add_weight(name="w", shape=[2])
            self.b = self.add_weight(name="w", shape=[2])

        def call(self, inputs):
            return inputs * self.a * self.b

    actual = equivtool.tf2_variables(Twins(), tf.ones([2]))
    assert len(actual) == 2
    expected = equivtool.VariableSet((equivtool.VariableInfo("w", (2,), "float32", True),))
    parity = equivtool.compare_variables(expected, actual, rename={r"^twins(_\d+)?/": ""})
    assert parity.duplicates == (("TF2", "w", 2),)
    assert "duplicate (TF2)" in str(parity)


def test_tf2_variables_checks_creation_once():
    with pytest.raises(equivtool.VariableCreationError):
        equivtool.tf2_variables(RecreatingDense(), tf.ones([1, 4]))


def test_bad_arguments_name_the_argument():
    with pytest.raises(TypeError, match="build_fn"):
        equivtool.tf1_variables("not a function")
    with pytest.raises(TypeError, match="layer"):
        equivtool.tf2_variables(3.0)
    with pytest.raises(ValueError, match="calls"):
        equivtool.tf2_variables(SlimNetShim(), X, calls=0)
    with pytest.raises(ValueError, match="never been called"):
        equivtool.compare_variables(equivtool.tf1_variables(tf1_net), SlimNetShim())
    with pytest.raises(TypeError, match="rename"):
        equivtool.compare_variables(equivtool.VariableSet(()), equivtool.VariableSet(()), rename=3)
    with pytest.raises(ValueError, match="rename"):
        equivtool.compare_variables(equivtool.VariableSet(()), equivtool.VariableSet(()), rename={"(": ""})


def test_guard_in_one_thread_does_not_affect_another():
    errors = []

    def other_thread():
        try:
            tf.Variable(1.0, name="other_thread")
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    with equivtool.assert_no_variable_creations():
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert errors == []


# ------------------------------------------ guards exited out of order or elsewhere


def _creator_stack():
    return list(tf.compat.v1.get_default_graph()._variable_creator_stack)


def _assert_no_guard_installed(before):
    assert _creator_stack() == before
    assert float(tf.Variable(5.0).numpy()) == 5.0  # creation works again


@pytest.mark.parametrize("exit_order", ["nested", "out_of_order"])
def test_guards_exited_in_either_order_leave_none_installed(exit_order):
    before = _creator_stack()
    forbid = equivtool.assert_no_variable_creations()
    collect = equivtool.catch_and_raise_created_variables()
    forbid.__enter__()
    collect.__enter__()
    first, second = (collect, forbid) if exit_order == "nested" else (forbid, collect)
    first.__exit__(None, None, None)
    if first is forbid:  # the collector alone is still active
        tf.Variable(1.0, name="seen_by_collector")
        assert [v.name for v in collect.created] == ["seen_by_collector"]
        with pytest.raises(equivtool.VariableCreationError, match="seen_by_collector"):
            second.__exit__(None, None, None)
    else:  # the forbidding guard alone is still active
        with pytest.raises(equivtool.VariableCreationError, match="still_forbidden"):
            tf.Variable(1.0, name="still_forbidden")
        second.__exit__(None, None, None)
    _assert_no_guard_installed(before)


def test_guards_exited_out_of_order_in_a_graph_leave_none_installed():
    with tf.Graph().as_default():
        before = _creator_stack()
        outer, inner = equivtool.assert_no_variable_creations(), equivtool.assert_no_variable_creations()
        outer.__enter__()
        inner.__enter__()
        outer.__exit__(None, None, None)
        inner.__exit__(None, None, None)
        assert _creator_stack() == before
        tf.compat.v1.get_variable("w", shape=[2])  # creation works again


@pytest.mark.parametrize("guard_type", [equivtool.assert_no_variable_creations,
                                        equivtool.catch_and_raise_created_variables])
def test_guard_exited_on_another_thread_is_removed_from_the_entering_thread(guard_type):
    before = _creator_stack()
    guard = guard_type()
    guard.__enter__()
    errors = []

    def exit_elsewhere():
        try:
            guard.__exit__(None, None, None)
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=exit_elsewhere)
    thread.start()
    thread.join()
    assert errors == []
    _assert_no_guard_installed(before)


def test_guard_held_by_a_generator_closed_on_another_thread_is_removed():
    before = _creator_stack()

    def held():
        with equivtool.assert_no_variable_creations():
            yield

    gen = held()
    next(gen)
    with pytest.raises(equivtool.VariableCreationError):
        tf.Variable(1.0)
    thread = threading.Thread(target=gen.close)
    thread.start()
    thread.join()
    _assert_no_guard_installed(before)


def test_one_guard_used_as_decorator_on_two_threads_removes_each_threads_entry():
    guard = equivtool.assert_no_variable_creations()
    before = _creator_stack()
    entered, release = threading.Event(), threading.Event()

    @guard
    def hold():
        entered.set()
        release.wait(60)

    thread = threading.Thread(target=hold)
    thread.start()
    entered.wait(60)
    with guard:  # entered here after the other thread entered
        release.set()
        thread.join()  # the other thread exits first
        with pytest.raises(equivtool.VariableCreationError):  # this thread's entry still holds
            tf.Variable(1.0)
    _assert_no_guard_installed(before)


def test_guards_nest_with_tensorflows_own_creator_scopes():
    def passthrough(next_creator, **kwargs):
        return next_creator(**kwargs)

    before = _creator_stack()
    with tf.variable_creator_scope(passthrough):
        with equivtool.assert_no_variable_creations():
            pass
    with equivtool.catch_and_raise_created_variables():
        with tf.variable_creator_scope(passthrough):
            pass

    @tf.function  # tracing wraps the body in TensorFlow's own creator scope
    def traced():
        with equivtool.assert_no_variable_creations():
            return tf.constant(1.0)

    assert float(traced()) == 1.0
    _assert_no_guard_installed(before)
