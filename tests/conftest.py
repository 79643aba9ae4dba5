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
    kernels = status["gpu_kernels"]
    if kernels is None or kernels.source != "nvrtc":
        return f"the op's GPU kernels are not enabled: {kernels}"
    return None


# The files that take minutes on 2 cores (model-size tests), longest first: collected
# ahead of the rest, so that pytest-xdist (``--dist loadfile``, a file to a worker)
# starts them early and the short files fill in around them, instead of the run
# ending with one worker still in a long file (collection order is alphabetical
# otherwise). Order within a file is kept.
LONG_FILES = ("test_slim_suite.py", "test_localize.py", "test_zoo.py", "test_exported_inception.py",
              "test_inception_resnet_v2.py", "test_notebooks.py", "test_docs.py", "test_ops_packaging.py",
              "test_ops_build.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # a stable sort
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return  # TensorFlow is not even imported for runs without GPU tests
    reason = gpu_missing_reason()
    if reason is not None:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))
