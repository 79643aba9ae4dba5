"""``equivtool check`` with the training options: ``--tf1-optimizer``/``--tf2-optimizer``,
``--train-steps``, ``--loss`` and ``--checkpoint``, so the optimizer, checkpoint and
resume steps run from the command line as ``check_equivalence`` runs them.
"""

import pytest

from equivtool import cli
from test_cli import TESTS, run_cli
from test_cli_map import _tf1_checkpoint

M = "cli_native_models"
BASE = ["check", f"{M}:tf1", f"{M}:faithful", "--input-shape", "16,5", "--map"]
SGD = ["--tf1-optimizer", f"{M}:tf1_sgd", "--tf2-optimizer"]


def test_the_optimizers_add_the_optimizer_step_and_a_checkpoint_the_checkpoint_step():
    result = run_cli(*BASE, *SGD, f"{M}:sgd", "--train-steps", "2", "--loss", f"{M}:abs_loss",
                     "--checkpoint", "write", "--mode", "constant")
    assert result.returncode == 0, result.stdout + result.stderr
    for step in ("optimizer", "checkpoint", "gradients"):
        assert f"{step:<34} PASSED" in result.stdout, step
    assert "Verdict: EQUIVALENT (8 passed)" in result.stdout
    assert "default loss" not in result.stdout  # the gradients step used --loss


def test_a_planted_learning_rate_slip_fails_the_optimizer_step():
    result = run_cli(*BASE, *SGD, f"{M}:sgd_slip", "--steps", "optimizer", "--train-steps", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "NOT EQUIVALENT" in result.stdout and "failing: optimizer" in result.stdout


def test_resume_from_a_tf1_adam_checkpoint(tmp_path):
    prefix = _tf1_checkpoint(tmp_path)
    result = run_cli(*BASE, "--tf1-optimizer", f"{M}:tf1_adam", "--tf2-optimizer", f"{M}:adam",
                     "--steps", "resume", "--checkpoint", prefix, "--train-steps", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "resume: 2 steps of AdamOptimizer" in result.stdout and "Verdict: EQUIVALENT (1 passed)" in result.stdout


@pytest.mark.parametrize("extra, fragment", [
    (["--tf1-optimizer", f"{M}:tf1_sgd"], "--tf1-optimizer: give both"),
    (["--tf2-optimizer", f"{M}:sgd"], "--tf2-optimizer: give both"),
    (["--train-steps", "0"], "--train-steps: expected a whole number >= 1, got 0"),
    ([*SGD, f"{M}:nope"], "--tf2-optimizer: module 'cli_native_models' has no attribute 'nope'"),
    (["--loss", f"{M}:NOPE"], "--loss: module 'cli_native_models' has no attribute 'NOPE'"),
    (["--checkpoint", "/nonexistent/model"], "--checkpoint: no TF1 checkpoint at '/nonexistent/model'"),
])
def test_bad_training_options_exit_two_with_one_line(extra, fragment, capsys, monkeypatch):
    monkeypatch.chdir(TESTS)
    assert cli.main([*BASE, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and len(err.splitlines()) == 1, err
