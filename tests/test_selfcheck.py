"""equivtool doctor's live check (equivtool.cli.selfcheck): passes here, fails on each planted fault."""

from __future__ import annotations

import equivtool  # noqa: F401  (before TensorFlow)

import pytest
import tensorflow as tf

from equivtool import cli, ops, seeding
from equivtool.seeding import tool as seeding_tool
from equivtool.cli import selfcheck as _selfcheck


def test_both_checks_pass_on_this_tensorflow():
    checks = _selfcheck.run_selfchecks()
    assert [c.name for c in checks] == ["random tool", "xent op live"]
    assert all(c.ok for c in checks), [str(c) for c in checks]
    assert str(checks[0]).startswith("random tool     ok: ")


def test_random_check_finds_a_float_seed_as_tf_keras_2_16_got_it(monkeypatch):
    # What tf-keras 2.16-2.18 received before the fix: randint(1, 1e9) -> a float.
    monkeypatch.setattr(seeding_tool._KerasSeedSource, "randint",
                        lambda self, a, b: float(self._tool._next_keras_seed(int(a), int(b))))
    check = _selfcheck.check_random_tool()
    assert not check.ok
    assert "cannot seed on this TensorFlow/tf-keras" in check.detail and "Tseed" in check.detail


def test_random_check_finds_constant_mode_not_constant(monkeypatch):
    seeds = iter(range(1, 1000))
    monkeypatch.setattr(seeding.DeterministicRandomTestTool, "_next_keras_seed",
                        lambda self, low, high: next(seeds))
    check = _selfcheck.check_random_tool()
    assert not check.ok
    assert "two equal-shaped tf-keras initializers different values" in check.detail


def test_random_check_finds_draws_that_are_not_random(monkeypatch):
    # a seed source that always gives one seed: num_random_ops compares equal draws
    monkeypatch.setattr(seeding.DeterministicRandomTestTool, "_next_keras_seed", lambda self, low, high: 7)
    check = _selfcheck.check_random_tool()
    assert not check.ok
    assert "num_random_ops mode gave two successive initializers the same values" in check.detail


def test_op_check_finds_a_wrong_loss(monkeypatch):
    real = ops.sparse_softmax_cross_entropy_with_logits
    monkeypatch.setattr(ops, "sparse_softmax_cross_entropy_with_logits",
                        lambda labels, logits: real(labels=labels, logits=logits) * 1.001)
    check = _selfcheck.check_op()
    assert not check.ok and "differs from TensorFlow's op" in check.detail


def test_op_check_finds_an_op_that_cannot_load(monkeypatch):
    def missing(labels, logits):
        raise ops.OpLibraryError("the op library is missing: run equivtool build-ops")
    monkeypatch.setattr(ops, "sparse_softmax_cross_entropy_with_logits", missing)
    check = _selfcheck.check_op()
    assert not check.ok and "OpLibraryError: the op library is missing" in check.detail


def test_doctor_exits_non_zero_with_the_reason(monkeypatch, capsys):
    monkeypatch.setattr(seeding_tool._KerasSeedSource, "randint", lambda self, a, b: float(a))
    assert cli.main(["doctor"]) == cli.EXIT_DIFFERENT != cli.EXIT_OK
    out = capsys.readouterr().out
    assert "random tool     FAILS: cannot seed" in out
    assert "Problems:" in out and "  - random tool: FAILS: cannot seed on this TensorFlow/tf-keras" in out
    assert "The environment can run equivtool." not in out


def test_doctor_passes_with_both_checks_shown(capsys):
    assert cli.main(["doctor"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "random tool     ok" in out and "xent op live    ok" in out
