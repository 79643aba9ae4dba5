"""Issue 34, part A: nothing the user owns is lost, nothing is left behind, a full disk is no crash.

* ``--save-outputs`` replaces a file only with ``--overwrite``, never OLD or NEW
  (refused before any model loads), atomically, with a report's permission bits;
* ``convert-checkpoint --overwrite``: one rename decides (checked at every rename
  and unlink of the replacement), and the input is never the output;
* SIGTERM and Ctrl-C during ``compare --localize`` (with and without
  ``--save-outputs``) and SIGTERM during ``convert-checkpoint`` remove their
  temporary folder and partial file (a child process, stopped at a point it
  announces with a file); those of killed runs are removed by the next run;
* a full disk during ``--localize`` leaves the verdict standing and the
  localization inconclusive, saying how much space it needs (real sizes, not the
  static estimate; a real 2 MiB tmpfs where the tests run as root).

Every case is checked to hold something first (the file, folder or partial
record exists before the signal), so that none passes with nothing to find.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import equivtool
import tensorflow as tf
from equivtool._base import scratch
from equivtool.checkpoints import convert as _convert
from equivtool.exported import _compare, _dump
from tests import checkpoint_models as cm

v1 = tf.compat.v1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_DEADLINE = 300  # a child imports TensorFlow and loads the models (a loaded 2-core machine)
STOP_DEADLINE = 60


# --------------------------------------------------------------------------
# tiny models: y = relu(1.5 x - 0.25) + tanh(x), x of shape [None, None]
# --------------------------------------------------------------------------

def _tf1_saved_model(folder: str) -> None:
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, None], name="x")
        act = tf.nn.relu(x * 1.5 - 0.25, name="act")
        out = tf.add(act, tf.tanh(x), name="out")
        with v1.Session(graph=graph) as session:
            builder = v1.saved_model.Builder(folder)
            signature = v1.saved_model.predict_signature_def({"x": x}, {"out": out})
            builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": signature})
            builder.save()


def _tf2_saved_model(folder: str) -> None:
    module = tf.Module()
    module.serve = tf.function(lambda x: {"out": tf.add(tf.nn.relu(x * 1.5 - 0.25), tf.tanh(x))},
                               input_signature=[tf.TensorSpec([None, None], tf.float32, name="x")])
    tf.saved_model.save(module, folder, signatures={"serving_default": module.serve})


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hardening")
    paths = {"tf1": str(root / "tf1"), "tf2": str(root / "tf2"), "record": str(root / "old.npz")}
    _tf1_saved_model(paths["tf1"])
    _tf2_saved_model(paths["tf2"])
    assert equivtool.compare_models(paths["tf1"], paths["tf2"], localize=True, save_outputs=paths["record"],
                                    input_shapes={"x": (2, 8)}).passed
    return paths


def _cli(*args) -> list:
    return [sys.executable, "-c", "import sys; from equivtool.cli import main; sys.exit(main())", *args]


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
                TF_CPP_MIN_LOG_LEVEL="3", **extra)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _stale(folder, kind: str, pid: int, hidden: bool = False, is_dir: bool = True) -> str:
    """A file or folder named as one of ``kind`` that process ``pid`` made."""
    name = scratch.prefix(kind, hidden).replace(f"-{os.getpid()}-", f"-{pid}-") + "planted"
    path = os.path.join(str(folder), name + ("" if is_dir else ".npz"))
    if is_dir:
        os.makedirs(os.path.join(path, "old"))
        with open(os.path.join(path, "old", "value"), "wb") as f:
            f.write(b"x" * 100)
    else:
        with open(path, "wb") as f:
            f.write(b"partial")
    return path


# --------------------------------------------------------------------------
# --save-outputs: refused before anything loads; replaced only when asked
# --------------------------------------------------------------------------

def _link(models, tmp_path, how):
    """(OLD, NEW, the --save-outputs path, the file that must survive, overwrite)."""
    record, tf2 = models["record"], models["tf2"]
    copy = str(tmp_path / "copy.npz")
    shutil.copyfile(record, copy)
    if how == "existing":
        existing = tmp_path / "mine.npz"
        existing.write_bytes(b"the user's file")
        return tf2, copy, str(existing), str(existing), False
    if how == "old itself":
        return copy, tf2, copy, copy, True
    if how == "new itself":
        return tf2, copy, copy, copy, True
    if how == "old through a symlink":
        os.symlink(copy, tmp_path / "alias.npz")
        return copy, tf2, str(tmp_path / "alias.npz"), copy, True
    if how == "new through a hard link":
        os.link(copy, tmp_path / "hard.npz")
        return tf2, copy, str(tmp_path / "hard.npz"), copy, True
    if how == "old by another spelling":
        os.mkdir(tmp_path / "sub")
        return copy, tf2, str(tmp_path / "sub" / ".." / "copy.npz"), copy, True
    if how == "a folder":
        os.mkdir(tmp_path / "dir.npz")
        return copy, tf2, str(tmp_path / "dir.npz"), copy, True
    raise AssertionError(how)


SAVE_REFUSALS = [
    ("existing", r"--save-outputs: '.*mine.npz' exists; pass --overwrite"),
    ("old itself", r"--save-outputs: '.*copy.npz' is OLD of this run"),
    ("new itself", r"--save-outputs: '.*copy.npz' is NEW of this run"),
    ("old through a symlink", r"--save-outputs: '.*alias.npz' is OLD of this run"),
    ("new through a hard link", r"--save-outputs: '.*hard.npz' is NEW of this run"),
    ("old by another spelling", r"--save-outputs: '.*copy.npz' is OLD of this run"),
    ("a folder", r"--save-outputs: '.*dir.npz' is a folder"),
]


@pytest.mark.parametrize("how, message", SAVE_REFUSALS, ids=[c[0] for c in SAVE_REFUSALS])
def test_save_outputs_is_refused_before_any_model_loads_and_the_file_is_unchanged(models, tmp_path, monkeypatch,
                                                                                    how, message):
    old, new, destination, kept, overwrite = _link(models, tmp_path, how)
    before = open(kept, "rb").read()
    monkeypatch.setattr(_compare, "load_side", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match=message):
        equivtool.compare_models(old, new, save_outputs=destination, overwrite=overwrite)
    assert open(kept, "rb").read() == before
    assert not glob.glob(str(tmp_path / ".equivtool-*"))


def test_the_cli_refuses_in_one_line_with_exit_2(models, tmp_path):
    copy = str(tmp_path / "golden.npz")
    shutil.copyfile(models["record"], copy)
    before = open(copy, "rb").read()
    done = subprocess.run(_cli("compare", models["tf2"], copy, "--save-outputs", copy, "--overwrite"),
                          capture_output=True, text=True, env=_env(), cwd=str(tmp_path), timeout=START_DEADLINE)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"equivtool compare: error: --save-outputs: {copy!r} is NEW of this run; the record would replace an "
        "input; write it to another path"]
    assert open(copy, "rb").read() == before


def test_overwrite_replaces_the_file_atomically_not_through_a_symlink_with_a_reports_mode(models, tmp_path):
    target = tmp_path / "target.npz"
    target.write_bytes(b"not the record")
    os.symlink(target, tmp_path / "out.npz")
    out = str(tmp_path / "out.npz")
    report = equivtool.compare_models(models["tf1"], models["tf2"], save_outputs=out, overwrite=True,
                                      input_shapes={"x": (2, 8)})
    assert report.passed and not os.path.islink(out)
    assert target.read_bytes() == b"not the record"  # the symlink was replaced, its target untouched
    with np.load(out, allow_pickle=False) as data:
        assert "__record__" in data.files
    mask = os.umask(0o022)
    os.umask(mask)
    assert os.stat(out).st_mode & 0o777 == 0o666 & ~mask  # mkstemp alone gives 0600
    assert sorted(os.listdir(tmp_path)) == ["out.npz", "target.npz"]  # no temporary file left


# --------------------------------------------------------------------------
# stale temporary files: those of dead processes go, a live one's stay
# --------------------------------------------------------------------------

def test_process_gone_tells_a_dead_pid_from_a_live_one():
    assert scratch.process_gone(_dead_pid())
    assert not scratch.process_gone(os.getpid())
    assert not scratch.process_gone(1)


def test_a_later_compare_removes_what_killed_runs_left_and_nothing_else(models, tmp_path, monkeypatch):
    temp, out = tmp_path / "tmp", tmp_path / "out"
    temp.mkdir()
    out.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(temp))
    dead = _dead_pid()
    stale = [_stale(temp, "localize", dead), _stale(out, "record", dead, hidden=True, is_dir=False)]
    live = [_stale(temp, "localize", 1), _stale(out, "record", 1, hidden=True, is_dir=False),
            str(temp / "equivtool-localize-someone-else"), str(out / ".equivtool-abc.npz")]
    for path in live[2:]:
        open(path, "w").close()
    report = equivtool.compare_models(models["tf1"], models["tf2"], localize=True,
                                      save_outputs=str(out / "record.npz"), input_shapes={"x": (2, 8)})
    assert report.passed
    assert [p for p in stale if os.path.exists(p)] == []
    assert [p for p in live if not os.path.exists(p)] == []
    assert sorted(os.listdir(temp)) == sorted(os.path.basename(p) for p in live[::2])  # its own folder is gone


# --------------------------------------------------------------------------
# signals: a child stops at a point it announces; the test signals it there
# --------------------------------------------------------------------------

CHILD = """
import os, signal, sys, time
sys.path[:0] = [{root!r}]
signal.signal(signal.SIGINT, signal.default_int_handler)
from equivtool.cli import main
READY = {ready!r}

