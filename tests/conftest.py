"""Shared pytest configuration for equivtool's tests.

The ``gpu`` marker (declared in setup.cfg) is implemented here, once: a test
marked ``@pytest.mark.gpu`` is skipped, with the reason, when TensorFlow sees
no GPU or when the op library carries no CUDA kernels. A GPU test must still
check where its ops ran (a tensor's ``.device``): TensorFlow places an op on
the CPU silently when the GPU has no kernel for it.

equivtool is imported here, before any test module is collected: its
import-time environment fix (legacy Keras) must precede TensorFlow, and the
pytest plugin no longer imports it for every suite, so a test module that
imports TensorFlow first works run alone as well as in the whole suite.
"""

import functools

import equivtool  # noqa: F401  (environment fix before TensorFlow)
import pytest


@functools.lru_cache(maxsize=None)
def gpu_missing_reason() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    import equivtool  # noqa: F401  (environment fix before TensorFlow)
    import tensorflow as tf

    if not tf.config.list_physical_devices("GPU"):
        return "no GPU visible to TensorFlow (tf.config.list_physical_devices('GPU') is empty)"
    from equivtool.ops import op_status

    status = op_status()
    if status["error"]:
        return f"the op library does not load: {status['error']}"
    if not status["cuda"]:
        return ("the op library was built without CUDA kernels (no nvcc at build time); "
                "rebuild it with `equivtool build-ops` where nvcc is installed")
    return None


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return  # TensorFlow is not even imported for runs without GPU tests
    reason = gpu_missing_reason()
    if reason is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))
