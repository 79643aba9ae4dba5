"""Run one tf-slim test module from the installed package after `import equivtool`.

Usage: python -m tests._slim_suite_child tf_slim.layers.layers_test [--bare] [--as-shipped]
(--bare: without equivtool, TF_USE_LEGACY_KERAS=1 set by hand: the "before" state;
--as-shipped: without the test-code rewrites below.)
Prints one line: SLIM_SUITE {"run": N, "skipped": N, "skip_reasons": {reason: N},
"rewrites": {old text: times replaced}, "problems": {test id: last line}}.

Test-code rewrites
------------------
A few of tf-slim's tests cannot run on the NumPy and TensorFlow test harness of
today for reasons in the test code alone: NumPy 2 removed what they call
(``ndarray.tostring``, ``np.object``, ``np.float``, ``np.product``, ``int()``
of a 1-element array), one imports ``nose`` (not installed) for a decorator
and passes tfdbg an argument TensorFlow dropped, or TF 2's ``cached_session()`` stopped pinning the graph to the CPU as TF 1's
did. Left alone, such a test fails in its ``setUp`` or at import and
exercises no tf-slim code at all (the 37 tests of ``slim.learning``,
``training`` and ``evaluation``). So, by default, the module's source is read
from the installed file and these exact strings are replaced in memory before
it is compiled (the installed file is never edited); the child reports how
often each was replaced, and tests/test_slim_suite.py requires each to have
matched. None touches an assertion or tf-slim's library code.
"""

import importlib
import importlib.util
import json
import os
import sys
import unittest
from collections import Counter

if "--bare" in sys.argv:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
else:
    import equivtool  # noqa: F401  (the import-time fix, tf-slim repairs included)

_INT_OF_ARRAY = ("int(2 * self._labels[i] + np.random.randint(0, 2))",
                 "int(2 * self._labels[i, 0] + np.random.randint(0, 2))",
                 "NumPy 2: int() of a 1-element array raises 'only 0-dimensional arrays can be converted' "
                 "(in setUp, so every test of the class failed before reaching tf-slim)")

# module -> ((old, new, times, reason), ...): see the module docstring.
REWRITES = {
    "tf_slim.learning_test": ((*_INT_OF_ARRAY[:2], 2, _INT_OF_ARRAY[2]),),
    "tf_slim.training.training_test": ((*_INT_OF_ARRAY[:2], 2, _INT_OF_ARRAY[2]),),
    "tf_slim.training.evaluation_test": ((*_INT_OF_ARRAY[:2], 2, _INT_OF_ARRAY[2]),),
    "tf_slim.data.tfexample_decoder_test": (
        ("image.tostring()", "image.tobytes()", 1, "NumPy 2 removed ndarray.tostring (tobytes since 1.9)"),),
    "tf_slim.layers.sparse_ops_test": (
        ("np.object)", "object)", 2, "NumPy 1.24 removed the alias np.object (the builtin object)"),
        ("np.bool)", "bool)", 1, "NumPy 1.24 removed the alias np.bool (NumPy 2 has it again, as np.bool_); "
                                 "the builtin bool equals the bool dtype on every NumPy")),
    "tf_slim.losses.metric_learning_test": (
        (".astype(np.float)", ".astype(float)", 1, "NumPy 1.24 removed the alias np.float (the builtin float)"),),
    "tf_slim.evaluation_test": (
        ("from nose.tools import nottest\n",
         "def nottest(f):  # nose's decorator, inlined\n  f.__test__ = False\n  return f\n", 1,
         "imports nose (a test-only dependency, unmaintained, not installed) for its @nottest decorator only"),
        ("hooks.DumpingDebugHook(dumping_root, log_usage=False)", "hooks.DumpingDebugHook(dumping_root)", 1,
         "TensorFlow's tfdbg DumpingDebugHook no longer takes log_usage (its usage logging was removed); "
         "False only turned that logging off"),),
    "tf_slim.metrics.metric_ops_large_test": (
        ("np.product(shape)", "np.prod(shape)", 1, "NumPy 2 removed np.product (np.prod)"),),
    "tf_slim.ops.variables_test": (
        ("    with self.cached_session():\n"
         "      with ops.device(device_setter.replica_device_setter(ps_tasks=2)):",
         "    with self.cached_session(use_gpu=False):\n"
         "      with ops.device(device_setter.replica_device_setter(ps_tasks=2)):", 1,
         "testVariableWithReplicaDeviceSetter expects '/job:ps/task:0/cpu:0': TF 1's cached_session() "
         "defaulted to use_gpu=False and pinned the graph to the CPU; TF 2's defaults to use_gpu=True and "
         "pins nothing (tensorflow/python/framework/test_util.py). use_gpu=False is TF 1's default"),),
}


def _load(module_name: str, as_shipped: bool):
    """The test module; unless ``as_shipped``, compiled from its source with REWRITES applied.

    Returns (module, {old text: times replaced})."""
    rewrites = () if as_shipped else REWRITES.get(module_name, ())
    if not rewrites:
        return importlib.import_module(module_name), {}
    spec = importlib.util.find_spec(module_name)
    with open(spec.origin, encoding="utf-8") as f:
        source = f.read()
    applied = {}
    for old, new, _, _ in rewrites:
        applied[old] = source.count(old)
        source = source.replace(old, new)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    exec(compile(source, spec.origin, "exec"), module.__dict__)  # noqa: S102 - tf-slim's own test module
    return module, applied


def main(module_name: str, as_shipped: bool) -> None:
    # by module object: tf_slim's star imports shadow some subpackage attributes (tf_slim.ops)
    module, applied = _load(module_name, as_shipped)
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    with open(os.devnull, "w") as sink:
        result = unittest.TextTestRunner(stream=sink, verbosity=0).run(suite)
    problems = {test.id(): (trace.strip().splitlines() or [""])[-1][:300]
                for test, trace in result.failures + result.errors}
    print("SLIM_SUITE " + json.dumps({"run": result.testsRun, "skipped": len(result.skipped),
                                      "skip_reasons": dict(Counter(reason for _, reason in result.skipped)),
                                      "rewrites": applied, "problems": problems}))


if __name__ == "__main__":
    main(sys.argv[1], "--as-shipped" in sys.argv)
