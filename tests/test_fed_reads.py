"""The pair's TF1 passes on fed variable values (engine/sides/_fed_reads.py): the same
numbers as the assigning and copying paths, no variable written where nothing may change,
and the fallback wherever a variable is used other than by reading it."""

import numpy as np
import pytest
import tensorflow as tf

import equivtool  # noqa: F401 (the environment fix, before the graphs)
from equivtool.engine.options import Options
from equivtool.engine.pair import TF1Half
from equivtool.engine.sides import tf1_side as runners
from equivtool.engine.sides._fed_reads import read_plan
from equivtool.engine.steps.common import FixedValues
from options_support import equivalence_arguments
from small_models import INPUT_SHAPE, SlimNetShim, slim_net

X = np.random.RandomState(0).rand(*INPUT_SHAPE).astype(np.float32)


def _graph(body):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3])
        fetches = body(x)
    return graph, fetches


def _variables(graph):
    return graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)


def test_a_variable_only_read_is_fed_one_assigned_is_real_one_unused_is_neither():
    def body(x):
        read = tf.compat.v1.get_variable("read", [3, 3])
        written = tf.compat.v1.get_variable("written", [3])
        tf.compat.v1.get_variable("unused", [3])
        update = tf.compat.v1.assign_add(written, tf.ones([3]))
        return [tf.matmul(x, read) + written, update]

    graph, fetches = _graph(body)
    plan = read_plan(_variables(graph), fetches)
    names = [v.op.name for v in _variables(graph)]
    assert [names[i] for i in plan.fed] == ["read"]
    assert all(t.op.type == "ReadVariableOp" for t in plan.fed[0])
    assert [names[i] for i in plan.real] == ["written"]


def test_a_reference_variables_identity_read_is_fed():
    def body(x):
        w = tf.compat.v1.Variable(tf.ones([3, 3]), use_resource=False, name="w")
        return [tf.matmul(x, w)]

    graph, fetches = _graph(body)
    plan = read_plan(_variables(graph), fetches)
    assert list(plan.fed) == [0] and plan.real == ()
    assert [t.op.type for t in plan.fed[0]] == ["Identity"]


def test_a_variable_a_loop_or_a_gather_takes_is_real():
    def body(x):
        looped = tf.compat.v1.get_variable("looped", [3])
        gathered = tf.compat.v1.get_variable("gathered", [3])
        total = tf.while_loop(lambda i, s: i < 2, lambda i, s: (i + 1, s + looped), [0, tf.zeros([3])])[1]
        return [x * total + tf.gather(gathered, [0, 0, 1])]

    graph, fetches = _graph(body)
    plan = read_plan(_variables(graph), fetches)
    assert plan.real == (0, 1)  # each is taken by something other than a plain read


def test_a_plan_of_nothing_feeds_nothing():
    graph, fetches = _graph(lambda x: [x * 2.0])
    plan = read_plan(_variables(graph), fetches)
    assert plan.fed == {} and plan.real == ()


# --------------------------------------------------------------------------
# The pair: fixed values fed, the training pass fed
# --------------------------------------------------------------------------

def _half(tf1_fn=slim_net, localize=False):
    options = Options.build(tf1_fn, SlimNetShim, X, **equivalence_arguments(
        steps=["random", "gradients"], modes=["constant"], localize=localize))
    return TF1Half(options)


def _fixed(half):
    return FixedValues(half.side.keys, half.side.variables, "", half.side.renamer)


def test_fixed_values_fed_give_the_assigned_numbers_and_write_nothing():
    half = _half()
    before = half.side.read_variables()
    fed = half.inference_on(_fixed(half))
    assert fed is not None
    after = half.side.read_variables()
    assert all(np.array_equal(before[k], after[k]) for k in before)  # nothing written, nothing to put back
    runners.TF1Side.assign_variables(half.side, _fixed(half))
    assigned = half.inference_now()
    flat = lambda values: [np.asarray(v) for v in tf.nest.flatten(values)]  # noqa: E731
    assert all(np.array_equal(a, b) for a, b in zip(flat(fed), flat(assigned)))
    assert not all(np.array_equal(a, b) for a, b in zip(flat(fed), flat(half.inference_pass()[:2])))
    half.close()


def test_fixed_values_are_assigned_when_the_pass_writes_a_variable():
    def counting(x, training):
        count = tf.compat.v1.get_variable("count", [], initializer=tf.zeros_initializer())
        w = tf.compat.v1.get_variable("w", [INPUT_SHAPE[-1], 2])
        with tf.control_dependencies([tf.compat.v1.assign_add(count, 1.0)]):
            return tf.reduce_sum(tf.tensordot(x, w, 1)) + count

    half = _half(counting)
    assert half.inference_on(_fixed(half)) is None  # the step falls back to assigning (and restoring)
    half.close()


def _training(half):
    values = half.training_pass()
    return [np.asarray(v) for v in tf.nest.flatten(values, expand_composites=True)], half.side.read_variables()


