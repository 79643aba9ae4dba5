"""Run one tf-slim test module from the installed package after `import equivtool`.

Usage: python -m tests._slim_suite_child tf_slim.layers.layers_test [--bare]
(--bare: without equivtool, TF_USE_LEGACY_KERAS=1 set by hand: the "before" state.)
Prints one line: SLIM_SUITE {"run": N, "skipped": N, "problems": {test id: last line}}.
"""

import importlib
import json
import os
import sys
import unittest

if "--bare" in sys.argv:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
else:
    import equivtool  # noqa: F401  (the import-time fix, tf-slim repairs included)


def main(module_name: str) -> None:
    # by module object: tf_slim's star imports shadow some subpackage attributes (tf_slim.ops)
    suite = unittest.defaultTestLoader.loadTestsFromModule(importlib.import_module(module_name))
    with open(os.devnull, "w") as sink:
        result = unittest.TextTestRunner(stream=sink, verbosity=0).run(suite)
    problems = {test.id(): (trace.strip().splitlines() or [""])[-1][:300]
                for test, trace in result.failures + result.errors}
    print("SLIM_SUITE " + json.dumps({"run": result.testsRun, "skipped": len(result.skipped),
                                      "problems": problems}))


if __name__ == "__main__":
    main(sys.argv[1])