def stop_here():
    open(READY, "w").close()
    while True:  # the child waits for the test's signal (its handler runs between sleeps)
        time.sleep(0.05)

{patch}
sys.exit(main({argv!r}))
"""

PATCH_LOCALIZE = """
from equivtool.exported import _localize
_localize._return_freed_memory = lambda: stop_here()  # OLD's node values are on disk now
"""

PATCH_RECORD = """
from equivtool.exported import _recorder
real = _recorder._write_array
def write_array(archive, key, value):
    if key == "node/1":  # the partial record is on disk, beside the localize folder
        stop_here()
    return real(archive, key, value)
_recorder._write_array = write_array
"""

PATCH_CONVERT = """
from equivtool.checkpoints import convert
def call(self, tensors):  # the staging folder exists; TensorFlow is about to write into it
    stop_here()
convert._Shards.__call__ = call
"""


def _run_child(tmp_path, argv, patch):
    ready = str(tmp_path / "ready")
    script = CHILD.format(root=ROOT, ready=ready, patch=patch, argv=list(argv))
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    child = subprocess.Popen([sys.executable, "-c", script], env=_env(TMPDIR=str(temp)), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    end = time.monotonic() + START_DEADLINE
    while not os.path.exists(ready):
        if child.poll() is not None:
            out, err = child.communicate()
            pytest.fail(f"the child ended ({child.returncode}) before its stop:\n{out[-3000:]}\n{err[-3000:]}")
        if time.monotonic() > end:
            child.kill()
            pytest.fail("the child did not reach its stop")
        time.sleep(0.1)  # polling with a deadline
    return child, temp


def _stop(child, signum):
    child.send_signal(signum)
    try:
        out, err = child.communicate(timeout=STOP_DEADLINE)
    except subprocess.TimeoutExpired:
        child.kill()
        pytest.fail("the child did not stop after the signal")
    return child.returncode, out, err


SIGNAL_CASES = [
    ("SIGTERM", False, -signal.SIGTERM),
    ("SIGINT", False, 130),
    ("SIGTERM", True, -signal.SIGTERM),
    ("SIGINT", True, 130),
]


@pytest.mark.parametrize("signame, save, code", SIGNAL_CASES,
                         ids=[f"{s}{'-save-outputs' if v else ''}" for s, v, _ in SIGNAL_CASES])
def test_a_signal_during_compare_localize_leaves_nothing(models, tmp_path, signame, save, code):
    out = tmp_path / "out"
    out.mkdir()
    argv = ["compare", models["tf1"], models["tf2"], "--localize", "--input-shapes", "x:2,8"]
    if save:
        argv += ["--save-outputs", str(out / "golden.npz")]
    child, temp = _run_child(tmp_path, argv, PATCH_RECORD if save else PATCH_LOCALIZE)
    folders = glob.glob(str(temp / "equivtool-localize-*"))
    assert len(folders) == 1 and os.listdir(folders[0])  # something to remove is there
    if save:
        assert len(glob.glob(str(out / ".equivtool-record-*.npz"))) == 1
    returncode, _, err = _stop(child, getattr(signal, signame))
    assert returncode == code, err[-3000:]
    assert os.listdir(temp) == []
    assert os.listdir(out) == []


@pytest.mark.parametrize("command", ["compare", "convert-checkpoint"])
def test_what_a_sigkill_left_the_next_run_removes(models, tf1_ckpt, tmp_path, monkeypatch, command):
    """SIGKILL runs no cleanup: the folder stays, and the next run of the same kind removes it."""
    out = tmp_path / "out"
    out.mkdir()
    if command == "compare":
        argv = ["compare", models["tf1"], models["tf2"], "--localize", "--input-shapes", "x:2,8"]
        child, temp = _run_child(tmp_path, argv, PATCH_LOCALIZE)
        left = lambda: glob.glob(str(temp / "equivtool-localize-*"))  # noqa: E731
    else:
        prefix = str(out / "tf2")
        argv = ["convert-checkpoint", tf1_ckpt, "tests.checkpoint_models:NativeNet", prefix, "--input-shape",
                ",".join(map(str, cm.IMAGE)), "--rename", "tests.checkpoint_models:NATIVE_RENAME"]
        child, temp = _run_child(tmp_path, argv, PATCH_CONVERT)
        left = lambda: glob.glob(str(out / ".equivtool-convert-*"))  # noqa: E731
    returncode, _, _ = _stop(child, signal.SIGKILL)
    assert returncode == -signal.SIGKILL and len(left()) == 1  # left behind, as SIGKILL must
    if command == "compare":
        monkeypatch.setattr("tempfile.tempdir", str(temp))
        assert equivtool.compare_models(models["tf1"], models["tf2"], localize=True,
                                        input_shapes={"x": (2, 8)}).passed
    else:
        equivtool.convert_checkpoint(tf1_ckpt, cm.NativeNet, cm.images(), prefix, rename=cm.NATIVE_RENAME)
    assert left() == []


# --------------------------------------------------------------------------
# convert-checkpoint: one rename decides; never over its input; nothing left
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tf1_ckpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tf1ckpt")
    return cm.train_tf1(cm.slim_net, cm.images(), lambda: v1.train.GradientDescentOptimizer(0.1), 1,
                        str(folder / "model.ckpt"))


def _values(prefix) -> dict:
    reader = tf.train.load_checkpoint(prefix)
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if "OBJECT_GRAPH" not in k}


def _reads_as(prefix, candidates) -> str:
    """Which of ``candidates`` (name -> values) the checkpoint at ``prefix`` reads as
    whole ("mixed" when none: an index with another checkpoint's data)."""
    try:
        found = _values(prefix)
    except (tf.errors.OpError, ValueError):
        return "mixed"
    for name, values in candidates.items():
        if found.keys() == values.keys() and all(np.array_equal(found[k], values[k]) for k in values):
            return name
    return "mixed"


def test_the_whole_checkpoint_check_sees_a_mix(tmp_path):
    """The check below can fail: an index with another checkpoint's data file is "mixed"."""
    a, b = tf.Variable([1.0, 2.0]), tf.Variable([5.0, 6.0])
    tf.train.Checkpoint(v=a).write(str(tmp_path / "a"))
    tf.train.Checkpoint(v=b).write(str(tmp_path / "b"))
    candidates = {"a": _values(str(tmp_path / "a")), "b": _values(str(tmp_path / "b"))}
    assert _reads_as(str(tmp_path / "a"), candidates) == "a"
    shutil.copyfile(tmp_path / "b.data-00000-of-00001", tmp_path / "a.data-00000-of-00001")  # the old order's gap
    assert _reads_as(str(tmp_path / "a"), candidates) == "mixed"


def test_index_shards_reads_tensorflows_header(tmp_path, tf1_ckpt):
    variable = tf.Variable([1.0, 2.0])
    for count in (1, 2):
        prefix = str(tmp_path / f"c{count}")
        tf.train.Checkpoint(v=variable).write(
            prefix, options=tf.train.CheckpointOptions(experimental_sharding_callback=_convert._Shards(count)))
        assert _convert.index_shards(prefix + ".index") == count
    assert _convert.index_shards(tf1_ckpt + ".index") == 1
    (tmp_path / "junk.index").write_bytes(b"\x01junk")
    assert _convert.index_shards(str(tmp_path / "junk.index")) is None
    assert _convert.index_shards(str(tmp_path / "missing.index")) is None


def _doubled_tf1_checkpoint(tf1_ckpt, prefix) -> str:
    """The TF1 checkpoint with every float value doubled: a conversion that differs everywhere."""
    reader = tf.train.load_checkpoint(tf1_ckpt)
    graph = tf.Graph()
    with graph.as_default():
        variables = []
        for key in reader.get_variable_to_shape_map():
            value = reader.get_tensor(key)
            variables.append(v1.Variable(value * 2 if value.dtype.kind == "f" else value, name=key))
        with v1.Session() as session:
            session.run(v1.global_variables_initializer())
            return v1.train.Saver(variables).save(session, prefix)


def test_overwrite_is_whole_at_every_rename_and_unlink(tf1_ckpt, tmp_path, monkeypatch):
    out_dir, ref_dir = tmp_path / "out", tmp_path / "ref"
    out_dir.mkdir()
    ref_dir.mkdir()
    out = str(out_dir / "tf2")
    doubled = _doubled_tf1_checkpoint(tf1_ckpt, str(ref_dir / "model.ckpt"))
    equivtool.convert_checkpoint(tf1_ckpt, cm.NativeNet, cm.images(), out, rename=cm.NATIVE_RENAME)
    equivtool.convert_checkpoint(doubled, cm.NativeNet, cm.images(), str(ref_dir / "tf2"), rename=cm.NATIVE_RENAME)
    candidates = {"old": _values(out), "new": _values(str(ref_dir / "tf2"))}
    assert _reads_as(out, candidates) == "old"
    states = []
    real = {"replace": os.replace, "unlink": os.unlink}

    def watched(what):
        def call(*args, **kwargs):
            target = str(args[-1] if what == "replace" else args[0])
            if os.path.dirname(os.path.abspath(target)) == str(out_dir):  # just before each change there
                states.append((what, os.path.basename(target), _reads_as(out, candidates)))
            return real[what](*args, **kwargs)
        return call

    monkeypatch.setattr(_convert.os, "replace", watched("replace"))
    monkeypatch.setattr(_convert.os, "unlink", watched("unlink"))
    equivtool.convert_checkpoint(doubled, cm.NativeNet, cm.images(), out, rename=cm.NATIVE_RENAME, overwrite=True)
    monkeypatch.undo()
    kinds = [what for what, _, _ in states]
    assert kinds.count("replace") >= 2 and kinds.count("unlink") >= 1, states  # data, index, then old data
    assert all(state in ("old", "new") for _, _, state in states), states
    index = [i for i, (what, name, _) in enumerate(states) if what == "replace" and name == "tf2.index"]
    assert len(index) == 1 and [s for _, _, s in states[:index[0] + 1]] == ["old"] * (index[0] + 1), states
    assert [s for _, _, s in states[index[0] + 1:]] == ["new"] * (len(states) - index[0] - 1), states
    assert _reads_as(out, candidates) == "new"
    assert sorted(os.listdir(out_dir)) == ["tf2.data-00000-of-00002", "tf2.data-00001-of-00002", "tf2.index"]


def test_orphans_and_dead_staging_folders_are_removed_by_the_next_run(tf1_ckpt, tmp_path):
    out = str(tmp_path / "tf2")
    equivtool.convert_checkpoint(tf1_ckpt, cm.NativeNet, cm.images(), out, rename=cm.NATIVE_RENAME)
    orphan = tmp_path / "tf2.data-00000-of-00003"  # a killed run's data files, named by no index
    orphan.write_bytes(b"orphan")
    dead = _stale(tmp_path, "convert", _dead_pid(), hidden=True)
    live = _stale(tmp_path, "convert", 1, hidden=True)
    equivtool.convert_checkpoint(tf1_ckpt, cm.NativeNet, cm.images(), out, rename=cm.NATIVE_RENAME,
                                 overwrite=True)
    assert not orphan.exists() and not os.path.exists(dead) and os.path.exists(live)
    assert _reads_as(out, {"ok": _values(out)}) == "ok"
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(live), "tf2.data-00000-of-00002",
                                                   "tf2.data-00001-of-00002", "tf2.index"])