def test_the_fed_training_pass_gives_the_copying_paths_numbers_and_statistics():
    fed_half, copied_half = _half(), _half(localize=True)  # localize keeps the copying path
    fed, fed_after = _training(fed_half)
    copied, copied_after = _training(copied_half)
    assert len(fed) == len(copied) and all(np.array_equal(a, b) for a, b in zip(fed, copied))
    start = _half().side.read_variables()
    moved = [k for k in start if not np.array_equal(start[k], copied_after[k])]
    assert moved and all("moving" in k for k in moved)  # the pass updated the batch-norm statistics
    assert all(np.array_equal(fed_after[k], copied_after[k]) for k in copied_after)  # and they came back
    for half in (fed_half, copied_half):
        half.close()


def test_a_fed_training_pass_that_kept_its_statistics_would_be_caught(monkeypatch):
    """The test above can fail: a planted fault that does not copy the updated statistics back."""
    copied_half = _half(localize=True)
    _, copied_after = _training(copied_half)
    monkeypatch.setattr(runners.TF1Side, "copy_variables_from", lambda self, other, keys=None: None)
    fed_half = _half()
    _, fed_after = _training(fed_half)
    assert not all(np.array_equal(fed_after[k], copied_after[k]) for k in copied_after)
    for half in (fed_half, copied_half):
        half.close()


def test_read_variables_fetches_only_what_is_wanted():
    half = _half()
    everything = half.side.read_variables()
    runs = []
    original = half.side.session.run
    monkeypatch_run = lambda fetches, *a, **k: (runs.append(len(fetches)), original(fetches, *a, **k))[1]  # noqa: E731
    half.side.session.run = monkeypatch_run
    try:
        some = half.side.read_variables(wanted=lambda key: key.endswith("moving_variance"))
    finally:
        del half.side.session.run
    assert some and set(some) == {k for k in everything if k.endswith("moving_variance")}
    assert runs == [len(some)]  # only those fetched
    assert all(np.array_equal(some[k], everything[k]) for k in some)
    half.close()


@pytest.mark.parametrize("wanted", [None, lambda key: False])
def test_read_variables_with_nothing_wanted_reads_nothing(wanted):
    half = _half()
    found = half.side.read_variables(wanted=wanted)
    assert (found == {}) == (wanted is not None)
    half.close()


def test_fixed_values_start_where_tensorflow_feeds_them_without_a_copy():
    for shape, dtype in (([3, 5], np.float32), ([1000], np.float16), ([], np.float64), ([2, 0], np.float32)):
        value = runners.fixed_value("net/w", shape, dtype)
        assert value.shape == tuple(shape) and value.dtype == dtype
        assert value.ctypes.data % runners.FEED_ALIGNMENT == 0 or value.size == 0
    # the same numbers as before the alignment (the pattern is the only source)
    assert np.array_equal(runners.fixed_value("net/w", [7], np.float32),
                          (0.0 + np.sqrt(3.0 / 7) * np.sin(np.arange(7) * runners._ANGLE + (
                              __import__("zlib").crc32(b"net/w") % 10007) / 10007.0 * 2.0 * np.pi)).astype(np.float32))


def _raising_training_run(monkeypatch, before_raising):
    half = _half()
    start = half.side.read_variables()

    def fails(side, fetches, feeds, update_ops=()):
        before_raising(half)
        raise RuntimeError("the pass failed")

    monkeypatch.setattr(runners.TF1Side, "run_fed", fails)
    with pytest.raises(RuntimeError, match="the pass failed"):
        half.training_pass()
    after = half.side.read_variables()
    half.close()
    return all(np.array_equal(start[k], after[k]) for k in start)


def test_a_fed_training_pass_that_raises_leaves_the_inference_graphs_values_as_they_were(monkeypatch):
    assert _raising_training_run(monkeypatch, lambda half: None)


def test_a_pass_that_wrote_the_inference_graph_before_raising_would_be_caught(monkeypatch):
    """The test above can fail: a planted fault that writes before the pass raises."""
    def writes(half):
        key = half.side.keys[0]
        runners.TF1Side.assign_variables(half.side, {key: half.side.read_variables()[key] + 1.0})
    assert not _raising_training_run(monkeypatch, writes)


def test_a_fetched_value_is_moved_once_to_where_a_feed_needs_no_copy():
    odd = np.arange(13, dtype=np.float32)[1:]  # NumPy's own alignment plus 4 bytes
    assert odd.ctypes.data % runners.FEED_ALIGNMENT != 0
    moved = runners.feedable(odd)
    assert moved.ctypes.data % runners.FEED_ALIGNMENT == 0 and np.array_equal(moved, odd)
    assert runners.feedable(moved) is moved  # already there: not copied again
    strided = np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2]
    assert np.array_equal(runners.feedable(strided), strided) and runners.feedable(strided).flags.c_contiguous
