"""``compare --localize`` on exported models: how node values are obtained and what is left behind.

Each side computes its compared nodes in one run that writes every value to a
temporary folder (tfdbg's file watches for a session; write ops in the TF2
signature's inlined function, which reads the loaded variables rather than
copies of them); OLD is closed before NEW runs when compare_models loaded it.
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile

import numpy as np
import pytest

import equivtool
from equivtool.exported import _dump, _localize, _sides

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from exported_models import build_all  # noqa: E402

FAULT_NODE = "small_net/bn1/FusedBatchNormV3"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_all(str(tmp_path_factory.mktemp("exported")))


def feed():
    return {"images": np.random.RandomState(5).uniform(size=(2, 8, 8, 3)).astype(np.float32)}


def compared_tensors(view):
    ops, _ = _localize._ops(view)
    return _localize._tensors(ops)


@pytest.mark.parametrize("kind", ["tf1", "tf2"])
def test_a_dump_reads_back_what_the_graph_computes(models, kind, tmp_path):
    with equivtool.load_side(models[kind]) as side:
        view = side.graph_view(feed())
        tensors = compared_tensors(view)
        assert len(tensors) >= 6
        expected = view.fetch(tensors)
        read = view.dumped(tensors, str(tmp_path), 1 << 20)
        for tensor, value in zip(tensors, expected):
            np.testing.assert_array_equal(read(tensor), value, err_msg=tensor.name)
        assert os.listdir(tmp_path), "nothing was written: the values did not come from a dump"


def test_nodes_the_session_dump_lacks_are_fetched_by_name(models, tmp_path, monkeypatch):
    """A node the executed graph no longer has (Grappler rewrote it) is not in tfdbg's
    dump: it is fetched by name, in windows, and saved beside the dump."""
    from equivtool._platform import tf_internals
    real = tf_internals.debug_utils.watch_graph
    monkeypatch.setattr(tf_internals.debug_utils, "watch_graph",
                        lambda options, graph, **kw: real(options, graph, **{**kw, "node_name_regex_allowlist": "^$"}))
    with equivtool.load_side(models["tf1"]) as side:
        view = side.graph_view(feed())
        tensors = compared_tensors(view)
        read = view.dumped(tensors, str(tmp_path), 1)  # a window per tensor
        for tensor, value in zip(tensors, view.fetch(tensors)):
            np.testing.assert_array_equal(read(tensor), value, err_msg=tensor.name)
    assert len(glob.glob(str(tmp_path / "fetched" / "*.npy"))) == len(tensors)


def test_the_tf2_graph_reads_the_loaded_variables_and_holds_no_copy(models):
    """Freezing would turn every variable into a constant holding its value; the inlined
    view keeps reading the loaded variables (the test can fail: a frozen graph has them)."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2
    with equivtool.load_side(models["tf2"]) as side:
        view = side.graph_view(feed())
        consts = [op for op in view.graph.get_operations() if op.type == "Const"]
        captured = [external for external, _ in side.function.graph.captures]
        largest = max(int(np.prod(v.shape)) for v in side.function.variables if v.shape.rank)
        assert len(captured) >= len(side.function.variables) > 0
        assert all(int(np.prod(op.outputs[0].shape or [1])) < largest for op in consts)
        assert any(op.type == "ReadVariableOp" for op in view.graph.get_operations())
        frozen = convert_variables_to_constants_v2(side.function)
        assert max(int(np.prod(op.outputs[0].shape or [1])) for op in frozen.graph.get_operations()
                   if op.type == "Const") >= largest


def test_the_tf1_dump_leaves_the_loaded_graph_unchanged(models):
    with equivtool.load_side(models["tf1"]) as old, equivtool.load_side(models["tf2_bad_eps"]) as new:
        before = [op.name for op in old.graph.get_operations()]
        report = equivtool.compare_models(old, new, localize=True)
        assert report.steps[0].data["localization"].tf1_op == FAULT_NODE
        assert [op.name for op in old.graph.get_operations()] == before
        # sides the caller loaded stay open: compare_models closes only what it loaded
        assert set(old.run(feed())) == {"logits", "pool1"} and set(new.run(feed())) == {"logits", "pool1"}


def test_the_report_calls_the_sides_old_and_new(models, tmp_path):
    from equivtool.localize.result import Localization
    report = equivtool.compare_models(models["tf1"], models["tf2_bad_eps"], localize=True)
    found = report.steps[0].data["localization"]
    text = str(found)
    assert f"OLD op: {FAULT_NODE} (FusedBatchNormV3) created at {models['tf1']}" in text
    assert "NEW op: " in text and "OLD: " in text and "TF1" not in text and "TF2" not in text
    assert Localization.from_dict(found.to_dict()).sides == ("OLD", "NEW")
    html = open(report.to_html(tmp_path / "r.html"), encoding="utf-8").read()
    assert "<th></th><td><code>OLD</code></td><td><code>NEW</code></td>" in html
    with pytest.raises(ValueError, match="two names"):
        Localization("inconclusive", reason="x", sides=("OLD",))