def _same_as_input(tf1_ckpt, tmp_path, how):
    if how == "the input prefix":
        return tf1_ckpt
    if how == "through a symlinked folder":
        os.symlink(os.path.dirname(tf1_ckpt), tmp_path / "alias")
        return str(tmp_path / "alias" / os.path.basename(tf1_ckpt))
    if how == "hard links to its files":
        for path in glob.glob(tf1_ckpt + ".*"):
            os.link(path, tmp_path / os.path.basename(path).replace("model.ckpt", "copy"))
        return str(tmp_path / "copy")
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["the input prefix", "through a symlinked folder", "hard links to its files"])
def test_the_output_is_never_the_input_even_with_overwrite(tf1_ckpt, tmp_path, how):
    output = _same_as_input(tf1_ckpt, tmp_path, how)
    before = {p: open(p, "rb").read() for p in glob.glob(tf1_ckpt + ".*")}
    with pytest.raises(ValueError, match=r"output: .* is the input checkpoint"):
        equivtool.convert_checkpoint(tf1_ckpt, cm.NativeNet, cm.images(), output, rename=cm.NATIVE_RENAME,
                                     overwrite=True)
    assert {p: open(p, "rb").read() for p in glob.glob(tf1_ckpt + ".*")} == before


def test_sigterm_during_convert_removes_its_staging_folder_and_keeps_the_old_checkpoint(tf1_ckpt, tmp_path):
    out = str(tmp_path / "tf2")
    equivtool.convert_checkpoint(tf1_ckpt, cm.NativeNet, cm.images(), out, rename=cm.NATIVE_RENAME)
    old = _values(out)
    argv = ["convert-checkpoint", tf1_ckpt, "tests.checkpoint_models:NativeNet", out, "--input-shape",
            ",".join(map(str, cm.IMAGE)), "--rename", "tests.checkpoint_models:NATIVE_RENAME", "--overwrite"]
    child, _ = _run_child(tmp_path, argv, PATCH_CONVERT)
    assert len(glob.glob(str(tmp_path / ".equivtool-convert-*"))) == 1  # the staging folder is there
    returncode, _, err = _stop(child, signal.SIGTERM)
    assert returncode == -signal.SIGTERM, err[-3000:]
    assert glob.glob(str(tmp_path / ".equivtool-*")) == []
    assert _reads_as(out, {"old": old}) == "old"


