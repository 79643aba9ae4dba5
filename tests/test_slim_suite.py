"""tf-slim's own test suite, from the installed tf_slim wheel, after `import equivtool`.

The measure of the tf-slim repairs (equivtool._platform.compat): every test of these
modules passes except the ones listed in KNOWN, each with its reason: they
assert a TF-internal op name or class, or a float32 result to 7 places.

A few tests fail in tf-slim's test code alone (NumPy 2 removed what they call;
TF 2's test harness stopped pinning the CPU), most of them in setUp, before
any tf-slim code runs. The child (tests/_slim_suite_child.py, REWRITES)
replaces those exact strings in memory, never in the installed file, so that
the tests run tf-slim; each rewrite must match as often as listed.

Each module runs in its own interpreter (tests/_slim_suite_child.py), so that
tf-slim's tests, which change global TensorFlow state, cannot touch ours.
"""

import json
import os
import subprocess
import sys

import pytest

from tests._slim_suite_child import REWRITES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# module -> (tests it must run at least, slow)
MODULES = {
    "layers.layers_test": (356, False),
    "layers.normalization_test": (43, False),
    "layers.regularizers_test": (12, False),
    "layers.initializers_test": (23, False),
    "layers.utils_test": (30, False),
    "layers.summaries_test": (7, False),
    "layers.optimizers_test": (26, False),
    "layers.sparse_ops_test": (26, False),
    "layers.rev_block_lib_test": (15, False),
    "ops.arg_scope_test": (21, False),
    "ops.framework_ops_test": (5, False),
    "ops.variables_test": (104, False),
    "losses.loss_ops_test": (120, False),
    "losses.metric_learning_test": (14, False),
    "metrics.classification_test": (21, False),
    "metrics.histogram_ops_test": (11, False),
    "metrics.metric_ops_test": (431, True),
    "metrics.metric_ops_large_test": (2, True),
    "summaries_test": (5, False),
    "learning_test": (38, False),
    "evaluation_test": (10, False),
    "training.training_test": (19, False),
    "training.evaluation_test": (18, False),
    "data.tfexample_decoder_test": (40, False),
    "data.dataset_data_provider_test": (4, False),
    "data.parallel_reader_test": (10, False),
    "data.prefetch_queue_test": (7, False),
    "nets.alexnet_test": (8, True),
    "nets.inception_v1_test": (12, True),
    "nets.inception_v2_test": (15, True),
    "nets.inception_v3_test": (16, True),
    "nets.overfeat_test": (8, True),
    "nets.resnet_v1_test": (17, True),
    "nets.resnet_v2_test": (17, True),
    "nets.vgg_test": (24, True),
}
# Skip reasons accepted: TensorFlow's TestCase.test_session stub, and tf-slim's own TF1-only markers.
SKIP_REASONS = frozenset({"Not a test.", "sess.run functionality difference in v2.0"})
# Every *_test module of the tf_slim wheel is listed (test_every_test_module_of_tf_slim_is_listed).

# test id -> why it is allowed to fail. Each asserts a TensorFlow internal (an op name, a class) or a
# float32 result to more places than float32 holds; none is a tf-slim defect on TF 2.21.
KNOWN = {
    "tf_slim.layers.layers_test.DropoutTest.testCreateDropout":
        "asserts the TF-internal op name 'dropout/dropout_1/mul_1'; TF 2.21's dropout ends in a SelectV2 op",
    "tf_slim.metrics.metric_ops_test.CountTest.testReturnType":
        "asserts the update op is an instance of tf.compat.v1.Variable, i.e. the TF-internal class "
        "VariableV1; on TF 2.21 assign_add on a resource variable returns a ResourceVariable, which is a "
        "tf.Variable but no longer a VariableV1 subclass",
    "tf_slim.metrics.classification_test.F1ScoreTest.testSomeCorrect":
        "assertAlmostEqual(2/3, f1) to 7 places of a float32 result: tf-slim's formula "
        "2*p*r/(p+r+1e-7) gives 0.66666663 in float32 (NumPy float32 gives the same), 6.0e-8 from 2/3, "
        "over the 5e-8 that 7 places allow",
}


