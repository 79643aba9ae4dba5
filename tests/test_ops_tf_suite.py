"""TensorFlow's own kernel tests for its cross-entropy ops, run against
TensorFlow's op and against equivtool's.

The test bases ship inside the TensorFlow wheel
(``tensorflow/python/kernel_tests/sparse_ops/sparse_xent_op_test_base.py`` and
``nn_ops/xent_op_test_base.py``). Each is run twice, unchanged:

- ``TestTensorFlowSparseXent`` / ``TestTensorFlowXent``: TensorFlow's op, the
  baseline (what TF 2.21's own op passes here);
- ``TestEquivtoolSparseXent`` / ``TestEquivtoolXent``: the same cases with the
  op under test routed to equivtool's: the ``_opFwdBwd`` hook TF provides for
  other implementations calls ``equivtool.ops`` directly, and every case runs
  inside ``deterministic_xent()``, so the cases that call ``nn_ops`` themselves
  reach equivtool's op too.

Every case TensorFlow's op passes must pass with equivtool's, except those in
``GRAPH_STRUCTURE_CASES`` (they assert which TF-internal ops TF's own gradient
builds, not numbers). Measured on TF 2.21, CPU: of the sparse base's 18 cases,
17 pass for TensorFlow's op and 17 for equivtool's (testInvalidLabelGPU is
skipped by TF's own ``run_gpu_only`` without a GPU); of the dense base's 13,
13 pass for each. On today's main before issue 16, equivtool's passed 15 and
11 (scalar and rank messages, label broadcast, single-class gradient).
pytest also lists TF's ``test_session`` helper as skipped ("Not a test.").
"""

import equivtool  # noqa: F401  (must precede TensorFlow)

import contextlib
import unittest

import pytest
import tensorflow as tf
from tensorflow.python.framework import config as _tf_config
from tensorflow.python.kernel_tests.nn_ops import xent_op_test_base as _dense_base
from tensorflow.python.kernel_tests.sparse_ops import sparse_xent_op_test_base as _sparse_base

from equivtool import ops
from equivtool.ops import xent

# Cases that assert TF-internal graph structure, with the reason. TensorFlow's
# bases skip exactly these assertions when op determinism is enabled (the mode
# TF's own deterministic variants run in); equivtool's op is deterministic, so
# these cases run with it enabled, and every number they check is still checked.
GRAPH_STRUCTURE_CASES = {
    "testSecondGradient": (
        "in graph mode it asserts that a BatchMatMulV2 op is in the graph, which is how "
        "TensorFlow's own gradient-of-gradient is built; equivtool's second derivative is "
        "an element-wise composite without a matmul. The numerical second-derivative check "
        "of the same case runs and must pass."),
}


class _FilteringRestored:
    """Mixin: tf.test.TestCase.__init__ turns TensorFlow's traceback filtering
    off for the thread and never back on, and pytest constructs these cases
    while collecting, so every later test of the run would start with
    filtering off (equivtool's own tests of that setting failed in the full
    suite only). Construction puts the thread's setting back; each case runs
    with filtering off, as TensorFlow intends, and restores it afterwards."""

    def __init__(self, *args, **kwargs):
        was_enabled = tf.debugging.is_traceback_filtering_enabled()
        super().__init__(*args, **kwargs)
        if was_enabled:
            tf.debugging.enable_traceback_filtering()

    def setUp(self):
        if tf.debugging.is_traceback_filtering_enabled():
            tf.debugging.disable_traceback_filtering()
            self.addCleanup(tf.debugging.enable_traceback_filtering)
        super().setUp()


class _RoutedToEquivtool:
    """Mixin: every case runs inside deterministic_xent(); graph-structure
    cases run with op determinism enabled (see GRAPH_STRUCTURE_CASES)."""

    def setUp(self):
        super().setUp()
        stack = contextlib.ExitStack()
        self.addCleanup(stack.close)
        stack.enter_context(ops.deterministic_xent())
        if self._testMethodName in GRAPH_STRUCTURE_CASES:
            was_enabled = _tf_config.is_op_determinism_enabled()
            if not was_enabled:
                stack.callback(_tf_config.disable_op_determinism)
            _tf_config.enable_op_determinism()


class TestTensorFlowSparseXent(_FilteringRestored, _sparse_base.SparseXentOpTestBase):
    """Baseline: TensorFlow's SparseSoftmaxCrossEntropyWithLogits."""


