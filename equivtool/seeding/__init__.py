"""The random tool: ``DeterministicRandomTestTool``, TensorFlow's migration tool for
aligning random numbers between a TF1 graph and a TF2 layer, rebuilt so that it
records a trace of every seeded random op and compares two traces.

* :mod:`~equivtool.seeding.tool`: the tool and its scopes (why it is a clone of
  ``tf.compat.v1.keras.utils.DeterministicRandomTestTool``, and what it adds);
* :mod:`~equivtool.seeding.modes`: :data:`MODES`, TensorFlow-free;
* ``_trace`` (the trace and its comparison), ``_traced`` (tracing one side's
  calls), ``_keras3`` (Keras 3's own random draws).

Names are imported on first use, so reading :data:`MODES` imports no TensorFlow.
"""

from equivtool._base.lazy import lazy_exports

__all__ = ["DeterministicRandomTestTool", "RandomOpRecord", "TraceDivergence", "compare_random_traces", "MODES"]

# name -> the module defining it (read by the API page's writer too, tools/docs_api.py)
_EXPORTS = {
    "DeterministicRandomTestTool": "tool",
    "RandomOpRecord": "_trace",
    "TraceDivergence": "_trace",
    "compare_random_traces": "_trace",
    "MODES": "modes",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
