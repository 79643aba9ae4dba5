"""Start TensorFlow without its start-up chatter, for the command line only.

The one mechanism for it: ``TF_CPP_MIN_LOG_LEVEL`` defaults to 2 (an
explicit value in the environment wins), and since TensorFlow 2.21 prints
oneDNN, CUDA-stub and CPU-feature notices from C++ on start-up, before
``TF_CPP_MIN_LOG_LEVEL`` is honoured, the CLI imports
TensorFlow and initialises its devices with file descriptor 2 sent to a
temporary file, then writes back every captured line that is not one of those
known notices, so a real error still reaches the user.

:func:`quiet_command` is what an equivtool command calls first: it also hides
the deprecation warnings TF1 code raises by the dozen (``layer.apply``,
``tf.layers.flatten``...), and marks the environment (:data:`ENV`) so that the
command's worker processes start as quietly. A user's own program that imports
equivtool keeps TensorFlow's logging and warnings as it set them.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

_BENIGN = re.compile(
    r"All log messages before absl::InitializeLog|oneDNN custom operations are on|"
    r"Could not find cuda drivers|cpu_feature_guard|rebuild TensorFlow with the appropriate|"
    r"^To enable the following instructions|failed call to cuInit|TF-TRT Warning")


ENV = "EQUIVTOOL_QUIET"  # set by an equivtool command; its worker processes inherit it
_DEPRECATIONS = r".*(is deprecated and will be removed|will be removed in a future version)"


def quiet_command() -> None:
    """Start an equivtool command (or one of its workers) without TensorFlow's start-up chatter."""
    import warnings
    os.environ[ENV] = "1"
    warnings.filterwarnings("ignore", message=_DEPRECATIONS, category=UserWarning)
    import_tensorflow_quietly()


def import_tensorflow_quietly() -> None:
    """Import TensorFlow and list its devices with the benign start-up notices filtered out."""
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            import tensorflow as tf
            tf.get_logger().setLevel("ERROR")
            tf.config.list_physical_devices()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().decode("utf-8", "replace").splitlines()
                    if line.strip() and not _BENIGN.search(line)]
    if kept:
        print("\n".join(kept), file=sys.stderr)