def test_old_is_closed_before_new_runs_when_compare_loaded_it(models, monkeypatch):
    events = []
    real_close, real_view = _sides.GraphSide.close, _sides.FunctionSide.graph_view

    def close(self):
        events.append(("close", self.kind))
        real_close(self)

    def view(self, feed):
        events.append(("new view", self.kind))
        return real_view(self, feed)

    monkeypatch.setattr(_sides.GraphSide, "close", close)
    monkeypatch.setattr(_sides.FunctionSide, "graph_view", view)
    report = equivtool.compare_models(models["tf1"], models["tf2_bad_eps"], localize=True)
    assert report.steps[0].data["localization"].tf1_op == FAULT_NODE
    assert events[:2] == [("close", "tf1-saved-model"), ("new view", "tf2-saved-model")]


def test_the_dump_folder_is_removed_also_when_localization_fails(models, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's own TMPDIR (other workers share /tmp)
    made = []
    real_dumped = _sides.GraphView.dumped

    def dumped(self, tensors, folder, budget_bytes):
        made.append(folder)
        return real_dumped(self, tensors, folder, budget_bytes)

    monkeypatch.setattr(_sides.GraphView, "dumped", dumped)
    report = equivtool.compare_models(models["tf1"], models["tf2"], localize=True)
    assert report.steps[0].data["localization"].status == "no_divergence"
    assert made and all(folder.startswith(str(tmp_path)) for folder in made)  # the dumps were written here
    assert not glob.glob(str(tmp_path / "equivtool-localize-*"))

    def broken(*args, **kwargs):
        raise RuntimeError("planted failure while writing NEW's nodes")

    monkeypatch.setattr(_dump, "function_dump", broken)
    report = equivtool.compare_models(models["tf1"], models["tf2"], localize=True)
    found = report.steps[0].data["localization"]
    assert found.status == "inconclusive" and "planted failure" in found.reason
    assert report.passed  # the outputs' verdict stands; only the localization failed
    assert not glob.glob(str(tmp_path / "equivtool-localize-*"))


def test_too_little_disk_for_the_values_is_said_before_anything_is_written(models, monkeypatch):
    import collections
    import shutil
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, (1 << 30) - 4096, 4096))
    monkeypatch.setattr(_dump, "session_dump", lambda *a, **k: pytest.fail("a dump began"))
    report = equivtool.compare_models(models["tf1"], models["tf2_bad_eps"], localize=True)
    found = report.steps[0].data["localization"]
    assert found.status == "inconclusive" and "MiB of disk" in found.reason and "TMPDIR" in found.reason
    assert not report.passed  # the outputs' own verdict (NOT EQUIVALENT) stands


def test_a_failing_dump_run_leaves_the_localization_inconclusive_not_the_command(models, monkeypatch, tmp_path):
    import tensorflow as tf

    class Failing:
        def run(self, *args, **kwargs):
            raise tf.errors.InternalError(None, None, "planted: the watched run failed")

    with equivtool.load_side(models["tf1"]) as side:
        view = side.graph_view(feed())
        with pytest.raises(_dump.DumpFailed, match="planted: the watched run failed"):
            _dump.session_dump(Failing(), side.graph, {}, compared_tensors(view), str(tmp_path), 1, None)
    real = _dump.session_dump
    monkeypatch.setattr(_dump, "session_dump", lambda session, *a: real(Failing(), *a))
    report = equivtool.compare_models(models["tf1"], models["tf2_bad_eps"], localize=True)
    found = report.steps[0].data["localization"]
    assert found.status == "inconclusive"
    assert found.reason == ("localization failed: running the model with every node watched failed: "
                            "planted: the watched run failed")
    assert not report.passed  # NOT EQUIVALENT from the outputs still stands


def test_with_a_record_as_old_only_news_values_need_room(models, monkeypatch, tmp_path):
    import collections
    import shutil
    record = str(tmp_path / "old.npz")
    assert equivtool.compare_models(models["tf1"], models["tf2"], localize=True, save_outputs=record).passed
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, (1 << 30) - 4096, 4096))
    monkeypatch.setattr(_dump, "function_dump", lambda *a, **k: pytest.fail("NEW's dump began"))
    found = equivtool.compare_models(record, models["tf2_bad_eps"], localize=True).steps[0].data["localization"]
    assert found.status == "inconclusive" and "MiB of disk" in found.reason
    monkeypatch.undo()
    found = equivtool.compare_models(record, models["tf2_bad_eps"], localize=True).steps[0].data["localization"]
    assert found.tf1_op == FAULT_NODE  # with room, the same comparison localizes


def test_the_tf2_dump_runs_the_graph_as_written(models, tmp_path):
    """In the dumping run of an inlined TF2 signature the kernels that ran compute only
    what was written (the conv among them); the check can fail, as a planted fused conv
    shows. (Every node's output is consumed by its write there, so even TensorFlow's
    default rewrites find nothing to fuse in this net: measured, not asserted.)"""
    from equivtool._platform import graph_rewrites as _graph_rewrites
    with equivtool.load_side(models["tf2"]) as side:
        view = side.graph_view(feed())
        tensors = compared_tensors(view)
        kernels, written = _graph_rewrites.function_kernels(view.dumped, tensors, str(tmp_path), 1 << 20)
    assert _graph_rewrites.fused_kernels(kernels, written) == {}
    convs = [name for name, kind in kernels.items() if "Conv2D" in kind]
    assert convs, f"no conv kernel ran in the dump: nothing was checked ({sorted(set(kernels.values()))})"
    planted = {**kernels, convs[0]: "_MklNativeFusedConv2D"}
    assert _graph_rewrites.fused_kernels(planted, written) == {convs[0]: "_MklNativeFusedConv2D"}
