"""equivtool's deterministic softmax cross-entropy op.

``sparse_softmax_cross_entropy_with_logits`` and
``softmax_cross_entropy_with_logits`` are drop-in counterparts of ``tf.nn``'s,
computed by a compiled TensorFlow op (``custom_ops/``) that is bitwise
reproducible across runs, thread counts and batch splits, on CPU and GPU.
``deterministic_xent()`` routes TensorFlow's and tf-keras' own cross-entropy
calls through it for the duration of a block.

The op library is built by the package install or by ``equivtool build-ops``
(``build_ops``); ``op_status()`` describes its state for ``equivtool doctor``.
Names load lazily: importing this package imports neither TensorFlow nor the
library.
"""

from __future__ import annotations

from equivtool._base.lazy import lazy_exports

_EXPORTS = {
    "sparse_softmax_cross_entropy_with_logits": "xent",
    "softmax_cross_entropy_with_logits": "xent",
    "deterministic_xent": "swap",
    "enable_deterministic_xent": "swap",
    "disable_deterministic_xent": "swap",
    "StaleTraceWarning": "swap",
    "build_ops": "_build",
    "op_status": "_load",
    "OpLibraryError": "_load",
}

__all__ = sorted(_EXPORTS)

# What `equivtool doctor` and `equivtool build-ops` read about the build (not public API).
_DIAGNOSTICS = {
    "BuildError": "_build",
    "describe_gpu": "_gpu",
}

__getattr__, __dir__ = lazy_exports(__name__, {**_EXPORTS, **_DIAGNOSTICS})
