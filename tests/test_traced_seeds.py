"""The tf.function seed alignment of the num_random_ops steps (issue 23, item 1):
a retrace gets the first trace's forward seeds, and the tool is left clean on every exit."""

import pytest
import tensorflow as tf

import equivtool
from equivtool.seeding.traced import TraceAlignment


def test_retrace_gets_the_first_traces_forward_seeds_not_the_initializers():
    tool = equivtool.DeterministicRandomTestTool(mode="num_random_ops")
    alignment = TraceAlignment(tool)
    holder = []

    def body():
        if not holder:
            # an initializer, a callable as get_variable and add_weight pass it: seed 0
            holder.append(tf.Variable(lambda: tf.random.uniform([2])))
        return tf.random.uniform([3])  # the forward op: seed 1 in program order

    with tool.scope():
        with alignment.trace():
            body()
        with alignment.trace():  # a retrace creates no variable: its op gets seed 1 again
            body()
    assert alignment.forward_seeds == [1]
    assert [record.operation_seed for record in tool.trace] == [0, 1, 1]
    assert tool._replay is None and tool._forward_log is None and tool._creating == 0


def test_the_tool_is_left_clean_when_a_trace_raises():
    tool = equivtool.DeterministicRandomTestTool(mode="num_random_ops")
    alignment = TraceAlignment(tool)
    with tool.scope():
        for _ in range(2):  # the recording trace, then a replaying one
            with pytest.raises(RuntimeError, match="boom"):
                with alignment.trace():
                    tf.random.uniform([1])
                    raise RuntimeError("boom")
            alignment.forward_seeds = alignment.forward_seeds or [0]
    assert tool._replay is None and tool._forward_log is None and tool._creating == 0


def test_constant_mode_is_untouched():
    tool = equivtool.DeterministicRandomTestTool(mode="constant")
    alignment = TraceAlignment(tool)
    with tool.scope(), alignment.trace():
        tf.random.uniform([1])
    assert alignment.forward_seeds is None
