"""equivtool's pytest plugin, registered through the ``pytest11`` entry point.

It lives outside the ``equivtool`` package on purpose: pytest imports every
installed plugin in every run, and importing anything inside ``equivtool``
runs the package's ``__init__``, which selects legacy Keras
(``TF_USE_LEGACY_KERAS=1``) and installs an import alias for tf-slim. An
unrelated test suite in the same environment must not see either, so this
module imports only pytest. equivtool and TensorFlow are imported when a test
first requests one of the fixtures below (and then stay imported for the rest
of the run, as any import does).

The fixtures are also reachable as ``equivtool.pytest_plugin`` for suites that
name the plugin explicitly (``pytest_plugins = ["equivtool.pytest_plugin"]``),
which imports the package and so applies its environment fix at once.
"""

from __future__ import annotations

import pytest

__all__ = ["random_tool", "tf1_session"]


@pytest.fixture
def random_tool():
    """A factory of fresh ``DeterministicRandomTestTool``\\ s: ``random_tool(seed=42, mode="constant")``."""
    from equivtool.seeding import DeterministicRandomTestTool

    def make(seed: int = 42, mode: str = "constant"):
        return DeterministicRandomTestTool(seed=seed, mode=mode)

    return make


@pytest.fixture
def tf1_session():
    """A fresh ``tf.Graph`` made default, with a ``tf.compat.v1.Session`` on it, closed after the test."""
    import equivtool  # noqa: F401  (the environment fix, before TensorFlow)
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        session = tf.compat.v1.Session(graph=graph)
        try:
            yield session
        finally:
            session.close()
