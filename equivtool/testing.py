"""Assertions for users' migration tests.

A migration test is a few lines::

    from equivtool.testing import assert_equivalent

    def test_my_model_migrated():
        assert_equivalent(tf1_forward, MyShimLayer, np.ones([2, 32, 32, 3], np.float32))
"""

from __future__ import annotations

from equivtool.report import EquivalenceReport

__all__ = ["assert_equivalent"]


def assert_equivalent(tf1_fn, tf2_layer, inputs, **options) -> EquivalenceReport:
    """Run :func:`equivtool.check_equivalence`; fail with the report's table unless equivalent.

    An INCONCLUSIVE report (a step compared nothing that could differ, e.g.
    all-NaN outputs) fails too.

    Returns the report, so a test can look further (``report.step("gradients")``).
    """
    from equivtool.equivalence import check_equivalence

    __tracebackhide__ = True  # pytest shows the caller's line, not this one
    report = check_equivalence(tf1_fn, tf2_layer, inputs, **options)
    return report.raise_for_failure()
