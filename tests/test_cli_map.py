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
