"""TensorFlow's own defects on a dependency it allows: the repairs, each a no-op where things work.

1. **Graphs written as text on protobuf 7.** TensorFlow 2.16-2.20's
   ``write_graph(..., as_text=True)`` (``tf.io.write_graph``) passes
   ``float_format=''`` to protobuf's ``text_format.MessageToString``. protobuf 7
   removed that argument, and TensorFlow 2.20 accepts protobuf 7
   (``protobuf>=5.28.0``, no upper bound), so on the stack pip picks for 2.20
   every graph written as text raises ``TypeError``: ``tf.io.write_graph``, the
   TF1 ``Supervisor``, the checkpoint hook of ``MonitoredTrainingSession``, and
   tf-slim's ``learning.train`` and ``training.train`` through them. TensorFlow
   2.21 no longer passes the argument. Where a live probe (an empty graph
   written as text to a temporary folder) raises that ``TypeError``, graph_io
   sees protobuf's ``text_format`` through a proxy whose ``MessageToString``
   leaves the argument out, which is TensorFlow 2.21's call: floats are written
   in protobuf's shortest form that reads back to the same value. protobuf
   itself, and every other user of it, is untouched.
"""

from __future__ import annotations

import inspect
import tempfile

from equivtool._platform.compat import APPLIED, FAILED, NOT_NEEDED, ModuleProxy, Repair, proxied, real_module

LIBRARY = "TensorFlow"
_DROPPED = "float_format"


def apply() -> list:
    """Make every repair that is needed; return one :class:`Repair` per repair."""
    return [graphs_written_as_text()]


def _probe_error(graph_io) -> Exception | None:
    """What writing an empty graph as text raises here, or None."""
    from equivtool._platform.tf_internals import GraphDef
    try:
        with tempfile.TemporaryDirectory(prefix="equivtool-probe-") as folder:
            graph_io.write_graph(GraphDef(), folder, "probe.pbtxt", as_text=True)
    except Exception as exc:  # noqa: BLE001 - the probe reports what it found
        return exc
    return None


def graphs_written_as_text() -> Repair:
    name = "graphs written as text"
    try:
        from equivtool._platform.tf_internals import graph_io
        error = _probe_error(graph_io)
        if error is None:
            return Repair(LIBRARY, name, NOT_NEEDED, "")
        if not (isinstance(error, TypeError) and _DROPPED in str(error)):
            return Repair(LIBRARY, name, FAILED, f"write_graph(as_text=True) raises {type(error).__name__}: {error}")
        current = graph_io.text_format
        real = (real_module(current) if isinstance(current, ModuleProxy) else current).MessageToString
        if _DROPPED in inspect.signature(real).parameters:  # the refusal came from elsewhere
            return Repair(LIBRARY, name, FAILED, f"write_graph(as_text=True) raises TypeError: {error}")
        proxy = proxied(graph_io.__name__, "text_format")

        def message_to_string(message, *args, _real=real, **options):
            options.pop(_DROPPED, None)
            return _real(message, *args, **options)

        object.__setattr__(proxy, "MessageToString", message_to_string)
        error = _probe_error(graph_io)
        if error is not None:
            return Repair(LIBRARY, name, FAILED, f"still raises {type(error).__name__}: {error}")
        return Repair(LIBRARY, name, APPLIED, f"text_format.MessageToString without {_DROPPED} in graph_io")
    except Exception as exc:  # noqa: BLE001 - a repair that cannot be made is reported, never raised at import
        return Repair(LIBRARY, name, FAILED, f"{type(exc).__name__}: {exc}")

