"""Constant mode builds the TF1 inference and training passes once for several steps;
that must change no key, name or number compared with a standalone build of each pass."""

import numpy as np
import tensorflow as tf

import equivtool
from small_models import INPUT_SHAPE, SlimNetShim, slim_net

X = np.ones([2, 4], np.float32)


def scoped_tf1(x, training):
    """The issue's model: its output key is its name scope."""
    with tf.compat.v1.variable_scope("net"):
        with tf.compat.v1.name_scope("block") as sc:
            y = tf.compat.v1.layers.dense(x, 3)
    return {sc.rstrip("/"): y}


class ScopedShim(tf.keras.layers.Layer):
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, x, training=None):
        with tf.compat.v1.variable_scope("net"):
            y = tf.compat.v1.layers.dense(x, 3)
        return {"net/block": y}  # the key a standalone TF1 build gives


def test_training_pass_keeps_the_standalone_name_scope_keys():
    report = equivtool.check_equivalence(scoped_tf1, ScopedShim, X, steps=["random"], modes=["constant"])
    for name in ("random/constant/inference", "random/constant/training"):
        step = report.step(name)
        assert step.status == "passed", str(report)
        assert [leaf.name for leaf in step.leaves][:1] == ["end_points/net/block"], name


def _names_seen(record):
    """A TF1 function recording, per call, every name its graph gave it."""
    def tf1_fn(x, training):
        with tf.compat.v1.variable_scope("net") as vs:
            with tf.compat.v1.name_scope("block") as sc:
                y = tf.compat.v1.layers.dense(x, 3)
                y = tf.compat.v1.layers.dropout(y, 0.5, training=training)
        graph = y.graph
        record.append({
            "training": bool(training), "name_scope": sc, "variable_scope": vs.original_name_scope,
            "output": y.name, "ops": sorted(op.name for op in graph.get_operations()
                                            if not op.name.startswith("equivtool_input")),
            "collections": sorted(graph.get_all_collection_keys()),
        })
        return {sc.rstrip("/"): y}
    return tf1_fn


def _standalone(training):
    record = []
    tool = equivtool.DeterministicRandomTestTool(mode="constant")
    with tool.scope(), tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, X.shape, name="equivtool_input_0")
        _names_seen(record)(x, training)
    return record[0]


def test_each_pass_sees_exactly_the_names_of_a_standalone_build():
    record = []
    # The TF2 side (without dropout) is irrelevant here; only what TF1 saw is checked.
    report = equivtool.check_equivalence(_names_seen(record), ScopedShim, X, steps=["random", "gradients"],
                                         modes=["constant"])
    assert report.step("random/constant/training").status != "error", str(report)
    built = {entry["training"]: entry for entry in record}
    assert set(built) == {False, True}
    for training in (False, True):
        assert built[training] == _standalone(training), training
    assert built[True]["name_scope"] == "net/block/"


def test_training_pass_numbers_match_tf2_with_batch_norm_and_dropout():
    # slim_net's training pass updates batch-norm statistics and draws dropout
    # masks; the later steps read the statistics the training pass left.
    x = np.random.RandomState(0).rand(*INPUT_SHAPE).astype(np.float32)
    optimizers = (lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),
                  lambda: tf.keras.optimizers.SGD(0.1))
    report = equivtool.check_equivalence(slim_net, SlimNetShim, x, modes=["constant"],
                                         optimizers=optimizers, train_steps=2)
    assert report.passed, str(report)


def test_training_pass_runs_on_the_inference_graphs_variable_values():
    # Initial values the random tool cannot pin: each build draws new ones.
    rng = np.random.RandomState(7)

    def numpy_init_tf1(x, training):
        w = tf.compat.v1.get_variable("w", initializer=rng.rand(4, 3).astype(np.float32))
        return tf.matmul(x, w)

    class NumpyInitShim(tf.keras.layers.Layer):
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, x, training=None):
            return numpy_init_tf1(x, training)

    layer = NumpyInitShim()
    layer(X)  # built before the check: it receives the TF1 graph's values
    report = equivtool.check_equivalence(numpy_init_tf1, layer, X, steps=["random"], modes=["constant"])
    assert report.step("random/constant/training").status == "passed", str(report)