# --------------------------------------------------------------------------
# a full disk during --localize: the verdict stands, the localization says what it needs
# --------------------------------------------------------------------------

WIDE = {"x": (1, 50000)}  # unknown inner dimension: the static estimate counts it as 1 (4 bytes a node)


@pytest.mark.parametrize("old", ["tf1", "record"])
def test_the_room_check_uses_the_real_sizes_of_unknown_dimensions(models, tmp_path, monkeypatch, old):
    """The disk holds the static estimate (and the margin) but not the real values."""
    old_path = models["tf1"]
    if old == "record":  # then only NEW writes, and its sizes are measured in the inlined function
        old_path = str(tmp_path / "wide.npz")
        assert equivtool.compare_models(models["tf1"], models["tf2"], localize=True, save_outputs=old_path,
                                        input_shapes=WIDE).passed
    usage = collections.namedtuple("usage", "total used free")
    free = _dump.MARGIN_BYTES + (256 << 10)
    monkeypatch.setattr(_dump.shutil, "disk_usage", lambda path: usage(1 << 40, 1 << 39, free))
    report = equivtool.compare_models(old_path, models["tf2"], localize=True,
                                      input_shapes=None if old == "record" else WIDE)
    found = report.steps[0].data["localization"]
    assert report.passed  # the outputs' verdict stands
    assert found.status == "inconclusive", found
    needed = float(re.search(r"need about ([\d.]+) MiB", found.reason).group(1))
    assert needed >= 0.5, found.reason  # 4 nodes of 200 kB at least; the static estimate says 0.02


