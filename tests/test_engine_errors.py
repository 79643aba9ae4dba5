"""A step that errors reports its own error, with the user's line and a whole traceback."""

import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

import equivtool
from equivtool._base.errors import one_line, unfiltered_tracebacks

X = np.ones([2, 4], np.float32)
IMAGE = np.ones([1, 5, 5, 2], np.float32)
FORWARD_STEPS = ("variables_once", "parity", "fixed_weights", "random/constant/inference",
                 "random/constant/training", "gradients")


def _line_of(marker):
    with open(__file__) as f:
        return next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(marker))


def dense_tf1(x, training):
    return tf.compat.v1.layers.dense(x, 3, name="d")


class EagerOnly(tf.keras.layers.Layer):
    """Fine when called eagerly; inside tf.function its Python `bool` of a tensor fails."""

    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, x, training=None):
        y = tf.compat.v1.layers.dense(x, 3, name="d")
        if bool(tf.reduce_sum(y) > -1e30):  # EAGER_ONLY
            return y
        return -y


class AlwaysFails(tf.keras.layers.Layer):
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, x, training=None):
        tf.compat.v1.layers.dense(x, 3, name="d")
        raise RuntimeError("broken shim")


def slim_conv_tf1(x, training):
    return slim.conv2d(x, 3, [3, 3], scope="c")


class BadPaddingSlim(tf.keras.layers.Layer):
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, x, training=None):
        return slim.conv2d(x, 3, [3, 3], scope="c", padding="NOPE")  # BAD_PADDING


def test_tf_function_first_trace_failure_is_each_steps_own_error():
    report = equivtool.check_equivalence(dense_tf1, EagerOnly, X, tf_function=True)
    location = f"{__file__}:{_line_of('# EAGER_ONLY')} in call"
    for name in FORWARD_STEPS:
        step = report.step(name)
        assert step.status == "error", (name, step.status, step.message)
        assert step.message.startswith("OperatorNotAllowedInGraphError: Using a symbolic `tf.Tensor` as a "
                                       "Python `bool` is not allowed."), (name, step.message)
        assert step.message.endswith(f"(at {location})"), (name, step.message)
        assert "\n" not in step.message
        assert "NoneType" not in step.data["traceback"], name
    # The num_random_ops steps are traced too (issue 23): the same error, not an eager pass.
    for name in ("random/num_random_ops/inference", "random/num_random_ops/training"):
        assert report.step(name).status == "error", name
        assert report.step(name).message.endswith(f"(at {location})")
    assert report.meta["execution"].startswith("tf.function in every step")


def test_header_says_how_every_step_ran():
    traced = equivtool.check_equivalence(dense_tf1, AlwaysFails, X, tf_function=True,
                                         steps=["random"], modes=["num_random_ops"])
    assert traced.meta["execution"] == "tf.function in every step (num_random_ops steps included)"
    assert "execution: tf.function in every step" in str(traced)
    eager = equivtool.check_equivalence(dense_tf1, AlwaysFails, X, steps=["random"], modes=["num_random_ops"])
    assert eager.meta["execution"].startswith("eager in every step (tf_function=False)")
    assert eager.step("random/num_random_ops/inference").notes == ()


def test_traceback_keeps_slim_and_user_frames_and_message_names_the_user_line():
    report = equivtool.check_equivalence(slim_conv_tf1, BadPaddingSlim, IMAGE, steps=["parity"])
    step = report.step("parity")
    assert step.status == "error"
    line = _line_of("# BAD_PADDING")
    assert step.message.endswith(f"(at {__file__}:{line} in call)"), step.message
    assert step.message.startswith("ValueError: The `padding` argument must be")
    tb = step.data["traceback"]
    assert f'File "{__file__}", line {line}, in call' in tb  # the user's frame
    assert "tf_slim/layers/layers.py" in tb  # and tf-slim's, below it
    assert "normalize_padding" in tb  # down to the frame that raised


def test_steps_run_with_traceback_filtering_off_and_the_setting_is_restored():
    seen = []

    class Records(tf.keras.layers.Layer):
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, x, training=None):
            seen.append(tf.debugging.is_traceback_filtering_enabled())
            return tf.compat.v1.layers.dense(x, 3, name="d")

    assert tf.debugging.is_traceback_filtering_enabled()
    equivtool.check_equivalence(dense_tf1, Records, X, steps=["parity"])
    assert seen and not any(seen)
    assert tf.debugging.is_traceback_filtering_enabled()

    tf.debugging.disable_traceback_filtering()
    try:
        equivtool.check_equivalence(dense_tf1, Records, X, steps=["parity"])
        assert not tf.debugging.is_traceback_filtering_enabled()  # the user's choice is kept
    finally:
        tf.debugging.enable_traceback_filtering()


class Interrupt(BaseException):
    """Escapes the engine's per-step error handling, as KeyboardInterrupt does."""


def test_filtering_setting_is_restored_when_the_check_is_interrupted():
    def interrupted_tf1(x, training):
        raise Interrupt()

    assert tf.debugging.is_traceback_filtering_enabled()
    with pytest.raises(Interrupt):
        equivtool.check_equivalence(interrupted_tf1, EagerOnly, X, steps=["parity"])
    assert tf.debugging.is_traceback_filtering_enabled()


def test_unfiltered_tracebacks_restores_on_exception():
    with pytest.raises(KeyError):
        with unfiltered_tracebacks():
            assert not tf.debugging.is_traceback_filtering_enabled()
            raise KeyError("boom")
    assert tf.debugging.is_traceback_filtering_enabled()


def test_one_line_without_a_user_frame_has_no_location():
    assert one_line(ValueError("plain\nsecond line")) == "ValueError: plain"