class TestEquivtoolSparseXent(_FilteringRestored, _RoutedToEquivtool, _sparse_base.SparseXentOpTestBase):
    """The same cases on equivtool's sparse op."""

    def _opFwdBwd(self, labels, logits):
        logits = tf.convert_to_tensor(logits)
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss = xent.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        return loss, tape.gradient(loss, logits)


class TestTensorFlowXent(_FilteringRestored, _dense_base.XentOpTestBase):
    """Baseline: TensorFlow's SoftmaxCrossEntropyWithLogits."""


class TestEquivtoolXent(_FilteringRestored, _RoutedToEquivtool, _dense_base.XentOpTestBase):
    """The same cases on equivtool's dense op."""

    def _opFwdBwd(self, labels, logits, axis=-1):
        # TF's hook calls the v1 function, which keeps gradients out of the labels.
        logits = tf.convert_to_tensor(logits)
        with tf.GradientTape() as tape:
            tape.watch(logits)
            loss = xent.softmax_cross_entropy_with_logits(
                labels=tf.stop_gradient(labels), logits=logits, axis=axis)
        return loss, tape.gradient(loss, logits)


# ---------------------------------------------------------------------------
# The routing itself: the equivtool classes must really run equivtool's op.

def _run_cases(case_class) -> unittest.TestResult:
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(case_class)
    result = unittest.TestResult()
    suite.run(result)
    return result


@pytest.mark.parametrize("dense", [False, True], ids=["sparse", "dense"])
def test_equivtool_cases_fail_when_its_op_is_wrong(monkeypatch, dense):
    """Planted fault: equivtool's op gives the loss + 0.5. TF's numeric cases
    must then fail, through both routes (the hook and the patched nn_ops)."""
    name = "softmax_cross_entropy_with_logits" if dense else \
        "sparse_softmax_cross_entropy_with_logits"
    right = getattr(xent, name)

    def wrong(*args, **kwargs):
        return right(*args, **kwargs) + 0.5

    monkeypatch.setattr(xent, name, wrong)
    case_class = TestEquivtoolXent if dense else TestEquivtoolSparseXent
    result = _run_cases(case_class)
    failed = {test.id().rsplit(".", 1)[-1] for test, _ in result.failures + result.errors}
    # Hook route (_opFwdBwd) and direct nn_ops route, one case of each.
    expected = {"testFloat", "test3D"} if dense else {"testFloat", "testVector"}
    assert expected <= failed, sorted(failed)


def test_graph_structure_cases_are_test_methods_of_both_bases():
    for base in (_sparse_base.SparseXentOpTestBase, _dense_base.XentOpTestBase):
        for name in GRAPH_STRUCTURE_CASES:
            assert callable(getattr(base, name, None)), (base.__name__, name)


def test_no_case_is_silently_dropped():
    """Both runs see the same case names (the subclasses only override hooks)."""
    def names(cls):
        return set(unittest.defaultTestLoader.getTestCaseNames(cls))

    assert names(TestEquivtoolSparseXent) == names(TestTensorFlowSparseXent)
    assert names(TestEquivtoolXent) == names(TestTensorFlowXent)
    assert len(names(TestEquivtoolSparseXent)) >= 18 and len(names(TestEquivtoolXent)) >= 13


def test_routing_is_undone_after_each_case():
    original = tf.nn.softmax_cross_entropy_with_logits
    result = _run_cases(TestEquivtoolXent)
    assert result.testsRun > 0
    assert tf.nn.softmax_cross_entropy_with_logits is original
    assert not _tf_config.is_op_determinism_enabled()


def test_constructing_and_running_cases_leaves_traceback_filtering_as_it_was():
    tf.debugging.enable_traceback_filtering()
    try:
        for case_class in (TestTensorFlowSparseXent, TestEquivtoolSparseXent, TestTensorFlowXent,
                           TestEquivtoolXent):
            unittest.defaultTestLoader.loadTestsFromTestCase(case_class)  # constructs every case
            assert tf.debugging.is_traceback_filtering_enabled(), case_class.__name__
        case = TestEquivtoolXent("testSecondGradient")
        result = unittest.TestResult()
        case.run(result)
        assert result.wasSuccessful() and tf.debugging.is_traceback_filtering_enabled()
        _dense_base.XentOpTestBase("testSecondGradient")  # TensorFlow's own class does switch it off
        assert not tf.debugging.is_traceback_filtering_enabled()
    finally:
        tf.debugging.enable_traceback_filtering()
