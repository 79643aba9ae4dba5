"""`equivtool convert-checkpoint`: exit codes as `check`; bad input one line naming it, nothing written."""

import os

import equivtool
import numpy as np
import tensorflow as tf

from equivtool import cli
from tests import checkpoint_models as cm

ARGS = ["tests.checkpoint_models:NativeNet", "--input-shape", ",".join(map(str, cm.IMAGE))]


def test_converts_with_committed_rules_and_refuses_to_overwrite(tmp_path, capsys):
    assert list(equivtool.map_variables(cm.slim_net, cm.NativeNet, cm.images()).rules) == cm.NATIVE_RENAME
    path = cm.train_tf1(cm.slim_net, cm.images(), lambda: tf.compat.v1.train.AdamOptimizer(0.01), 2,
                        str(tmp_path / "tf1" / "model"))
    out = str(tmp_path / "tf2")
    argv = ["convert-checkpoint", path, ARGS[0], out, *ARGS[1:], "--optimizer",
            "tests.checkpoint_models:keras_adam", "--rename", "tests.checkpoint_models:NATIVE_RENAME"]
    assert cli.main(argv) == cli.EXIT_OK
    printed = capsys.readouterr().out
    assert "8 model variables, 12 slots, iterations=2" in printed and "net/conv1/weights/Adam_1" in printed
    assert "hyperparameters (check them against the TF1 run's): learning_rate=0.01" in printed
    assert "epsilon=1e-08" in printed
    assert os.path.exists(out + ".index")
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "equivtool convert-checkpoint: error: output: a checkpoint exists" in err and len(err.splitlines()) == 1
    assert cli.main(argv + ["--overwrite"]) == cli.EXIT_OK


def test_bad_input_is_exit_2_one_line_and_writes_nothing(tmp_path, capsys):
    out = str(tmp_path / "tf2")
    assert cli.main(["convert-checkpoint", str(tmp_path / "none"), ARGS[0], out, *ARGS[1:]]) == cli.EXIT_USAGE
    assert "tf1_checkpoint:" in capsys.readouterr().err
    path = cm.train_tf1(cm.slim_net, cm.images(), lambda: tf.compat.v1.train.GradientDescentOptimizer(0.01), 1,
                        str(tmp_path / "model"))
    # no --rename: every variable is named as unmapped
    assert cli.main(["convert-checkpoint", path, ARGS[0], out, *ARGS[1:]]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "16 variables do not map" in err and "'net/logits/biases' has no TF2 counterpart" in err
    assert cli.main(["convert-checkpoint", path, ARGS[0], out, *ARGS[1:], "--rename", "tests.checkpoint_models:NOPE"]
                    ) == cli.EXIT_USAGE
    assert "--rename: module 'tests.checkpoint_models' has no attribute 'NOPE'" in capsys.readouterr().err
    assert not [n for n in os.listdir(tmp_path) if n.startswith("tf2")]


def test_token_id_inputs_build_an_embedding_model(tmp_path, capsys):
    path = cm.train_tf1(cm.embedding_net, cm.token_ids(), lambda: tf.compat.v1.train.AdagradOptimizer(0.1), 2,
                        str(tmp_path / "model"))
    out = str(tmp_path / "tf2")
    argv = ["convert-checkpoint", path, "tests.checkpoint_models:NativeEmbedding", out, "--input-shape", "2,5",
            "--input-dtype", "int32", "--rename", "tests.checkpoint_models:EMBEDDING_RENAME",
            "--optimizer", "tests.checkpoint_models:keras_adagrad"]
    assert cli.main(argv) == cli.EXIT_OK
    assert "3 model variables, 3 slots, iterations=2" in capsys.readouterr().out
    tf1, tf2 = tf.train.load_checkpoint(path), tf.train.load_checkpoint(out)
    stored = dict(tf.train.list_variables(out))
    table = [name for name in stored if name.startswith("model/table/") and name.endswith("VARIABLE_VALUE")]
    assert len(table) == 1
    np.testing.assert_array_equal(tf2.get_tensor(table[0]), tf1.get_tensor("emb/table"))
    assert cli.main(argv[:-4] + ["--input-dtype", "int8"]) == cli.EXIT_USAGE  # argparse names the choices
    assert "--input-dtype" in capsys.readouterr().err


def test_inputs_as_check_takes_them_and_one_line_for_the_slots_left_out(tmp_path, capsys):
    path = cm.train_tf1(cm.slim_net, cm.images(), lambda: tf.compat.v1.train.AdamOptimizer(0.01), 1,
                        str(tmp_path / "tf1" / "model"))
    npz = str(tmp_path / "inputs.npz")
    np.savez(npz, cm.images())
    out = str(tmp_path / "tf2")
    argv = ["convert-checkpoint", path, ARGS[0], out, "--inputs", npz,
            "--rename", "tests.checkpoint_models:NATIVE_RENAME"]
    assert cli.main(argv) == cli.EXIT_OK
    printed = capsys.readouterr().out
    left_out = [line for line in printed.splitlines() if "not converted" in line]
    assert len(left_out) == 1 and "optimizer variables" in left_out[0] and "--optimizer" in left_out[0], printed
    # --input is an option of its own (no longer an ambiguous prefix of --input-shape), and one source only.
    both = argv[:4] + ["--input", "x:2,6,6,3:float32", "--input-shape", "2,6,6,3", "--overwrite"]
    assert cli.main(both) == cli.EXIT_USAGE
    assert "exactly one of --input-shape SHAPE, --inputs FILE.npz or --input" in capsys.readouterr().err


def test_help_and_usage_errors_answer_without_tensorflow():
    import subprocess
    import sys
    code = ("import sys, io, contextlib\nfrom equivtool.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "    codes = [main(['convert-checkpoint', '--help']),\n"
            "             main(['convert-checkpoint', 'a', 'b', 'c', '--input-dtype', 'int32']),\n"
            "             main(['convert-checkpoint', 'a', 'b', 'c'])]\n"
            "print(codes, 'tensorflow' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})
    assert done.stdout.split()[-4:] == ["[0,", "2,", "2]", "False"], done.stdout + done.stderr
