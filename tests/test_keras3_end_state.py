"""The Keras 3 end state: what a Keras 3 user loads, and the optimizers they train with.

* ``convert_checkpoint(..., format="keras")`` / ``convert-checkpoint --format
  keras`` writes a ``.keras`` file with the model and its optimizer state;
  ``keras.saving.load_model`` reads it and training resumed from it follows
  the TF1 run step by step (a fresh optimizer does not: the comparison can
  fail). The file is written atomically, replaced only when asked, and no
  temporary file survives an error or an interrupt.
* Keras 3 ``AdamW`` (its ``epsilon`` slip caught), ``SGD`` with Nesterov
  momentum, ``RMSprop`` and ``Adagrad`` resume a TF1 run; what cannot be
  converted is refused in one line naming the optimizer and what is missing.
"""

import os
import signal
import zipfile

import equivtool  # noqa: F401  (environment fix before TensorFlow)
import numpy as np
import pytest
import tensorflow as tf

keras = pytest.importorskip("keras")
if not keras.__version__.startswith("3"):
    pytest.skip("Keras 3 is not installed", allow_module_level=True)

from equivtool import check_equivalence, cli, convert_checkpoint  # noqa: E402
from equivtool.variables import make_renamer  # noqa: E402
from tests.keras3_models import TO_TF1, X, Net, adam, tf1_net  # noqa: E402

v1 = tf.compat.v1


def _train(steps, prefix, make_optimizer, more=0, loss_fn=None, tf1_fn=tf1_net, inputs=X):
    """Train ``tf1_fn`` ``steps`` steps, save, then ``more`` steps: returns the
    prefix and each later step's model variables by TF1 name."""
    loss_fn = loss_fn or (lambda outputs, reg: tf.reduce_mean(tf.square(outputs)))
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(1)
        loss = loss_fn(tf1_fn(tf.nest.map_structure(tf.constant, inputs), True), None)
        step = v1.train.get_or_create_global_step()
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            train = make_optimizer().minimize(loss, global_step=step)
        model = [v for v in v1.global_variables() if v.op.name.startswith("net/") and "/Adam" not in v.op.name]
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            for _ in range(steps):
                session.run(train)
            path = v1.train.Saver().save(session, prefix)
            later = []
            for _ in range(more):
                session.run(train)
                later.append(dict(zip([v.op.name for v in model], session.run(model))))
    return path, later


@pytest.fixture(scope="module")
def adam_run(tmp_path_factory):
    return _train(5, str(tmp_path_factory.mktemp("adam") / "model"), lambda: v1.train.AdamOptimizer(0.01), more=3)