def test_a_dump_that_filled_the_disk_is_inconclusive_with_the_space_needed(models, monkeypatch):
    """The room check passes, then the disk is full after the dumping run (a writer
    may have cut a file short): the values are not read, and the reason says so."""
    usage = collections.namedtuple("usage", "total used free")
    calls = []

    def disk_usage(path):
        calls.append(path)
        return usage(1 << 40, 1 << 39, 1 << 39) if len(calls) == 1 else usage(1 << 40, 1 << 40, 0)

    monkeypatch.setattr(_dump.shutil, "disk_usage", disk_usage)
    report = equivtool.compare_models(models["tf1"], models["tf2"], localize=True, input_shapes={"x": (2, 8)})
    found = report.steps[0].data["localization"]
    assert report.passed and found.status == "inconclusive", found
    assert "filled up" in found.reason and re.search(r"need about [\d.]+ MiB", found.reason), found.reason
    assert len(calls) == 2  # the check before the run, the look after it


def test_an_empty_value_file_is_seen(tmp_path):
    full, empty = tmp_path / "full", tmp_path / "empty"
    full.write_bytes(b"value")
    assert _dump._filled(str(tmp_path), [str(full)]) == ""
    empty.write_bytes(b"")
    assert "1 of 2 value files are empty" in _dump._filled(str(tmp_path), [str(full), str(empty)])


