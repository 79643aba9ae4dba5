"""``equivtool check --map`` and ``--rename``: a native rewrite whose variable names
differ is checked from the command line, and parity says so when names differ.

Before these options a command-line user with a native Keras rewrite could not
check it at all: every name missed, every step failed, and nothing said why.
"""

import pytest

from equivtool import cli
from equivtool.variables.mapping import native_rewrite_hint
from test_cli import TESTS, run_cli

MODELS = "cli_native_models"
BASE = ["check", f"{MODELS}:tf1"]
SHAPE = ["--input-shape", "16,5"]


def test_map_pairs_a_native_rewrite_and_proves_it_equivalent():
    result = run_cli(*BASE, f"{MODELS}:faithful", *SHAPE, "--map")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--map: 8 variables paired by role and structure (8 renamed)" in result.stdout
    assert "Verdict: EQUIVALENT (8 passed)" in result.stdout
    assert "8/8 variables' values compared after training" in result.stdout


def test_map_still_catches_a_planted_momentum_slip():
    result = run_cli(*BASE, f"{MODELS}:momentum_slip", *SHAPE, "--map", "--steps", "random",
                     "--mode", "constant")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "NOT EQUIVALENT" in result.stdout and "moving_mean" in result.stdout


def test_rename_rules_from_a_module_do_what_map_does():
    result = run_cli(*BASE, f"{MODELS}:faithful", *SHAPE, "--rename", f"{MODELS}:RULES",
                     "--steps", "parity,fixed_weights")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Verdict: EQUIVALENT (2 passed)" in result.stdout


def test_without_a_mapping_parity_says_names_differ_and_how_to_map():
    result = run_cli(*BASE, f"{MODELS}:faithful", *SHAPE, "--steps", "parity")
    assert result.returncode == 1
    assert "names differ: 8 TF1 and 8 TF2 variables have no counterpart by name" in result.stdout
    assert "equivtool check ... --map" in result.stdout


def test_an_incomplete_mapping_is_refused_before_any_step(capsys, monkeypatch):
    monkeypatch.chdir(TESTS)
    code = cli.main([*BASE, f"{MODELS}:with_an_extra_layer", *SHAPE, "--map"])
    out, err = capsys.readouterr()
    assert code == 2 and "variables_once" not in out
    assert "--map: the variable mapping is incomplete" in err and "net/extra/kernel" in err
    assert "--rename MODULE:OBJ" in err