def _keras_steps(model, optimizer, steps):
    """``steps`` training steps of the Keras 3 ``model`` (the TF1 run's loss);
    each step's variables by TF1 name."""
    to_tf1 = make_renamer(TO_TF1)
    out = []
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(X, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        # a model loaded from a file names its variables without the model's own scope
        out.append({to_tf1(v.path if v.path.startswith("net/") else "net/" + v.path): v.numpy()
                    for v in model.weights})
    return out


def _worst(expected_steps, actual_steps) -> float:
    """The largest absolute difference over every variable of every step (inf when a name is missing)."""
    worst = 0.0
    for expected, actual in zip(expected_steps, actual_steps):
        assert set(expected) == set(actual), (sorted(expected), sorted(actual))  # every variable compared
        for name, value in expected.items():
            worst = max(worst, float(np.max(np.abs(value - actual[name]))))
    return worst


# --------------------------------------------------------------------------
# format="keras": a .keras file with the optimizer, resumed
# --------------------------------------------------------------------------

def test_a_keras_file_loads_with_its_optimizer_and_resumes_the_tf1_run(adam_run, tmp_path):
    path, later = adam_run
    out = str(tmp_path / "converted.keras")
    assert convert_checkpoint(path, Net, X, out, rename=TO_TF1, optimizer=adam, format="keras") == out
    assert zipfile.is_zipfile(out) and not [n for n in os.listdir(tmp_path) if n != "converted.keras"]
    model = keras.saving.load_model(out)
    assert isinstance(model, Net) and int(model.optimizer.iterations.numpy()) == 5
    reader = tf.train.load_checkpoint(path)
    np.testing.assert_array_equal(model.conv.kernel.numpy(), reader.get_tensor("net/conv1/weights"))
    resumed = _keras_steps(model, model.optimizer, len(later))
    assert len(resumed[0]) == 8 and _worst(later, resumed) < 1e-5


def test_the_resume_comparison_fails_without_the_converted_optimizer_state(adam_run, tmp_path):
    """Planted fault: the weights converted, the optimizer fresh (no m, v, step count)."""
    path, later = adam_run
    out = str(tmp_path / "converted.keras")
    convert_checkpoint(path, Net, X, out, rename=TO_TF1, optimizer=adam, format="keras")
    model = keras.saving.load_model(out)
    assert _worst(later, _keras_steps(model, adam(), len(later))) > 1e-3


def _replaced_only_when_asked(write, tmp_path):
    """``write(output, overwrite=...)`` converts to a .keras file: the user's file
    is replaced only with overwrite, and never written through a symlink."""
    out = tmp_path / "model.keras"
    out.write_bytes(b"the user's file")
    with pytest.raises(ValueError, match=r"^output: .*model.keras' exists; pass overwrite=True \(--overwrite\)"):
        write(out)
    assert out.read_bytes() == b"the user's file"
    write(out, overwrite=True)
    assert zipfile.is_zipfile(out)
    link = tmp_path / "link.keras"
    link.symlink_to(tmp_path / "elsewhere.keras")
    with pytest.raises(ValueError, match="is a symlink; refusing to write through it"):
        write(link, overwrite=True)
    assert not (tmp_path / "elsewhere.keras").exists()
    assert sorted(os.listdir(tmp_path)) == ["link.keras", "model.keras"]


def test_a_keras_file_is_replaced_only_when_asked_and_never_through_a_symlink(adam_run, tmp_path):
    path, _ = adam_run
    _replaced_only_when_asked(lambda out, **kw: convert_checkpoint(path, Net, X, str(out), rename=TO_TF1,
                                                                   optimizer=adam, format="keras", **kw), tmp_path)


def test_bad_keras_outputs_and_sides_are_one_line_and_write_nothing(adam_run, tmp_path):
    path, _ = adam_run
    for output, kwargs, message in [
            (tmp_path / "model.ckpt", {}, r"^output: .*expected a file name ending in \.keras"),
            (tmp_path / "m.keras", {"format": "h5"}, r"^format: expected one of 'checkpoint', 'keras', got 'h5'$"),
            (tmp_path / "m.keras", {"tf2": "tests.keras3_models:tf_keras_net"},
             r"^format='keras': the optimizer is a keras\S*\.Adam; a tf-keras model saves a tf.keras.optimizers "
             r"optimizer$"),
            (tmp_path / "m.keras", {"tf2": "tests.keras3_models:bare_dense"},
             r"^format='keras': the TF2 side is a keras\S*Dense; .*needs a Keras 3 keras.Model or a tf-keras "
             r"tf.keras.Model \(a bare layer: write format='checkpoint'\)$"),
            (tmp_path / "m.keras", {"optimizer": lambda: tf.keras.optimizers.Adam(0.01)},
             r"^format='keras': the optimizer is a tf_keras")]:
        kwargs = dict(kwargs)
        from tests import keras3_models
        tf2 = getattr(keras3_models, kwargs.pop("tf2").split(":")[1]) if "tf2" in kwargs else Net
        kwargs.setdefault("format", "keras")
        kwargs.setdefault("optimizer", adam)
        with pytest.raises(ValueError, match=message) as caught:
            convert_checkpoint(path, tf2, X, str(output), rename=TO_TF1 if tf2 is Net else None, **kwargs)
        assert "\n" not in str(caught.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("interrupt", [RuntimeError("planted"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_no_temporary_file_survives_a_failed_save_and_the_old_file_stays(adam_run, tmp_path, monkeypatch,
                                                                         interrupt):
    path, _ = adam_run
    out = tmp_path / "model.keras"
    out.write_bytes(b"old")
    real_save = Net.save

    def save_then_fail(self, filepath, *args, **kwargs):
        real_save(self, filepath, *args, **kwargs)  # the temporary file is whole ...
        assert os.path.exists(filepath) and filepath != str(out)
        raise interrupt  # ... and then the run stops before the rename

    monkeypatch.setattr(Net, "save", save_then_fail)
    with pytest.raises((ValueError, KeyboardInterrupt)):
        convert_checkpoint(path, Net, X, str(out), rename=TO_TF1, optimizer=adam, format="keras", overwrite=True)
    assert out.read_bytes() == b"old" and os.listdir(tmp_path) == ["model.keras"]


def test_a_failed_save_removes_the_folders_it_created(adam_run, tmp_path, monkeypatch):
    path, _ = adam_run
    monkeypatch.setattr(Net, "save", lambda self, filepath, *a, **k: (_ for _ in ()).throw(RuntimeError("planted")))
    with pytest.raises(ValueError, match="^output: Keras 3 could not save the converted model to a .keras file: "):
        convert_checkpoint(path, Net, X, str(tmp_path / "new" / "deeper" / "m.keras"), rename=TO_TF1,
                           optimizer=adam, format="keras")
    assert os.listdir(tmp_path) == []


SIGTERM_CHILD = """
import os, signal, sys
from tests.keras3_models import TO_TF1, X, Net, adam
import equivtool
real_save = Net.save
def save_then_sigterm(self, filepath, *args, **kwargs):
    real_save(self, filepath, *args, **kwargs)
    assert os.path.exists(filepath)  # the temporary file is whole when the signal comes
    os.kill(os.getpid(), signal.SIGTERM)
Net.save = save_then_sigterm
equivtool.convert_checkpoint(sys.argv[1], Net, X, sys.argv[2], rename=TO_TF1, optimizer=adam, format="keras",
                             overwrite=True)
"""


def test_sigterm_during_the_save_removes_the_temporary_file_and_keeps_the_old_one(adam_run, tmp_path):
    import subprocess
    import sys
    path, _ = adam_run
    out = tmp_path / "model.keras"
    out.write_bytes(b"old")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="3")
    child = subprocess.run([sys.executable, "-c", SIGTERM_CHILD, path, str(out)], cwd=root, env=env,
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == -signal.SIGTERM, child.stderr[-3000:]  # it died by SIGTERM, after cleaning up
    assert os.listdir(tmp_path) == ["model.keras"] and out.read_bytes() == b"old"


def test_the_cli_writes_a_keras_file(adam_run, tmp_path, capsys):
    path, _ = adam_run
    out = str(tmp_path / "model.keras")
    argv = ["convert-checkpoint", path, "tests.keras3_models:Net", out, "--input-shape", "4,5,5,2",
            "--rename", "tests.keras3_models:TO_TF1", "--optimizer", "tests.keras3_models:adam", "--format", "keras"]
    assert cli.main(argv) == cli.EXIT_OK
    printed = capsys.readouterr().out
    assert printed.startswith(f".keras file {out}: 8 model variables, 12 slots, iterations=5")
    assert int(keras.saving.load_model(out).optimizer.iterations.numpy()) == 5
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "output:" in err and "exists; pass overwrite=True (--overwrite)" in err and len(err.splitlines()) == 1


# --------------------------------------------------------------------------
# format="keras" for a tf-keras model: tf-keras' own .keras file, optimizer included
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dense_adam_run(tmp_path_factory):
    from tests.keras3_models import tf1_dense_net
    return _train(4, str(tmp_path_factory.mktemp("dense_adam") / "model"), lambda: v1.train.AdamOptimizer(0.01),
                  more=3, tf1_fn=tf1_dense_net)


def _tf_keras_steps(model, optimizer, steps):
    """``steps`` training steps of the tf-keras ``model``; each step's weights by TF1 name."""
    out = []
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(X, training=True)))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        kernel, bias = model.get_layer("logits").get_weights()
        out.append({"net/logits/weights": kernel, "net/logits/biases": bias})
    return out


def _tf_keras_file(path, out, **kwargs):
    from tests.keras3_models import TF_KERAS_TO_TF1, tf_keras_adam, tf_keras_dense_net
    return convert_checkpoint(path, tf_keras_dense_net, X, str(out), rename=TF_KERAS_TO_TF1,
                              optimizer=tf_keras_adam, format="keras", **kwargs)


def test_a_tf_keras_model_converts_to_a_keras_file_that_tf_keras_loads_and_resumes(dense_adam_run, tmp_path):
    import tf_keras
    path, later = dense_adam_run
    out = tmp_path / "converted.keras"
    assert _tf_keras_file(path, out) == str(out)
    assert zipfile.is_zipfile(out) and os.listdir(tmp_path) == ["converted.keras"]  # nothing else left
    model = tf_keras.models.load_model(str(out))
    assert isinstance(model, tf_keras.Model) and type(model.optimizer).__name__ == "Adam"
    assert int(model.optimizer.iterations.numpy()) == 4
    reader = tf.train.load_checkpoint(path)
    np.testing.assert_array_equal(model.get_layer("logits").get_weights()[0], reader.get_tensor("net/logits/weights"))
    resumed = _tf_keras_steps(model, model.optimizer, len(later))
    assert _worst(later, resumed) < 1e-5


def test_a_tf_keras_keras_file_resumed_without_its_optimizer_state_differs(dense_adam_run, tmp_path):
    """Planted fault: the weights converted, the optimizer fresh (no m, v, step count)."""
    import tf_keras
    from tests.keras3_models import tf_keras_adam
    path, later = dense_adam_run
    _tf_keras_file(path, tmp_path / "converted.keras")
    model = tf_keras.models.load_model(str(tmp_path / "converted.keras"))
    assert _worst(later, _tf_keras_steps(model, tf_keras_adam(), len(later))) > 1e-3


def test_a_tf_keras_keras_file_follows_the_same_write_rules(dense_adam_run, tmp_path):
    path, _ = dense_adam_run
    _replaced_only_when_asked(lambda out, **kw: _tf_keras_file(path, out, **kw), tmp_path)


def test_a_tf_keras_model_with_a_keras3_optimizer_is_refused_in_one_line(dense_adam_run, tmp_path):
    from tests.keras3_models import TF_KERAS_TO_TF1, tf_keras_dense_net
    path, _ = dense_adam_run
    with pytest.raises(ValueError, match=r"^format='keras': the optimizer is a keras\S*\.Adam; a tf-keras model "
                                         r"saves a tf.keras.optimizers optimizer$"):
        convert_checkpoint(path, tf_keras_dense_net, X, str(tmp_path / "m.keras"), rename=TF_KERAS_TO_TF1,
                           optimizer=adam, format="keras")
    assert os.listdir(tmp_path) == []


def test_the_cli_writes_a_tf_keras_keras_file(dense_adam_run, tmp_path, capsys):
    import tf_keras
    path, _ = dense_adam_run
    out = str(tmp_path / "model.keras")
    argv = ["convert-checkpoint", path, "tests.keras3_models:tf_keras_dense_net", out, "--input-shape", "4,5,5,2",
            "--rename", "tests.keras3_models:TF_KERAS_TO_TF1", "--optimizer", "tests.keras3_models:tf_keras_adam",
            "--format", "keras"]
    assert cli.main(argv) == cli.EXIT_OK
    assert capsys.readouterr().out.startswith(f".keras file {out}: 2 model variables, 4 slots, iterations=4")
    assert int(tf_keras.models.load_model(out).optimizer.iterations.numpy()) == 4


# --------------------------------------------------------------------------
# Keras 3 optimizers beyond Adam and plain SGD
# --------------------------------------------------------------------------

def _resume(path, optimizers, **kwargs):
    report = check_equivalence(tf1_net, Net, X, rename=TO_TF1, checkpoint=path, optimizers=optimizers,
                               steps=["resume"], train_steps=2, **kwargs)
    return report, report.step("resume")


# Adam's epsilon matters where sqrt(v) is small: a loss whose gradients are about 1e-6.
SMALL = lambda outputs, reg: 1e-6 * tf.reduce_mean(tf.square(outputs))  # noqa: E731


@pytest.fixture(scope="module")
def small_adam_ckpt(tmp_path_factory):
    return _train(3, str(tmp_path_factory.mktemp("small") / "model"), lambda: v1.train.AdamOptimizer(0.01),
                  loss_fn=SMALL)[0]


def test_keras3_adamw_resumes_a_tf1_adam_run(small_adam_ckpt):
    report, result = _resume(small_adam_ckpt, (lambda: v1.train.AdamOptimizer(0.01),
                                               lambda: keras.optimizers.AdamW(0.01, weight_decay=0.0, epsilon=1e-8)),
                             loss_fn=SMALL)
    assert report.passed, str(report)
    assert "step_1/slots/net/conv1/weights/Adam_1" in {leaf.name for leaf in result.comparisons[0].leaves}
    assert any("AdamW: m, v and iterations as Adam's" in note for note in result.notes)


def test_keras3_adamw_left_at_its_default_epsilon_is_caught(small_adam_ckpt):
    """Planted slip: TF1 Adam's epsilon is 1e-8, Keras 3 AdamW's default 1e-7."""
    report, result = _resume(small_adam_ckpt, (lambda: v1.train.AdamOptimizer(0.01),
                                               lambda: keras.optimizers.AdamW(0.01, weight_decay=0.0)),
                             loss_fn=SMALL)
    assert not report.passed and result.status == "failed"
    assert result.first_divergence.startswith("step_1/variables/net/"), result.first_divergence


def test_keras3_adamw_weight_decay_is_caught_and_stated(small_adam_ckpt):
    report, result = _resume(small_adam_ckpt, (lambda: v1.train.AdamOptimizer(0.01),
                                               lambda: keras.optimizers.AdamW(0.01, epsilon=1e-8)), loss_fn=SMALL)
    assert result.status == "failed"
    assert any("weight_decay=0.004" in note and "TF1 Adam does not" in note for note in result.notes)


@pytest.mark.parametrize("tf1_optimizer, keras3_optimizer", [
    (lambda: v1.train.MomentumOptimizer(0.01, 0.9, use_nesterov=True),
     lambda: keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True)),
    (lambda: v1.train.RMSPropOptimizer(0.01, momentum=0.5, epsilon=1e-7),
     lambda: keras.optimizers.RMSprop(0.01, momentum=0.5)),
    (lambda: v1.train.RMSPropOptimizer(0.01, momentum=0.5, centered=True, epsilon=1e-7),
     lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True)),
    (lambda: v1.train.AdagradOptimizer(0.01), lambda: keras.optimizers.Adagrad(0.01, epsilon=0.0)),
], ids=["nesterov", "rmsprop", "rmsprop-centered", "adagrad"])
def test_keras3_optimizers_resume_a_tf1_run(tmp_path, tf1_optimizer, keras3_optimizer):
    path, _ = _train(3, str(tmp_path / "model"), tf1_optimizer)
    report, result = _resume(path, (tf1_optimizer, keras3_optimizer))
    assert report.passed, str(report)
    slots = [leaf.name for leaf in result.comparisons[0].leaves if "/slots/" in leaf.name]
    assert len(slots) >= 6, slots  # every trainable variable's slots were compared


def test_keras3_rmsprop_with_another_rho_is_caught(tmp_path):
    tf1_optimizer = lambda: v1.train.RMSPropOptimizer(0.01, momentum=0.5, epsilon=1e-7)  # noqa: E731
    path, _ = _train(3, str(tmp_path / "model"), tf1_optimizer)
    report, result = _resume(path, (tf1_optimizer, lambda: keras.optimizers.RMSprop(0.01, rho=0.8, momentum=0.5)))
    assert result.status == "failed"


@pytest.mark.parametrize("optimizer, message", [
    (lambda: keras.optimizers.Nadam(0.01), r"^optimizer: the slot layout of keras\.\S*Nadam is unknown; supported: "),
    (lambda: keras.optimizers.Adam(0.01, use_ema=True), r"^optimizer: Adam\(use_ema=True\) keeps a moving average"),
    (lambda: keras.optimizers.Adam(0.01, amsgrad=True), r"^optimizer: Adam\(amsgrad=True\) keeps a vhat slot"),
    (lambda: keras.optimizers.AdamW(0.01, weight_decay=0.0, amsgrad=True), r"^optimizer: AdamW\(amsgrad=True\)"),
    (lambda: keras.optimizers.SGD(0.01, momentum=0.9), r"^optimizer: the checkpoint holds Adam state; it converts "
                                                       r"to tf.keras.optimizers.Adam, not SGD \(or to AdamW\)$"),
], ids=["nadam", "ema", "amsgrad", "adamw-amsgrad", "sgd-for-adam"])
def test_what_cannot_be_expressed_is_refused_in_one_line(adam_run, tmp_path, optimizer, message):
    with pytest.raises(ValueError, match=message) as caught:
        convert_checkpoint(adam_run[0], Net, X, str(tmp_path / "out"), rename=TO_TF1, optimizer=optimizer)
    assert "\n" not in str(caught.value) and os.listdir(tmp_path) == []


# --------------------------------------------------------------------------
# compare with a Keras 3 .weights.h5 file and the factory of its model
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def weights_files(tmp_path_factory):
    from tests.keras3_models import features_model
    from tests.test_keras3 import _tf1_saved_model
    folder = tmp_path_factory.mktemp("weights")
    rng = np.random.RandomState(3)
    weights = [rng.randn(6, 4).astype("float32"), rng.randn(4).astype("float32"),
               rng.randn(4, 3).astype("float32"), rng.randn(3).astype("float32")]
    _tf1_saved_model(str(folder / "tf1"), weights)
    model = features_model()
    model.set_weights(weights)
    model.save_weights(str(folder / "good.weights.h5"))
    weights[3][1] += 0.5  # planted: one output bias
    model.set_weights(weights)
    model.save_weights(str(folder / "bad.weights.h5"))
    return folder


def test_compare_loads_a_weights_file_into_the_factorys_model(weights_files):
    from tests.keras3_models import features_model
    report = equivtool.compare_models(str(weights_files / "tf1"), str(weights_files / "good.weights.h5"),
                                      factory=features_model, input_shapes="features:4,6")
    assert report.passed, str(report)
    report = equivtool.compare_models(str(weights_files / "tf1"), str(weights_files / "bad.weights.h5"),
                                      factory=features_model, input_shapes="features:4,6")
    assert not report.passed and report.step("outputs").first_divergence == "scores"


def test_the_pass_rests_on_the_loaded_weights(weights_files, monkeypatch):
    """Planted fault: weights that silently do not load leave the model's fresh ones: not equivalent."""
    from tests.keras3_models import features_model
    monkeypatch.setattr(keras.Model, "load_weights", lambda self, path, *a, **k: None)
    report = equivtool.compare_models(str(weights_files / "tf1"), str(weights_files / "good.weights.h5"),
                                      factory=features_model, input_shapes="features:4,6")
    assert not report.passed


def _raises():
    raise RuntimeError("no model today")


@pytest.mark.parametrize("new, factory, message", [
    ("good.weights.h5", None, r"^NEW: .*good.weights.h5 holds weights only \(a Keras 3 .weights.h5 file\); give the "
                              r"factory that builds its model: factory= \(CLI: --factory MODULE:FUNCTION\)$"),
    ("tf1", "features_model", r"^--factory: applies to a Keras 3 .weights.h5 side; neither OLD nor NEW is one$"),
    ("good.weights.h5", 3, r"^--factory: expected a zero-argument callable returning a Keras 3 model, got int$"),
    ("missing.weights.h5", "features_model", r"^NEW: .*missing.weights.h5' does not exist"),
    ("junk.weights.h5", "features_model", r"^.*junk.weights.h5: not a readable HDF5 file"),
    ("good.weights.h5", "deeper_model", r"^.*good.weights.h5: holds 4 weight arrays, the model deeper_model\(\) "
                                        r"builds has 6 weights: not this model's file"),
    ("good.weights.h5", "tf_keras_net", r"^--factory: tf_keras_net\(\) returned tf_keras\.\S+; expected a Keras 3"),
    ("good.weights.h5", "Net", r"^--factory: Net\(\) returned a model without inputs"),
    ("good.weights.h5", _raises, r"^--factory: _raises\(\) raised RuntimeError: no model today$"),
], ids=["no-factory", "no-weights-side", "not-callable", "missing", "junk", "other-model", "tf-keras", "subclassed",
        "factory-raises"])
def test_bad_weights_input_is_one_line(weights_files, new, factory, message):
    from tests import keras3_models
    (weights_files / "junk.weights.h5").write_text("not hdf5")
    factory = getattr(keras3_models, factory) if isinstance(factory, str) else factory
    with pytest.raises(ValueError, match=message) as caught:
        equivtool.compare_models(str(weights_files / "tf1"), str(weights_files / new), factory=factory,
                                 input_shapes="features:4,6")
    assert "\n" not in str(caught.value)


def test_load_side_points_a_weights_file_to_the_factory(weights_files):
    from equivtool.exported import load_side
    with pytest.raises(ValueError, match=r"holds weights only; compare it with compare_models\(\.\.\., factory="):
        load_side(str(weights_files / "good.weights.h5"))


def test_the_cli_compares_a_weights_file_with_a_factory(weights_files, capsys):
    tf1, good = str(weights_files / "tf1"), str(weights_files / "good.weights.h5")
    args = ["compare", tf1, good, "--input-shapes", "features:4,6"]
    assert cli.main(args + ["--factory", "tests.keras3_models:features_model"]) == cli.EXIT_OK
    assert "EQUIVALENT" in capsys.readouterr().out
    assert cli.main(args + ["--factory", "tests.keras3_models:nope"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.strip() == ("equivtool compare: error: --factory: module 'tests.keras3_models' has no attribute "
                           "'nope'")
    assert cli.main(args) == cli.EXIT_USAGE
    assert "holds weights only" in capsys.readouterr().err


# --------------------------------------------------------------------------
# Bessel's correction: fused batch norm vs Keras 3, said in a note
# --------------------------------------------------------------------------

def _bn_check(tf1, tf2, **kwargs):
    from tests.keras3_models import BN_RENAME, SMALL_BATCH
    report = check_equivalence(tf1, tf2, SMALL_BATCH, rename=BN_RENAME, modes=("constant",), steps=["random"],
                               **kwargs)
    return report, report.step("random/constant/training")


@pytest.mark.parametrize("tf_function", [False, True], ids=["eager", "tf_function"])
def test_a_fused_slim_batch_norm_against_keras3_is_not_equivalent_and_says_why(tf_function):
    from tests.keras3_models import fused_slim_net
    report, result = _bn_check(fused_slim_net, Net, tf_function=tf_function)
    assert not report.passed and result.status == "failed"  # the note explains; it does not excuse
    assert result.first_divergence == "variables/net/bn/moving_variance"
    (note,) = [n for n in result.notes if "Bessel" in n]
    assert note.startswith("net/bn/moving_variance: the TF1 moving variance was updated with the batch variance "
                           "times n/(n-1) = 1.03226 (Bessel's correction, n = 32 values per channel: batch 2 x 16 "
                           "positions; momentum 0.9 on both sides)"), note
    assert "Keras 3's BatchNormalization does not" in note and "The rewrite differs from the original" in note
    assert report.step("random/constant/inference").passed  # inference uses the moving variance as converted


def test_a_momentum_slip_gets_no_bessel_note():
    """Planted fault: both sides unfused (the same variance), Keras 3 left at momentum 0.99."""
    from tests.keras3_models import tf1_net
    report, result = _bn_check(tf1_net, lambda: Net(momentum=0.99))
    assert result.status == "failed" and result.first_divergence.startswith("variables/net/bn/moving_")
    assert not [n for n in result.notes if "Bessel" in n]


def test_a_momentum_slip_on_top_of_the_fused_update_gets_no_bessel_note():
    from tests.keras3_models import fused_slim_net
    report, result = _bn_check(lambda x, t: fused_slim_net(x, t, decay=0.99), Net)
    assert result.status == "failed" and not [n for n in result.notes if "Bessel" in n]


def test_the_bessel_test_needs_the_factor_itself():
    from equivtool.engine._bessel import _explained, bessel_notes
    rng = np.random.RandomState(0)
    old, batch_var, k, n = np.ones(8), rng.uniform(0.5, 2.0, 8), 0.1, 32
    tf2 = ((1 - k) * old + k * batch_var).astype(np.float32)
    tf1 = ((1 - k) * old + k * batch_var * n / (n - 1)).astype(np.float32)
    found = _explained(old, tf1, tf2, batch=2)
    assert found[0] == 32 and found[1] == pytest.approx(32 / 31) and found[2] == pytest.approx(0.9, abs=1e-4)
    assert _explained(old, tf1, tf2, batch=5) is None  # 32 values per channel: not a multiple of the batch
    assert _explained(old, (1 - 2 * k) * old + 2 * k * batch_var, tf2, batch=2) is None  # a momentum slip
    assert _explained(old, tf2 + 1e-3 * rng.randn(8), tf2, batch=2) is None  # noise
    assert _explained(old[:1], tf1[:1], tf2[:1], batch=2) is None  # one channel: nothing to fit
    assert _explained(old, tf2, tf2, batch=2) is None  # nothing differs
    start = {"bn/moving_variance": old}
    assert bessel_notes(start, start, {"bn/moving_variance": tf1}, {"bn/moving_variance": tf2}, np.zeros((2, 3)))
    # nothing compared, or starts unknown or unequal: no note
    assert bessel_notes(None, start, {"bn/moving_variance": tf1}, {"bn/moving_variance": tf2}, np.zeros((2, 3))) == []
    assert bessel_notes(start, {"bn/moving_variance": old * 2}, {"bn/moving_variance": tf1},
                        {"bn/moving_variance": tf2}, np.zeros((2, 3))) == []
    assert bessel_notes(start, start, {}, {}, np.zeros((2, 3))) == []


# --------------------------------------------------------------------------
# rename rules alone on a native rewrite: "weights not aligned", not a bare verdict
# --------------------------------------------------------------------------

def _notes(report, prefix="weights not aligned"):
    return [note for step in report.steps for note in step.notes if note.startswith(prefix)]


def test_rules_alone_on_a_native_rewrite_say_the_weights_are_not_aligned():
    from tests import checkpoint_models as cm
    report = check_equivalence(cm.slim_net, cm.NativeNet, cm.images(), rename=cm.NATIVE_RENAME, modes=("constant",),
                               steps=["random"])
    assert not report.passed
    (note,) = _notes(report)
    assert note.startswith("weights not aligned: 2 variables differ although the training-mode pass updates none "
                           "of them ('net/conv1/weights', 'net/logits/weights')"), note
    assert "rename=equivtool.map_variables(tf1_fn, tf2_factory, inputs)" in note
    # following that advice aligns them: the same rewrite is equivalent
    mapping = equivtool.map_variables(cm.slim_net, cm.NativeNet, cm.images())
    aligned = check_equivalence(cm.slim_net, cm.NativeNet, cm.images(), rename=mapping, modes=("constant",),
                                steps=["random"])
    assert aligned.passed and not _notes(aligned), str(aligned)


def test_a_real_slip_under_aligned_weights_gets_no_alignment_note():
    """Planted fault: a batch-norm momentum slip; the weights are aligned (a mapping) or equal (Keras 3 seeds)."""
    from tests import checkpoint_models as cm
    mapping = equivtool.map_variables(cm.slim_net, cm.NativeNet, cm.images())
    report = check_equivalence(cm.slim_net, lambda: cm.NativeNet(momentum=0.5), cm.images(), rename=mapping,
                               modes=("constant",), steps=["random"])
    assert not report.passed and not _notes(report)
    report = check_equivalence(tf1_net, lambda: Net(momentum=0.5), X, rename=TO_TF1, modes=("constant",),
                               steps=["random"])
    assert not report.passed and not _notes(report)


def test_the_alignment_note_needs_differing_weights():
    from equivtool.comparison import compare
    from equivtool.engine._unaligned import unaligned_note
    from equivtool.report import StepResult
    same, other = np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32)

    def step(expected, actual):
        return StepResult.from_comparisons("random/constant/training", "t", [compare(expected, actual,
                                                                                      name="variables")])
    assert unaligned_note(step({"a/kernel": same}, {"a/kernel": other}), None)
    assert unaligned_note(step({"a/kernel": same}, {"a/kernel": other}), "weights aligned: ...") is None
    assert unaligned_note(step({"a/moving_mean": same}, {"a/moving_mean": other}), None) is None
    assert unaligned_note(step({"a/kernel": same}, {"a/kernel": same}), None) is None
    assert unaligned_note(StepResult.from_comparisons("s", "t", []), None) is None  # nothing compared


# --------------------------------------------------------------------------
# a Transformer encoder with dict int inputs: MultiHeadAttention mapped with no hand rule
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def encoder_mapping():
    from tests.keras3_models import FEATURES, Encoder, tf1_encoder
    return equivtool.map_variables(tf1_encoder, Encoder, FEATURES)


def test_the_attention_kernels_map_with_no_hand_rule(encoder_mapping):
    assert encoder_mapping.complete, encoder_mapping.problems()
    pairs = dict(encoder_mapping.pairs)
    assert pairs["encoder/attention/output/kernel"] == "encoder/attention/attention_output/kernel"
    assert pairs["encoder/attention/query/bias"] == "encoder/attention/query/bias"
    assert pairs["encoder/word_embeddings"] == "encoder/word_embeddings/embeddings"
    assert dict(encoder_mapping.transforms) == {
        f"encoder/attention/{p}/{r}": "reshape" for p in ("query", "key", "value") for r in ("kernel", "bias")
    } | {"encoder/attention/output/kernel": "reshape"}  # the output bias is [hidden] on both sides
    assert encoder_mapping.tf2_shapes["encoder/attention/query/kernel"] == (8, 2, 4)


@pytest.mark.parametrize("tf_function", [False, True], ids=["eager", "tf_function"])
def test_a_keras3_transformer_encoder_is_equivalent_with_every_default_step(encoder_mapping, tf_function):
    from tests.keras3_models import FEATURES, Encoder, tf1_encoder
    report = check_equivalence(tf1_encoder, Encoder, FEATURES, rename=encoder_mapping, tf_function=tf_function)
    assert report.passed and len(report.steps) == 8, str(report)
    assert report.step("gradients").passed and report.step("fixed_weights").passed


def test_a_transposed_square_kernel_in_the_rewrite_is_caught(encoder_mapping):
    """Planted slip: the [hidden, hidden] intermediate kernel applied transposed (the shapes cannot tell)."""
    from tests.keras3_models import FEATURES, Encoder, tf1_encoder
    slip_mapping = equivtool.map_variables(tf1_encoder, lambda: Encoder(slip=True), FEATURES)
    assert slip_mapping.complete and dict(slip_mapping.pairs) == dict(encoder_mapping.pairs)
    report = check_equivalence(tf1_encoder, lambda: Encoder(slip=True), FEATURES, rename=slip_mapping,
                               steps=["fixed_weights"])
    assert not report.passed and report.step("fixed_weights").status == "failed"


def test_a_tf1_momentum_run_of_the_encoder_resumes_in_keras3(encoder_mapping, tmp_path):
    """(Momentum is linear in the gradient, so the repeated token ids agree; with Adam they do not:
    see the repeated-rows tests below.)"""
    from tests.keras3_models import FEATURES, Encoder, tf1_encoder
    make_tf1 = lambda: v1.train.MomentumOptimizer(0.05, 0.9)  # noqa: E731
    path, _ = _train(3, str(tmp_path / "model"), make_tf1, tf1_fn=tf1_encoder, inputs=FEATURES)
    report = check_equivalence(tf1_encoder, Encoder, FEATURES, rename=encoder_mapping, checkpoint=path,
                               optimizers=(make_tf1, lambda: keras.optimizers.SGD(0.05, momentum=0.9)),
                               steps=["resume"], train_steps=2)
    assert report.passed, str(report)
    names = {leaf.name for leaf in report.step("resume").comparisons[0].leaves}
    assert "step_1/slots/encoder/attention/query/kernel/Momentum" in names  # a reshaped slot, in TF1's layout


def test_attention_blocks_pair_by_structure_only_when_every_part_agrees():
    from equivtool.variables.attention import attention_pairs
    from equivtool.variables import VariableInfo

    def infos(*specs):
        return {name: VariableInfo(name, tuple(shape), "float32", True) for name, shape in specs}
    keras_block = [(f"enc/layer_{i}/attention/{p}/{r}", s) for i in (0, 1)
                   for p, r, s in [("query", "kernel", (8, 2, 4)), ("query", "bias", (2, 4)),
                                   ("key", "kernel", (8, 2, 4)), ("key", "bias", (2, 4)),
                                   ("value", "kernel", (8, 2, 4)), ("value", "bias", (2, 4)),
                                   ("attention_output", "kernel", (2, 4, 8)), ("attention_output", "bias", (8,))]]
    bert = [(f"bert/encoder/layer_{i}/attention/{scope}/{r}", s) for i in (0, 1)
            for scope, r, s in [("self/query", "kernel", (8, 8)), ("self/query", "bias", (8,)),
                                ("self/key", "kernel", (8, 8)), ("self/key", "bias", (8,)),
                                ("self/value", "kernel", (8, 8)), ("self/value", "bias", (8,)),
                                ("output/dense", "kernel", (8, 8)), ("output/dense", "bias", (8,))]]
    pairs, transforms = attention_pairs(infos(*bert), infos(*keras_block), set())
    assert len(pairs) == 16 and len(transforms) == 14  # the output biases keep their shape
    assert pairs["bert/encoder/layer_1/attention/output/dense/kernel"] == \
        "enc/layer_1/attention/attention_output/kernel"  # the blocks in creation order
    assert pairs["bert/encoder/layer_0/attention/self/key/bias"] == "enc/layer_0/attention/key/bias"
    # one block against two: nothing paired; a projection of another size: that block left alone
    assert attention_pairs(infos(*bert[:8]), infos(*keras_block), set()) == ({}, {})
    odd = [(n, (8, 6) if n.endswith("self/value/kernel") and "layer_0" in n else s) for n, s in bert]
    pairs, _ = attention_pairs(infos(*odd), infos(*keras_block), set())
    assert pairs and not [n for n in pairs if "layer_0" in n]


# --------------------------------------------------------------------------
# Adam and a repeated token: TF1 squares a row's summed gradient, Keras 3 each occurrence
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def encoder_adam_run(tmp_path_factory):
    from tests.keras3_models import FEATURES, tf1_encoder
    # seeded: the initial values (so the size of the repeated rows' difference) are the same in every process
    with equivtool.DeterministicRandomTestTool(seed=0, mode="num_random_ops").scope():
        path, _ = _train(3, str(tmp_path_factory.mktemp("encoder_adam") / "model"),
                         lambda: v1.train.AdamOptimizer(0.01), tf1_fn=tf1_encoder, inputs=FEATURES)
    return path


def _encoder_adam_resume(mapping, checkpoint, make_tf2=lambda: keras.optimizers.Adam(0.01, epsilon=1e-8)):
    from tests.keras3_models import FEATURES, Encoder, tf1_encoder
    report = check_equivalence(tf1_encoder, Encoder, FEATURES, rename=mapping, checkpoint=checkpoint,
                               optimizers=(lambda: v1.train.AdamOptimizer(0.01), make_tf2), steps=["resume"],
                               train_steps=2)
    return report, report.step("resume")


def _square_notes(result):
    return [note for note in result.notes if "appears more than once in the batch's sparse gradient" in note]


def test_an_adam_run_of_the_encoder_differs_in_keras3_where_a_token_repeats_and_says_why(encoder_mapping,
                                                                                          encoder_adam_run):
    """Token ids 3 (three times) and 5 (twice) repeat in FEATURES: Keras 3's Adam adds
    their squared gradients, TF1's squares their sum. Only those rows differ at step 1
    (by 1.9e-5 in the table, 2.7e-5 in its Adam_1 slot, against noise floors of 1e-8)."""
    report, result = _encoder_adam_resume(encoder_mapping, encoder_adam_run)
    assert not report.passed and result.status == "failed"  # the note explains; it does not excuse
    step_1 = {leaf.name for leaf in result.comparisons[0].leaves if not leaf.ok}
    assert step_1 and step_1 <= {"step_1/variables/encoder/word_embeddings",
                                 "step_1/slots/encoder/word_embeddings/Adam_1"}, step_1
    (note,) = _square_notes(result)
    assert note.startswith("encoder/word_embeddings: only rows [3, 5] differ at step_1"), note
    assert "repeated rows: [3, 5])" in note
    assert "TF1's AdamOptimizer sums a row's occurrences" in note and "Keras 3's Adam squares each" in note
    assert "tf.convert_to_tensor(gradient)" in note


def test_the_same_adam_run_resumes_exactly_when_the_repeated_rows_are_summed_first(encoder_mapping,
                                                                                   encoder_adam_run, monkeypatch):
    """The cause, proven: the same Keras 3 Adam given summed (dense) gradients is equivalent."""
    real_apply = keras.optimizers.Adam.apply

    def summed_first(self, grads, trainable_variables=None):
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        return real_apply(self, grads, trainable_variables)
    monkeypatch.setattr(keras.optimizers.Adam, "apply", summed_first)
    report, result = _encoder_adam_resume(encoder_mapping, encoder_adam_run)
    assert report.passed and not _square_notes(result), str(report)
    names = {leaf.name for leaf in result.comparisons[-1].leaves}
    assert "step_2/slots/encoder/word_embeddings/Adam_1" in names


def test_an_epsilon_slip_on_the_encoder_gets_no_repeated_rows_note(encoder_mapping, encoder_adam_run):
    """Planted fault: Keras' default epsilon (1e-7): every row and variable moves, not only the repeated rows."""
    report, result = _encoder_adam_resume(encoder_mapping, encoder_adam_run,
                                          lambda: keras.optimizers.Adam(0.01))
    assert result.status == "failed" and not _square_notes(result)


def test_the_optimizer_step_names_the_repeated_rows_too(encoder_mapping):
    from tests.keras3_models import FEATURES, Encoder, tf1_encoder
    report = check_equivalence(tf1_encoder, Encoder, FEATURES, rename=encoder_mapping, steps=["optimizer"],
                               optimizers=(lambda: v1.train.AdamOptimizer(0.01),
                                           lambda: keras.optimizers.Adam(0.01, epsilon=1e-8)))
    result = report.step("optimizer")
    assert result.status == "failed"
    (note,) = _square_notes(result)
    assert note.startswith("encoder/word_embeddings: only rows [3"), note
    assert "repeated rows: [3, 5])" in note


def test_the_repeated_rows_rule_needs_only_repeated_rows_to_differ():
    from equivtool.comparison import Tolerance, compare
    from equivtool.engine._sparse_squares import repeated_rows, sparse_square_notes, squaring_kind
    assert repeated_rows(np.array([[5, 0, 3, 3], [9, 3, 5, 2]])) == [3, 5] and repeated_rows([1, 2]) == []
    assert squaring_kind(keras.optimizers.AdamW(0.1)) == "AdamW"
    assert squaring_kind(keras.optimizers.SGD(0.1, momentum=0.9)) is None  # linear in the gradient
    assert squaring_kind(tf.keras.optimizers.Adam(0.1)) is None  # tf-keras sums repeated rows first
    table = np.zeros((6, 2), np.float32)
    moved = table.copy()
    moved[3] = 1e-3

    def notes(expected, actual, repeated={"emb": [3, 5]}, kind="Adam"):
        expected, actual = [expected], [actual]
        comparisons = [compare(e, a, Tolerance(), name=f"step_{i + 1}")
                       for i, (e, a) in enumerate(zip(expected, actual))]
        return sparse_square_notes(comparisons, expected, actual, repeated, kind, "AdamOptimizer")
    ok = {"loss": np.float32(1), "variables": {"emb": table, "w": table}, "slots": {"emb/Adam_1": table}}
    slot_only = {**ok, "slots": {"emb/Adam_1": moved}}
    assert notes(ok, slot_only)  # a repeated row's velocity
    other_row = table.copy()
    other_row[1] = 1e-3
    assert notes(ok, {**ok, "slots": {"emb/Adam_1": other_row}}) == []  # a row the batch holds once
    assert notes(ok, {**slot_only, "variables": {"emb": table, "w": moved}}) == []  # another variable too
    assert notes(ok, {**slot_only, "loss": np.float32(2)}) == []  # the loss too
    assert notes(ok, slot_only, kind=None) == []  # an optimizer that sums first (or is linear)
    assert notes(ok, slot_only, repeated={}) == []  # no repeated rows
    assert notes(ok, ok) == []  # nothing differs
    assert sparse_square_notes([], [], [], {"emb": [3]}, "Adam", "AdamOptimizer") == []  # nothing compared


# --------------------------------------------------------------------------
# Bessel's correction in the optimizer and resume steps: the same rule, the same note
# --------------------------------------------------------------------------

def _sgd_pair():
    return (lambda: v1.train.MomentumOptimizer(0.01, 0.9), lambda: keras.optimizers.SGD(0.01, momentum=0.9))


def _bessel_notes(result):
    return [note for note in result.notes if "Bessel's correction" in note]


def _bessel_named_unless_slip(report, result, slip):
    """The step failed at the moving variance's first step; the note is there unless ``slip``."""
    assert not report.passed and result.status == "failed"  # the note explains; it does not excuse
    failing = {leaf.name for leaf in result.comparisons[0].leaves if not leaf.ok}
    assert "step_1/variables/net/conv1/BatchNorm/moving_variance" in failing, failing
    if slip:
        assert not _bessel_notes(result)
    else:
        (note,) = _bessel_notes(result)
        assert note.startswith("net/conv1/BatchNorm/moving_variance: the TF1 moving variance was updated with the "
                               "batch variance times n/(n-1) = 1.03226 (Bessel's correction, n = 32 values per "
                               "channel: batch 2 x 16 positions; momentum 0.9 on both sides)"), note


@pytest.mark.parametrize("slip", [False, True], ids=["fused", "momentum-slip"])
def test_the_optimizer_step_names_bessels_correction_and_not_a_momentum_slip(slip):
    from tests.keras3_models import SMALL_BATCH, fused_slim_net
    tf1 = (lambda x, t: fused_slim_net(x, t, decay=0.99)) if slip else fused_slim_net
    report = check_equivalence(tf1, Net, SMALL_BATCH, rename=TO_TF1, modes=("constant",), steps=["optimizer"],
                               optimizers=_sgd_pair(), train_steps=2)
    _bessel_named_unless_slip(report, report.step("optimizer"), slip)


@pytest.mark.parametrize("slip", [False, True], ids=["fused", "momentum-slip"])
def test_the_resume_step_names_bessels_correction_and_not_a_momentum_slip(slip, tmp_path):
    from tests.keras3_models import SMALL_BATCH, fused_slim_net
    tf1 = (lambda x, t: fused_slim_net(x, t, decay=0.99)) if slip else fused_slim_net
    make_tf1, make_tf2 = _sgd_pair()
    path, _ = _train(2, str(tmp_path / "model"), make_tf1, tf1_fn=tf1, inputs=SMALL_BATCH)
    report = check_equivalence(tf1, Net, SMALL_BATCH, rename=TO_TF1, checkpoint=path, steps=["resume"],
                               optimizers=(make_tf1, make_tf2), train_steps=2)
    _bessel_named_unless_slip(report, report.step("resume"), slip)


def test_the_first_step_rule_needs_a_first_step_and_its_start():
    from equivtool.engine._bessel import first_step_notes, moving_of
    rng = np.random.RandomState(1)
    old, batch_var, k, n = np.ones(6), rng.uniform(0.5, 2.0, 6), 0.1, 32
    tf2 = {"bn/moving_variance": ((1 - k) * old + k * batch_var).astype(np.float32)}
    tf1 = {"bn/moving_variance": ((1 - k) * old + k * batch_var * n / (n - 1)).astype(np.float32)}
    start = moving_of({"bn/moving_variance": old, "bn/moving_mean": old, "w": old})
    assert list(start) == ["bn/moving_variance"]
    assert first_step_notes(start, start, [tf1, tf2], [tf2, tf2], np.zeros((2, 3)))  # the first step is fitted
    assert first_step_notes(start, start, [tf2, tf1], [tf2, tf2], np.zeros((2, 3))) == []  # not a later one
    assert first_step_notes(start, start, [], [], np.zeros((2, 3))) == []  # nothing compared
    assert first_step_notes({}, start, [tf1], [tf2], np.zeros((2, 3))) == []  # no start


def test_the_rule_after_one_update_needs_both_updates_to_be_bessels():
    """The optimizer step starts after the pair's training pass: one update already apart."""
    from equivtool.engine._bessel import _explained_after_one, bessel_notes
    rng = np.random.RandomState(2)
    s, b, k, n = rng.uniform(0.5, 1.5, 6), rng.uniform(0.5, 2.0, 6), 0.1, 32
    c = n / (n - 1)
    o1, o2 = (1 - k) * s + k * c * b, (1 - k) * s + k * b  # the training pass
    p, q = (1 - k) * o1 + k * c * b, (1 - k) * o2 + k * b  # the first step, the same batch variance
    f32 = [v.astype(np.float32) for v in (o1, o2, p, q)]
    found = _explained_after_one(*f32, batch=2)
    assert found[0] == 32 and found[2] == pytest.approx(0.9, abs=1e-4)
    k2 = 0.01  # a momentum slip: both biased, 0.99 against 0.9
    slip = [(1 - k2) * s + k2 * b, o2, (1 - k2) * ((1 - k2) * s + k2 * b) + k2 * b, q]
    assert _explained_after_one(*[v.astype(np.float32) for v in slip], batch=2) is None
    assert _explained_after_one(f32[0], f32[1], f32[2] + np.float32(1e-4) * rng.randn(6).astype(np.float32),
                                f32[3], batch=2) is None  # noise on one side
    assert _explained_after_one(f32[1], f32[1], f32[3], f32[3], batch=2) is None  # nothing differs
    assert _explained_after_one(*f32, batch=5) is None  # 32 is not a multiple of 5
    key = "bn/moving_variance"
    # unequal starts are fitted only when the caller says they are one update apart
    assert bessel_notes({key: f32[0]}, {key: f32[1]}, {key: f32[2]}, {key: f32[3]}, np.zeros((2, 3))) == []
    assert bessel_notes({key: f32[0]}, {key: f32[1]}, {key: f32[2]}, {key: f32[3]}, np.zeros((2, 3)),
                        after_one_update=True)


# --------------------------------------------------------------------------
# the attention reshape: a TF1 code that splits its heads otherwise is refused, by name
# --------------------------------------------------------------------------

def test_the_tf1_graph_shows_how_it_splits_the_heads():
    from equivtool.variables.mapping import tf1_graph_variables
    from tests.keras3_models import FEATURES, HEAD_SIZE, HEADS, tf1_encoder
    splits = dict(tf1_graph_variables(tf1_encoder, FEATURES).head_splits)
    assert {k: splits[f"encoder/attention/{k}/kernel"] for k in ("query", "key", "value")} == \
        {k: (HEADS, HEAD_SIZE) for k in ("query", "key", "value")}
    assert "encoder/intermediate/kernel" not in splits  # no reshape follows it
    heads_last = dict(tf1_graph_variables(lambda f, t: tf1_encoder(f, t, heads_last=True), FEATURES).head_splits)
    assert heads_last["encoder/attention/query/kernel"] == (HEAD_SIZE, HEADS)


def test_a_tf1_encoder_that_splits_its_heads_last_is_refused_naming_the_kernel():
    """Planted slip in the TF1 layout: [..., head_size, heads]; "reshape" would pair other columns."""
    from tests.keras3_models import FEATURES, Encoder, tf1_encoder
    heads_last = lambda f, t: tf1_encoder(f, t, heads_last=True)  # noqa: E731
    mapping = equivtool.map_variables(heads_last, Encoder, FEATURES)
    assert not mapping.complete
    ((tf1_names, tf2_names, why),) = mapping.refused
    assert "encoder/attention/query/kernel" in tf1_names and "encoder/attention/attention_output/kernel" in tf2_names
    assert len(tf1_names) == len(tf2_names) == 8 and not [n for n in mapping.pairs if "/attention/" in n]
    assert why.startswith("the TF1 graph splits encoder/attention/query/kernel [8, 8]'s width into [..., 4, 2] "
                          "(its Reshape), encoder/attention/query/kernel [8, 2, 4] holds [heads=2, "
                          "head_size=4]"), why
    assert "mapping.resolve({'encoder/attention/query/kernel': ('encoder/attention/query/kernel', 'reshape')}) " \
           "would pair other columns" in why and "\n" not in why
    with pytest.raises(ValueError, match=r"splits encoder/attention/query/kernel \[8, 8\]'s width"):
        check_equivalence(heads_last, Encoder, FEATURES, rename=mapping, steps=["fixed_weights"])
    # the refusal is right: declared by hand anyway, the reshape fails the fixed_weights step
    forced = mapping.resolve({a: (b, "reshape") if a in dict(mapping.tf1_shapes) and
                              mapping.tf1_shapes[a] != mapping.tf2_shapes[b] else b
                              for a, b in zip(tf1_names, tf2_names)})
    assert forced.complete
    report = check_equivalence(heads_last, Encoder, FEATURES, rename=forced, steps=["fixed_weights"])
    assert report.step("fixed_weights").status == "failed"


def test_the_split_rule_needs_a_different_split():
    from equivtool.variables.attention import split_refusals
    from equivtool.variables import VariableInfo
    info = lambda n, s: VariableInfo(n, s, "float32", True)  # noqa: E731
    tf1 = {"b/query/kernel": info("b/query/kernel", (8, 8))}
    tf2 = {"e/att/query/kernel": info("e/att/query/kernel", (8, 2, 4))}
    pairs, transforms = {"b/query/kernel": "e/att/query/kernel"}, {"b/query/kernel": "reshape"}
    assert split_refusals(pairs, transforms, tf1, tf2, {"b/query/kernel": (4, 2)})
    assert split_refusals(pairs, transforms, tf1, tf2, {"b/query/kernel": (2, 4)}) == []  # BERT's split
    assert split_refusals(pairs, transforms, tf1, tf2, {}) == []  # the graph does not show it
    assert split_refusals({}, {}, tf1, tf2, {"b/query/kernel": (4, 2)}) == []  # nothing paired