def run_module(module: str, bare: bool = False, as_shipped: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_USE_LEGACY_KERAS", None)  # equivtool's import-time fix sets it
    proc = subprocess.run([sys.executable, "-m", "tests._slim_suite_child", f"tf_slim.{module}"]
                          + (["--bare"] if bare else []) + (["--as-shipped"] if as_shipped else []),
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SLIM_SUITE ")]
    assert lines, f"tf_slim.{module} did not report (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("SLIM_SUITE "):])


@pytest.mark.parametrize("module", [
    pytest.param(m, marks=pytest.mark.slow) if slow else m for m, (_, slow) in MODULES.items()])
def test_tf_slim_module_passes_after_import_equivtool(module):
    minimum, _ = MODULES[module]
    result = run_module(module)
    assert result["run"] >= minimum, f"tf_slim.{module} ran {result['run']} tests, expected at least {minimum}"
    unexpected = {test: line for test, line in result["problems"].items() if test not in KNOWN}
    assert not unexpected, f"tf_slim.{module}: failing tests not in KNOWN:\n" + "\n".join(
        f"  {test}: {line}" for test, line in unexpected.items())
    expected_rewrites = {old: times for old, _, times, _ in REWRITES.get(f"tf_slim.{module}", ())}
    assert result["rewrites"] == expected_rewrites, f"tf_slim.{module}: test-code rewrites matched " \
        f"{result['rewrites']}, expected {expected_rewrites}: tf-slim's test file changed"
    # a skip is not a pass: only TensorFlow's `test_session` stub ("Not a test.") and tests tf-slim's
    # authors marked as TF1-only may skip
    odd_skips = {reason: n for reason, n in result["skip_reasons"].items() if reason not in SKIP_REASONS}
    assert not odd_skips, f"tf_slim.{module}: unexpected skips {odd_skips}"


def test_known_failures_and_rewrites_all_have_reasons_and_name_real_modules():
    for test, reason in KNOWN.items():
        assert reason and len(reason) > 20, test
        assert any(test.startswith(f"tf_slim.{module}.") for module in MODULES), test
    for module, rewrites in REWRITES.items():
        assert module[len("tf_slim."):] in MODULES, module
        for old, new, times, reason in rewrites:
            assert old != new and times >= 1 and len(reason) > 20, (module, old)
            assert "assert" not in old and "assert" not in new, (module, old)  # never an assertion


def test_every_test_module_of_tf_slim_is_listed():
    import importlib.util
    root = os.path.dirname(importlib.util.find_spec("tf_slim").origin)
    found = {os.path.relpath(os.path.join(folder, name), root)[:-3].replace(os.sep, ".")
             for folder, _, names in os.walk(root) for name in names if name.endswith("_test.py")}
    assert found == set(MODULES), (sorted(found - set(MODULES)), sorted(set(MODULES) - found))


def test_as_shipped_the_rewritten_tests_fail_in_tf_slims_test_code():
    """Without the rewrites, the same tests fail, in the test file, on what the rewrite replaces
    (what fails depends on the NumPy pip chose for the TensorFlow in use)."""
    import numpy as np

    result = run_module("data.tfexample_decoder_test", as_shipped=True)
    assert result["rewrites"] == {}
    failing = {test.rsplit(".", 1)[-1]: line for test, line in result["problems"].items()}
    removed = not hasattr(np.ndarray, "tostring")  # NumPy 2
    assert failing == ({name: "AttributeError: 'numpy.ndarray' object has no attribute 'tostring'"
                        for name in ("testDecodeExampleWithRAWEncoding", "testDecodeExampleWithRawEncoding",
                                     "testDecodeExampleWithRawEncodingFloatDtype")} if removed else {}), failing

    # np.object is gone from NumPy 1.24 on; np.bool from 1.24 to 1.26 only.
    result = run_module("layers.sparse_ops_test", as_shipped=True)
    failing = {test.rsplit(".", 1)[-1]: line for test, line in result["problems"].items()}
    expected = {"test_dense_to_sparse_tensor_1d_str", "test_dense_to_sparse_tensor_1d_str_special_ignore"}
    if not hasattr(np, "bool"):
        expected.add("test_dense_to_sparse_tensor_1d_bool")
    assert set(failing) == expected and all("numpy" in line for line in failing.values()), failing


def test_without_equivtool_the_same_harness_reports_the_failures():
    """The harness can fail: without the repairs, tf-slim's utils tests hit the removed ops.Tensor."""
    result = run_module("layers.utils_test", bare=True)
    assert result["run"] >= MODULES["layers.utils_test"][0]
    problems = [line for test, line in result["problems"].items() if test not in KNOWN]
    assert len(problems) >= 10 and any("has no attribute 'Tensor'" in line for line in problems), problems
