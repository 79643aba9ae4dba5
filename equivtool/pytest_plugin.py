"""equivtool's pytest plugin (registered through the ``pytest11`` entry point).

It adds behaviour only where a test asks for it: two fixtures and the ``slow``
and ``gpu`` markers' descriptions. Nothing runs at collection time.
"""

from __future__ import annotations

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: full-size model runs")
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped without one")


@pytest.fixture
def random_tool():
    """A factory of fresh ``DeterministicRandomTestTool``s: ``random_tool(mode=..., seed=...)``."""
    from equivtool.seeding import DeterministicRandomTestTool

    def make(seed: int = 42, mode: str = "constant"):
        return DeterministicRandomTestTool(seed=seed, mode=mode)

    return make


@pytest.fixture
def tf1_session():
    """A fresh ``tf.Graph`` made default, with a ``tf.compat.v1.Session`` on it, closed after the test."""
    import equivtool  # noqa: F401  (environment fix before TensorFlow)
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        session = tf.compat.v1.Session(graph=graph)
        try:
            yield session
        finally:
            session.close()