def test_a_variable_only_the_training_pass_creates_is_initialised():
    def training_extra_tf1(x, training):
        y = tf.compat.v1.layers.dense(x, 3, name="d")
        if training:
            y = y * tf.compat.v1.get_variable("gain", initializer=tf.constant(2.0))
        return y

    class TrainingExtraShim(tf.keras.layers.Layer):
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def call(self, x, training=None):  # creates its variables on the first call
            y = tf.compat.v1.layers.dense(x, 3, name="d")
            gain = tf.compat.v1.get_variable("gain", initializer=tf.constant(2.0))
            return y * gain if training else y

    report = equivtool.check_equivalence(training_extra_tf1, TrainingExtraShim, X, steps=["random"],
                                         modes=["constant"])
    assert report.step("random/constant/training").status == "passed", str(report)


# --------------------------------------------------------------------------
# fixed_weights runs before the training pass (the TF1 training graph's
# session does not exist yet, so the values it saves are not held beside it);
# the variables are moved between the TF1 graphs a chunk at a time.
# --------------------------------------------------------------------------

from equivtool.engine.steps import forward as _forward_steps, training as _training_steps  # noqa: E402

_STEP_MODULES = {"random_constant": _forward_steps, "gradients": _training_steps}
_ORIGINAL_SPLITS = {name: getattr(module, name) for name, module in _STEP_MODULES.items()}


def _recorded_captures(monkeypatch, steps):
    """Run ``steps`` (constant mode, one process) and return what each side of
    the random-mode and gradient steps captured, as flat NumPy arrays."""
    import dataclasses

    from equivtool._base.tree import flatten_tensors

    seen = {}

    def recording(name, split):
        def side(which, fn):
            def run(e, *args, **params):
                capture = fn(e, *args, **params)
                key = (name, which, params.get("training"))
                seen[key] = [np.array(v) for v in flatten_tensors(
                    {k: v for k, v in capture.items() if k in ("outputs", "regularization", "gradients", "loss")})]
                return capture
            return run
        return dataclasses.replace(split, tf1=side("tf1", split.tf1), tf2=side("tf2", split.tf2))

    for name in ("random_constant", "gradients"):  # wrapping the originals, not an earlier call's wrapper
        monkeypatch.setattr(_STEP_MODULES[name], name, recording(name, _ORIGINAL_SPLITS[name]))
    x = np.random.RandomState(0).rand(*INPUT_SHAPE).astype(np.float32)
    report = equivtool.check_equivalence(slim_net, SlimNetShim, x, steps=steps, modes=["constant"])
    assert report.step("random/constant/training").status == "passed", str(report)
    return seen


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        len(a[k]) == len(b[k]) and all(np.array_equal(x, y) for x, y in zip(a[k], b[k])) for k in a)


def test_fixed_weights_first_changes_no_number_of_the_passes_after_it(monkeypatch):
    # slim_net's training pass updates batch-norm statistics and draws dropout
    # masks: a value fixed_weights left behind would change it.
    alone = _recorded_captures(monkeypatch, ["random", "gradients"])
    after = _recorded_captures(monkeypatch, ["fixed_weights", "random", "gradients"])
    assert len(alone) == 6  # inference and training, both sides, and the gradients
    assert _same(alone, after)


def test_a_fixed_weights_that_left_its_values_behind_would_be_caught(monkeypatch):
    """The test above can fail: a planted fault that keeps the fixed values."""
    import contextlib

    from equivtool.engine import pair as _pair

    alone = _recorded_captures(monkeypatch, ["random", "gradients"])

    @contextlib.contextmanager
    def keeps_its_values(self):
        self.inference_pass()
        yield self.side.read_variables()

    monkeypatch.setattr(_pair._Half, "preserved", keeps_its_values)
    monkeypatch.setattr(_pair.TF2Half, "preserved", keeps_its_values)
    monkeypatch.setattr(_pair.TF1Half, "inference_on", lambda self, values: None)  # the TF1 side assigns too
    after = _recorded_captures(monkeypatch, ["fixed_weights", "random", "gradients"])
    assert not _same(alone, after)


