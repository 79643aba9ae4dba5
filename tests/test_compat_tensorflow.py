"""The TensorFlow repairs of the import-time fix: graphs written as text on protobuf 7.

TensorFlow 2.16-2.20's ``write_graph(as_text=True)`` passes ``float_format=''``
to protobuf's ``MessageToString``; protobuf 7 dropped that argument and
TensorFlow 2.20 allows protobuf 7, so on the stack pip picks for 2.20 every
graph written as text (Supervisor, MonitoredTrainingSession's checkpoint hook,
tf-slim's ``learning.train``) raised ``TypeError``. The first test is the
user's view and failed on 2.20 before the repair; the others plant the defect
on any stack, so the repair is proven where the suite runs.
"""

import os
import subprocess
import sys
import types

import equivtool  # noqa: F401
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.python.framework import graph_io

from equivtool._platform import compat as _compat
from equivtool._platform.compat import _tensorflow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPAIR = "graphs written as text"


def _graph_with_floats():
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        w = tf.constant([[0.1, 1e-30, 3.4028235e38]] * 3, name="w")
        tf.nn.leaky_relu(tf.matmul(x, w), alpha=0.3, name="y")
    return graph.as_graph_def()


def test_a_graph_written_as_text_reads_back_as_the_same_graph(tmp_path):
    graph_def = _graph_with_floats()
    path = tf.io.write_graph(graph_def, str(tmp_path), "graph.pbtxt", as_text=True)
    with open(path) as handle:
        written = handle.read()
    assert text_format.Parse(written, tf.compat.v1.GraphDef()) == graph_def  # every float exactly
    assert "leaky_relu" in written.lower() or "LeakyRelu" in written


def test_the_repair_is_recorded_and_listed_by_doctor():
    states = {r.name: r for r in _compat.repairs() if r.library == _tensorflow.LIBRARY}
    assert set(states) == {REPAIR}
    assert states[REPAIR].state in (_compat.APPLIED, _compat.NOT_NEEDED), states[REPAIR]
    proc = subprocess.run([sys.executable, "-m", "equivtool.cli", "doctor"], cwd=ROOT, capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3"), timeout=300)
    line = next((line for line in proc.stdout.splitlines() if "TF repairs" in line), None)
    assert line is not None and f"{REPAIR}: {states[REPAIR].state}" in line, proc.stdout


def _refusing_message_to_string(message, **options):
    """protobuf 7's MessageToString: no ``float_format``."""
    if "float_format" in options:
        raise TypeError("MessageToString() got an unexpected keyword argument 'float_format'")
    return text_format.MessageToString(message, **options)


def _write_graph_as_tf_2_20_does(graph_or_graph_def, logdir, name, as_text=True):
    """TensorFlow 2.20's write_graph, reduced to the call that matters: it looks
    up ``text_format`` in graph_io's globals at call time, as the real one does."""
    path = os.path.join(logdir, name)
    with open(path, "w") as handle:
        handle.write(graph_io.text_format.MessageToString(graph_or_graph_def, float_format=""))
    return path


@pytest.fixture
def tf_2_20_on_protobuf_7(monkeypatch):
    """graph_io as on TensorFlow 2.20 with protobuf 7 (the defect, planted)."""
    monkeypatch.setattr(graph_io, "write_graph", _write_graph_as_tf_2_20_does)
    protobuf_7 = types.ModuleType(text_format.__name__)
    protobuf_7.MessageToString, protobuf_7.Parse = _refusing_message_to_string, text_format.Parse
    monkeypatch.setattr(graph_io, "text_format", protobuf_7)
    return protobuf_7


def test_a_planted_tf_2_20_write_graph_fails_then_is_repaired(tf_2_20_on_protobuf_7, tmp_path):
    graph_def = _graph_with_floats()
    with pytest.raises(TypeError, match="float_format"):
        graph_io.write_graph(graph_def, str(tmp_path), "before.pbtxt", as_text=True)

    repair = _tensorflow.graphs_written_as_text()
    assert repair.state == _compat.APPLIED and "graph_io" in repair.detail, repair

    path = graph_io.write_graph(graph_def, str(tmp_path), "after.pbtxt", as_text=True)
    with open(path) as handle:
        written = handle.read()
    assert written == text_format.MessageToString(graph_def)  # what TensorFlow 2.21 writes
    assert text_format.Parse(written, tf.compat.v1.GraphDef()) == graph_def
    assert _tensorflow.graphs_written_as_text().state == _compat.NOT_NEEDED  # a second run finds it done


def test_the_repair_changes_graph_io_only_where_write_graph_failed():
    at_import = next(r for r in _compat.repairs() if r.name == REPAIR)
    if at_import.state == _compat.NOT_NEEDED:  # TensorFlow 2.21, or 2.16-2.20 on protobuf < 7
        assert graph_io.text_format is text_format
    else:                                      # TensorFlow 2.16-2.20 on protobuf 7
        assert at_import.state == _compat.APPLIED, at_import
        assert isinstance(graph_io.text_format, _compat.ModuleProxy)
        assert _compat.real_module(graph_io.text_format) is text_format
        assert graph_io.text_format.Parse is text_format.Parse  # only MessageToString is replaced
    assert _tensorflow.graphs_written_as_text().state == _compat.NOT_NEEDED  # nothing left to do
    # protobuf itself is never changed, whatever the stack
    assert text_format.MessageToString.__module__ == "google.protobuf.text_format"


def test_a_write_graph_that_fails_otherwise_is_reported_not_hidden(monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(graph_io, "write_graph", broken)
    repair = _tensorflow.graphs_written_as_text()
    assert repair.state == _compat.FAILED and "OSError: disk full" in repair.detail, repair


def test_a_float_format_refusal_from_elsewhere_is_not_repaired(tf_2_20_on_protobuf_7, monkeypatch):
    def accepts_float_format(message, float_format=None, **options):
        raise TypeError("something else refused float_format")

    monkeypatch.setattr(tf_2_20_on_protobuf_7, "MessageToString", accepts_float_format)
    repair = _tensorflow.graphs_written_as_text()
    assert repair.state == _compat.FAILED and "something else" in repair.detail, repair
    assert graph_io.text_format is tf_2_20_on_protobuf_7  # no proxy where the repair would not help