@pytest.mark.parametrize("extra, fragment", [
    (["--map", "--rename", f"{MODELS}:RULES"], "--map and --rename: give one"),
    (["--map", "--tf1-python", "/usr/bin/python3"], "--map: not with --tf1-python"),
    (["--rename", f"{MODELS}:NOPE"], "--rename: module 'cli_native_models' has no attribute 'NOPE'"),
])
def test_conflicting_or_bad_mapping_options_exit_two_with_one_line(extra, fragment, capsys, monkeypatch):
    monkeypatch.chdir(TESTS)
    assert cli.main([*BASE, f"{MODELS}:faithful", *SHAPE, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1, err


def test_the_hint_is_given_only_when_most_names_miss():
    assert native_rewrite_hint(["a/kernel"], ["net/a/kernel"], 0)
    # one renamed layer among matched ones is a slip to show in the table, not a native rewrite
    assert native_rewrite_hint(["b/kernel"], ["b/kernel_1"], 6) is None
    assert native_rewrite_hint([], ["extra/kernel"], 0) is None
    assert native_rewrite_hint(["a/kernel"], [], 0) is None


# -- convert-checkpoint --map and map_checkpoint ---------------------------------

def _tf1_checkpoint(folder, optimizer=True) -> str:
    """cli_native_models.tf1 trained 2 Adam steps (or saved untrained, without slots)."""
    import numpy as np
    import tensorflow as tf
    import cli_native_models

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [16, 5])
        loss = tf.reduce_mean(tf.square(cli_native_models.tf1(x, training=True)))
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            train = v1.train.AdamOptimizer(0.01).minimize(loss) if optimizer else tf.no_op()
        saver = v1.train.Saver()
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            for _ in range(2):
                session.run(train, {x: np.random.RandomState(0).randn(16, 5)})
            return saver.save(session, str(folder / "model"))


@pytest.fixture(scope="module")
def adam_checkpoint(tmp_path_factory):
    return _tf1_checkpoint(tmp_path_factory.mktemp("adam"))


def test_map_checkpoint_pairs_a_native_rewrite_from_the_checkpoint_alone(adam_checkpoint):
    import numpy as np
    import cli_native_models
    from equivtool import map_checkpoint
    from equivtool.checkpoints.checkpoint_map import checkpoint_variables

    found = {v.name: v.trainable for v in checkpoint_variables(adam_checkpoint)}
    assert found == {"bn/beta": True, "bn/gamma": True, "bn/moving_mean": False, "bn/moving_variance": False,
                     "fc1/bias": True, "fc1/kernel": True, "out/bias": True, "out/kernel": True}  # no slots
    mapping = map_checkpoint(adam_checkpoint, cli_native_models.faithful, np.zeros((16, 5), np.float32))
    assert mapping.complete and mapping.pairs["bn/moving_mean"] == "net/bn/moving_mean"
    assert mapping.pairs["fc1/kernel"] == "net/fc1/kernel" and len(mapping.pairs) == 8


def test_a_checkpoint_saved_without_its_optimizer_maps_by_role(tmp_path):
    import numpy as np
    import cli_native_models
    from equivtool import map_checkpoint

    mapping = map_checkpoint(_tf1_checkpoint(tmp_path, optimizer=False), cli_native_models.faithful,
                             np.zeros((16, 5), np.float32))
    assert mapping.complete and mapping.pairs["bn/moving_variance"] == "net/bn/moving_variance"


def test_map_checkpoint_refuses_a_tf2_checkpoint(tmp_path):
    import numpy as np
    import tensorflow as tf
    import cli_native_models
    from equivtool import map_checkpoint

    prefix = tf.train.Checkpoint(v=tf.Variable(1.0)).write(str(tmp_path / "tf2"))
    with pytest.raises(ValueError, match="is a TF2 object-based checkpoint"):
        map_checkpoint(prefix, cli_native_models.faithful, np.zeros((16, 5), np.float32))


def test_convert_checkpoint_map_writes_the_tf1_values_under_the_rewrite_s_names(adam_checkpoint, tmp_path):
    import numpy as np
    import tensorflow as tf
    import cli_native_models

    out = tmp_path / "converted" / "model"
    result = run_cli("convert-checkpoint", adam_checkpoint, f"{MODELS}:faithful", str(out), "--input-shape", "16,5",
                     "--optimizer", f"{MODELS}:adam", "--map")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--map: 8 variables paired by role and structure (8 renamed)" in result.stdout
    model, optimizer = cli_native_models.faithful(), cli_native_models.adam()
    model(np.zeros((16, 5), np.float32))
    tf.train.Checkpoint(model=model, optimizer=optimizer).read(str(out)).expect_partial()
    reader = tf.train.load_checkpoint(adam_checkpoint)
    assert np.array_equal(model.bn.moving_variance.numpy(), reader.get_tensor("bn/moving_variance"))
    assert np.array_equal(model.fc1.kernel.numpy(), reader.get_tensor("fc1/kernel"))
    assert not np.array_equal(reader.get_tensor("fc1/kernel"), 0)


def test_convert_checkpoint_without_a_mapping_says_names_differ_once_per_variable(adam_checkpoint, tmp_path):
    result = run_cli("convert-checkpoint", adam_checkpoint, f"{MODELS}:faithful", str(tmp_path / "m"),
                     "--input-shape", "16,5")
    assert result.returncode == 2
    assert "names differ: 8 TF1 and 8 TF2 variables" in result.stderr and "convert-checkpoint ... --map" in result.stderr
    assert "bn/beta/Adam" not in result.stderr and "12 optimizer slots of those TF1 variables" in result.stderr
    assert not (tmp_path / "m.index").exists()


def test_convert_checkpoint_map_refuses_an_incomplete_mapping_before_writing(adam_checkpoint, tmp_path):
    result = run_cli("convert-checkpoint", adam_checkpoint, f"{MODELS}:with_an_extra_layer", str(tmp_path / "m"),
                     "--input-shape", "16,5", "--map")
    assert result.returncode == 2
    assert "--map: the variable mapping is incomplete" in result.stderr and "net/extra/kernel" in result.stderr
    assert not list(tmp_path.iterdir())