def _mount_tmpfs(folder) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("checked", [True, False], ids=["refused-up-front", "filled-while-writing"])
def test_a_real_full_disk_is_no_crash(models, tmp_path, checked):
    """A 2 MiB tmpfs as TMPDIR, 4 MB of node values: up front the check refuses; with
    the check planted away, the disk fills during the dump (tfdbg leaves empty files)
    and the run still ends with its verdict, the localization inconclusive."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount_tmpfs(disk):
        pytest.skip("needs root to mount a tmpfs")
    try:
        patch = "" if checked else ("from equivtool.exported import _dump\n"
                                    "_dump.check_room = lambda folder, needed: None")
        script = (f"import sys; sys.path[:0] = [{ROOT!r}]\n{patch}\n"
                  "from equivtool.cli import main; sys.exit(main(sys.argv[1:]))")
        done = subprocess.run([sys.executable, "-c", script, "compare", models["tf1"], models["tf2"], "--localize",
                               "--input-shapes", "x:1,200000"], capture_output=True, text=True,
                              env=_env(TMPDIR=str(disk)), timeout=START_DEADLINE)
        assert done.returncode == 0, done.stderr[-3000:]  # EQUIVALENT stands; not 134 (abort)
        assert "EQUIVALENT" in done.stdout
        assert re.search(r"inconclusive.*need about [\d.]+ MiB", " ".join(done.stdout.split())), done.stdout[-3000:]
        if not checked:
            assert re.search(r"empty|filled up", done.stdout), done.stdout[-3000:]
        assert os.listdir(disk) == []
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)