def test_a_tf2_snapshot_that_followed_its_variables_would_be_caught(monkeypatch):
    """The TF2 half keeps the values it puts back as tensors read before the fixed
    values are written (no copy to NumPy and back). Planted fault: a "snapshot"
    that follows the variables (the variables themselves): the fixed values stay
    behind on the TF2 side only, and the next step fails."""
    from equivtool.engine import pair as _pair
    from equivtool.variables.flavour import layer_variables

    monkeypatch.setattr(_pair, "snapshot_layer", lambda layer: [(v, v) for v in layer_variables(layer)])
    x = np.random.RandomState(0).rand(*INPUT_SHAPE).astype(np.float32)
    report = equivtool.check_equivalence(slim_net, SlimNetShim, x, steps=["fixed_weights", "random"],
                                         modes=["constant"])
    assert report.step("fixed_weights").status == "passed"
    assert report.step("random/constant/training").status == "failed", str(report)


def test_a_fed_fixed_weights_that_wrote_its_values_would_be_caught(monkeypatch):
    """The TF1 side feeds the fixed values (nothing to put back); were they written
    instead and left, on both sides, the test above's comparison would see it."""
    import contextlib

    from equivtool.engine import pair as _pair

    alone = _recorded_captures(monkeypatch, ["random", "gradients"])
    fed = _pair.TF1Half.inference_on

    def writes_them(self, values):
        self.side.assign_variables(values)
        return fed(self, values)

    @contextlib.contextmanager
    def keeps_its_values(self):
        self.inference_pass()
        yield self.side.read_variables()

    monkeypatch.setattr(_pair.TF1Half, "inference_on", writes_them)
    monkeypatch.setattr(_pair.TF2Half, "preserved", keeps_its_values)
    after = _recorded_captures(monkeypatch, ["fixed_weights", "random", "gradients"])
    assert not _same(alone, after)


def test_the_tf1_graphs_exchange_values_a_chunk_at_a_time(monkeypatch):
    from equivtool.engine.sides import tf1_side as runners

    def build(training):
        side = runners.TF1Side(slim_net, np.ones(INPUT_SHAPE, np.float32), renamer=lambda n: n, loss_fn=None)
        side.forward(training=training)
        return side

    source, target = build(False), build(True)
    source.initialize()
    runs = []
    original = runners.load_by_initializer
    monkeypatch.setattr(runners, "load_by_initializer", lambda s, pairs: (runs.append(len(pairs)), original(s, pairs)))
    largest = max(runners.variable_bytes(v) for v in source.variables)
    monkeypatch.setattr(runners, "CHUNK_BYTES", largest)
    target.copy_variables_from(source)
    assert len(runs) > 1 and sum(runs) == len(source.variables)  # every variable, in several runs
    mine, theirs = target.read_variables(), source.read_variables()
    assert mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine)
    source.close()
    target.close()


def test_a_copied_variables_initializer_is_not_run():
    """Its values would be overwritten; an initializer that cannot run shows it is skipped."""
    from equivtool.engine.sides import tf1_side as runners

    def fed_init(x, training):
        w = tf.compat.v1.get_variable("w", initializer=tf.compat.v1.placeholder_with_default(
            tf.ones([4, 3]), [4, 3]) * tf.compat.v1.placeholder(tf.float32, [], name="needs_a_feed"))
        b = tf.compat.v1.get_variable("b", initializer=tf.zeros([3]))
        if training:
            tf.compat.v1.get_variable("extra", initializer=tf.constant(2.0))
        return tf.matmul(x, w) + b

    def side(training):
        s = runners.TF1Side(fed_init, X, renamer=lambda n: n, loss_fn=None)
        s.forward(training=training)
        return s

    source, target = side(False), side(True)
    source.assign_variables({"w": np.full([4, 3], 3.0, np.float32), "b": np.arange(3, dtype=np.float32)})
    target.copy_variables_from(source)  # would fail running w's initializer (no feed)
    values = target.read_variables()
    assert np.array_equal(values["w"], np.full([4, 3], 3.0, np.float32))
    assert np.array_equal(values["b"], np.arange(3, dtype=np.float32))
    assert values["extra"] == 2.0  # its own: only the training pass creates it
    source.close()
    target.close()
