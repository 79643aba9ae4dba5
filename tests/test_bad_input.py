"""Issue 34, part B: bad input is one line and exit 2 before any work; what was
wrong or silent is right or said; the conventions a TensorFlow user expects.

One row per case of the issue. The ``compare`` rows run on golden records
written here with NumPy (a record is a side that needs no model), so each row
is a fraction of a second; the checkpoint rows share one tiny TF1 Adam
checkpoint. Every row asserts the message or the number it is about, so a
row fails if the behaviour it pins comes back.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile

import numpy as np
import pytest

import equivtool
from equivtool import cli
from equivtool._base.inputs import InputError, inputs_from_options, parse_input
from equivtool.exported import _recorder
from equivtool.exported._record import RecordSide
from equivtool.exported._sides import ModelLoadError, Side, TensorInfo


# --------------------------------------------------------------------------
# golden records made with NumPy
# --------------------------------------------------------------------------

def _specs(arrays):
    return [{"name": k, "dtype": v.dtype.name, "shape": list(v.shape), "tensor": ""} for k, v in arrays.items()]


def write(path, inputs, outputs, **header):
    """A golden record of one batch: ``inputs`` and ``outputs`` name -> array."""
    meta = {"inputs": _specs(inputs), "outputs": _specs(outputs), "provenance": "written by the test",
            "notes": [], "model": {"path": str(path), "kind": "test"}, "writer": _recorder.writer_info("test"),
            **header}
    _recorder.write_record(str(path), meta, [inputs], [outputs])
    return str(path)


def rewrite_header(src, dst, **changes):
    """A copy of record ``src`` whose JSON header has ``changes`` (the members kept byte for byte)."""
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as new:
        for item in old.infolist():
            data = old.read(item.filename)
            if item.filename == "__record__.npy":
                import io
                header = json.loads(bytes(np.load(io.BytesIO(data))).decode())
                header = changes.pop("__whole__") if "__whole__" in changes else {**header, **changes}
                buffer = io.BytesIO()
                np.save(buffer, np.frombuffer(json.dumps(header).encode(), np.uint8))
                data = buffer.getvalue()
            new.writestr(item.filename, data)
    return str(dst)


def corrupt_member(src, dst, member):
    """A copy of ``src`` with the last byte of ``member``'s data flipped (its CRC no longer matches)."""
    shutil.copyfile(src, dst)
    with zipfile.ZipFile(src) as archive:
        info = archive.getinfo(member)
    with open(dst, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = np.frombuffer(f.read(4), "<u2")
        end = info.header_offset + 30 + int(name_length) + int(extra_length) + info.compress_size - 1
        f.seek(end)
        byte = f.read(1)
        f.seek(end)
        f.write(bytes([byte[0] ^ 0xFF]))
    return str(dst)


X = {"x": np.array([[0.5, -1.0, 2.0]], np.float32)}
Y = {"y": np.array([[1.0, 2.0]], np.float32), "z": np.array([3, 4], np.int64)}


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    """Paths of the records the table uses, by name."""
    root = tmp_path_factory.mktemp("records")
    paths = {"good": write(root / "good.npz", X, Y), "same": write(root / "same.npz", X, Y)}
    paths["other_z"] = write(root / "other_z.npz", X, {**Y, "z": np.array([3, 5], np.int64)})
    paths["y_off"] = write(root / "y_off.npz", X, {**Y, "y": Y["y"] + np.float32(0.5)})
    paths["big_int"] = write(root / "big_int.npz", X, {"z": np.array([2 ** 62], np.int64)})
    paths["big_int1"] = write(root / "big_int1.npz", X, {"z": np.array([2 ** 62 + 1], np.int64)})
    nan = {"x": np.array([[np.nan, 1.0, np.nan]], np.float32)}
    paths["nan"] = write(root / "nan.npz", nan, Y)
    paths["nan_same"] = write(root / "nan_same.npz", nan, Y)
    paths["nan_differs"] = write(root / "nan_differs.npz", nan, {**Y, "y": Y["y"] * 2})
    paths["nan_moved"] = write(root / "nan_moved.npz", {"x": np.array([[1.0, np.nan, np.nan]], np.float32)}, Y)
    paths["corrupt"] = corrupt_member(paths["good"], root / "corrupt.npz", "batch0/output/0.npy")
    paths["corrupt_header"] = corrupt_member(paths["good"], root / "corrupt_header.npz", "__record__.npy")
    for name, changes in {"batches_0": {"batches": 0}, "batches_str": {"batches": "1"},
                          "inputs_str": {"inputs": "x"}, "shape_str": {"inputs": [{"name": "x", "dtype": "float32",
                                                                                    "shape": "1,3"}]},
                          "nodes_dict": {"nodes": {"a": 1}}, "list_header": {"__whole__": [1, 2]}}.items():
        paths[name] = rewrite_header(paths["good"], root / f"{name}.npz", **changes)
    paths["folder.npz"] = str(root / "folder.npz")
    os.mkdir(paths["folder.npz"])
    return paths


def compare_cli(*argv, capsys):
    code = cli.main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


# (id, argv from the record paths, exit code, words in the one error line (exit 2) or in the report)
COMPARE = [
    ("corrupt record member", lambda r: [r["corrupt"], r["good"]], 2, "a corrupt golden record (a member cannot "
                                                                      "be read): BadZipFile"),
    ("corrupt record header", lambda r: [r["corrupt_header"], r["good"]], 2, "header cannot be read"),
    ("header batches 0", lambda r: [r["batches_0"], r["good"]], 2, "header field 'batches' is 0, expected a "
                                                                   "positive integer"),
    ("header batches a string", lambda r: [r["batches_str"], r["good"]], 2, "field 'batches' is \"1\""),
    ("header inputs a string", lambda r: [r["inputs_str"], r["good"]], 2, "field 'inputs' is \"x\""),
    ("header shape a string", lambda r: [r["shape_str"], r["good"]], 2, "field 'inputs'"),
    ("header nodes an object", lambda r: [r["nodes_dict"], r["good"]], 2, "field 'nodes'"),
    ("header a JSON list", lambda r: [r["list_header"], r["good"]], 2, "header is JSON list, expected an object"),
    ("save-outputs to a folder", lambda r: [r["good"], r["same"], "--save-outputs", r["folder.npz"]], 2,
     "--save-outputs: " + "{folder.npz}" + " is a folder"),
    ("atol not a number", lambda r: [r["good"], r["same"], "--atol", "abc"], 2, "--atol: not a number: 'abc'"),
    ("rtol not a number for an output", lambda r: [r["good"], r["same"], "--rtol", "y:1e-x"], 2,
     "--rtol: not a number: '1e-x' (in y:1e-x)"),
    ("inputs with input-shapes", lambda r: [r["good"], r["same"], "--inputs", r["good"], "--input-shapes", "x:1,3"],
     2, "--inputs and --input-shapes conflict"),
    ("inputs with data-loader", lambda r: [r["good"], r["same"], "--inputs", r["good"], "--data-loader", "a.py:f"],
     2, "--inputs and --data-loader conflict"),
    ("data-loader with val-range", lambda r: [r["good"], r["same"], "--data-loader", "a.py:f", "--val-range",
                                              "x:0,1"], 2, "--data-loader and --val-range conflict"),
    ("outputs pattern matching nothing", lambda r: [r["good"], r["same"], "--outputs", "logit*"], 2,
     "--outputs: pattern 'logit*' matches no output; OLD has y, z, NEW has y, z"),
    ("strict tolerances and a typo", lambda r: [r["good"], r["same"], "--atol", "yy:0", "--strict-tolerances"], 2,
     "--strict-tolerances: --atol/--rtol key(s) yy match no compared output"),
    # wrong or silent: now right, or said
    ("NaN inputs replay", lambda r: [r["nan"], r["nan_same"]], 0, "Verdict: EQUIVALENT"),
    ("NaN inputs replay and a difference is seen", lambda r: [r["nan"], r["nan_differs"]], 1,
     "Verdict: NOT EQUIVALENT"),
    ("NaN elsewhere is another batch", lambda r: [r["nan"], r["nan_moved"]], 2, "holds no batch with these inputs"),
    ("int64 mismatch shows its real difference", lambda r: [r["big_int"], r["big_int1"]], 1,
     "Max absolute difference: 1\n"),
    ("an outputs filter leaves a differing output out", lambda r: [r["good"], r["other_z"], "--outputs", "y"], 0,
     "Verdict: EQUIVALENT"),
    ("an outputs filter cannot hide what it keeps", lambda r: [r["good"], r["other_z"], "--outputs", "z"], 1,
     "'z': NOT close"),
    ("an exclude-everything filter compares nothing", lambda r: [r["good"], r["same"], "--outputs", "!*"], 1,
     "INCONCLUSIVE"),
    ("a tolerance per output, strict, matched", lambda r: [r["good"], r["y_off"], "--atol", "y:0.6",
                                                           "--strict-tolerances"], 0, "Verdict: EQUIVALENT"),
    ("the same tolerance too tight still fails", lambda r: [r["good"], r["y_off"], "--atol", "y:0.4",
                                                            "--strict-tolerances"], 1, "'y': NOT close"),
    ("a typo'd tolerance key is a note without --strict-tolerances", lambda r: [r["good"], r["same"], "--atol",
                                                                                "yy:0"], 0,
     "outputs: --atol/--rtol key(s) yy match no compared output"),
    ("OLD and NEW the same path: a note", lambda r: [r["good"], r["good"]], 0,
     "outputs: OLD and NEW are the same path"),
]


@pytest.mark.parametrize("case", COMPARE, ids=[c[0] for c in COMPARE])
def test_compare_on_records(rec, case, capsys):
    _, argv, expected_code, words = case
    words = words.replace("{folder.npz}", repr(rec["folder.npz"]))
    code, out, err = compare_cli(*argv(rec), capsys=capsys)
    assert code == expected_code, out + err
    if code == 2:
        lines = [line for line in err.splitlines() if line.startswith("equivtool compare: error:")]
        assert len(lines) == 1 and words in lines[0], err
        assert "Equivalence report" not in out  # refused before any work
    else:
        assert words in out, out


def test_no_same_path_note_for_two_paths(rec, capsys):
    code, out, _ = compare_cli(rec["good"], rec["same"], capsys=capsys)
    assert code == 0 and "same path" not in out


def test_save_outputs_to_a_read_only_folder_is_refused_before_the_run(rec, tmp_path, monkeypatch, capsys):
    folder = tmp_path / "ro"
    folder.mkdir()
    real_access = os.access
    # as root, a mode-0555 folder is writable: plant what access() says of a read-only one
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if os.fspath(p) == str(folder)
                        else real_access(p, mode, **kw))
    code, out, err = compare_cli(rec["good"], rec["same"], "--save-outputs", folder / "r.npz", capsys=capsys)
    assert code == 2 and f"--save-outputs: folder {str(folder)!r} is not writable" in err, err
    assert "Equivalence report" not in out and os.listdir(folder) == []


def test_records_are_written_with_the_reports_mode(tmp_path):
    old = os.umask(0o022)
    try:
        path = write(tmp_path / "r.npz", X, Y)
        report = tmp_path / "r.json"
        from equivtool._base.render import write_text_atomic
        write_text_atomic(report, "{}")
    finally:
        os.umask(old)
    assert oct(os.stat(path).st_mode & 0o777) == oct(os.stat(report).st_mode & 0o777) == "0o644"


def test_the_text_report_shows_notes_and_wraps_long_header_lines(rec):
    report = equivtool.compare_models(rec["good"], rec["good"], meta={"execution": "x" * 150 + " THE CAVEAT"})
    text = str(report)
    assert report.passed and "Notes:\n  outputs: OLD and NEW are the same path" in text
    assert "THE CAVEAT" in text and all(len(line) <= 100 for line in text.splitlines()[:12]), text
    assert "/good.npz" in text.split("Notes:")[0].split("new:")[1]  # old:/new: are wrapped, not cut


def test_check_outputs_patterns_matching_nothing_are_named():
    from equivtool.engine.output_filter import leaf_names, unmatched_note
    names = leaf_names({"logits": 1, "end_points": {"a": 1, "b": 2}}, "outputs")
    assert names == ["outputs/logits", "outputs/end_points/a", "outputs/end_points/b"]
    note = unmatched_note(names, ["*/logits", "!*/nothing", "end*"])
    assert note.startswith("outputs: patterns '!*/nothing', 'end*' match no output leaf"), note
    assert unmatched_note(names, ["*/logits", "!*/end_points/a"]) is None


# --------------------------------------------------------------------------
# compare_models' own arguments
# --------------------------------------------------------------------------

class ArraySide(Side):
    """A side of NumPy only: ``y`` is the first input as float32."""

    kind = "array"

    def __init__(self, *inputs: TensorInfo, path: str = "array-side"):
        self.path, self.inputs, self.meta = path, inputs, {}
        self.outputs = (TensorInfo("y", "float32", None),)
        self.fed = []

    def run(self, feed):
        self.check_feed(feed)
        self.fed.append(feed)
        return {"y": np.asarray(feed[self.inputs[0].name], np.float32)}


API = [
    ("inputs=[]", dict(inputs=[]), "--inputs: expected an .npz path, a mapping input name -> array, or a non-empty "
                                   "list of such mappings (one per batch); got an empty list"),
    ("inputs=<ndarray>", dict(inputs=np.zeros((1, 3), np.float32)), "got ndarray"),
    ("inputs=[ndarray]", dict(inputs=[np.zeros((1, 3), np.float32)]), "got list"),
    ("outputs of the wrong type", dict(outputs=3), "--outputs: expected a pattern"),
    ("strict_tolerances not a bool", dict(strict_tolerances="yes"), "--strict-tolerances: expected True or False"),
]


@pytest.mark.parametrize("case", API, ids=[c[0] for c in API])
def test_compare_models_arguments(rec, case):
    _, kwargs, words = case
    with pytest.raises(ModelLoadError) as raised:
        equivtool.compare_models(rec["good"], rec["same"], **kwargs)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_a_closed_side_is_refused(rec):
    side = RecordSide(rec["good"])
    side.close()
    with pytest.raises(ModelLoadError, match=r"old: the record side .*good.npz is closed"):
        equivtool.compare_models(side, rec["same"])
    open_side = RecordSide(rec["good"])  # and an open one is compared
    try:
        assert equivtool.compare_models(open_side, rec["same"]).passed
    finally:
        open_side.close()


def test_a_huge_static_shape_is_refused_with_its_size_before_allocating():
    huge = ArraySide(TensorInfo("x", "float32", (100000, 100000, 2)))
    with pytest.raises(ModelLoadError, match=r"input 'x': shape \(100000, 100000, 2\) is 20000000000 values "
                                             r"\(74\.5 GiB of float32\)"):
        equivtool.compare_models(huge, ArraySide(TensorInfo("x", "float32", (100000, 100000, 2))))
    assert huge.fed == []
    small = ArraySide(TensorInfo("x", "float32", (2, 3)))  # the same check lets a real shape through
    assert equivtool.compare_models(small, ArraySide(TensorInfo("x", "float32", (2, 3)))).passed
    assert small.fed and small.fed[0]["x"].shape == (2, 3)


VAL_RANGES = [
    ("int8 0,1000", "int8", "x:0,1000", "int8 holds -128..127"),
    ("uint8 -5,5", "uint8", "x:-5,5", "uint8 holds 0..255"),
    ("float16 overflow", "float16", "x:0,1e5", "float16 holds at most 65504"),
    ("bool range", "bool", "x:0,1", "a bool input takes no LO,HI range"),
]


@pytest.mark.parametrize("case", VAL_RANGES, ids=[c[0] for c in VAL_RANGES])
def test_val_range_is_checked_against_the_dtype(case):
    _, dtype, val_range, words = case
    side = ArraySide(TensorInfo("x", dtype, (4,)))
    with pytest.raises(ModelLoadError, match=words):
        equivtool.compare_models(side, ArraySide(TensorInfo("x", dtype, (4,))), val_range=val_range)
    assert side.fed == []


def test_val_range_includes_hi_for_integers_and_excludes_it_for_floats():
    ints = ArraySide(TensorInfo("x", "int8", (400,)))
    equivtool.compare_models(ints, ArraySide(TensorInfo("x", "int8", (400,))), val_range="x:126,127")
    assert set(ints.fed[0]["x"].tolist()) == {126, 127}
    floats = ArraySide(TensorInfo("x", "float16", (4000,)))  # enough draws that float16 rounds some up to HI
    equivtool.compare_models(floats, ArraySide(TensorInfo("x", "float16", (4000,))), val_range="x:0,1")
    assert 0 <= floats.fed[0]["x"].min() and floats.fed[0]["x"].max() < 1


def test_compare_help_states_the_range_rule_and_the_new_options(capsys):
    assert cli.main(["compare", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("integers from [LO, HI] (HI included), floats from [LO, HI) (HI excluded)", "--strict-tolerances",
                  "--outputs", "--old-signature", "--new-signature", "--old-tags", "--new-tags"):
        assert words in text
    assert cli.main(["check", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "integers from [LO, HI] (HI included, default 0,1), floats from [LO, HI) (HI excluded" in text


# --------------------------------------------------------------------------
# check --input: ranges against the dtype, one rule for the ends
# --------------------------------------------------------------------------

CHECK_INPUTS = [
    ("infinite range", "x:2,4:float32:-inf,inf", "LO,HI must be finite numbers"),
    ("int8 0,1000", "x:3:int8:0,1000", "int8 holds -128..127; LO,HI 0,1000 is outside it"),
    ("uint8 -5,5", "x:3:uint8:-5,5", "uint8 holds 0..255"),
    ("float16 overflow", "x:3:float16:0,1e5", "float16 holds at most 65504"),
    ("bool range", "x:3:bool:0,1", "a bool input takes no LO,HI range"),
    ("float range empty", "x:3:float32:1,1", "LO < HI (HI excluded for floats)"),
    ("integer range reversed", "x:3:int32:5,1", "LO <= HI (HI included for integers)"),
]


@pytest.mark.parametrize("case", CHECK_INPUTS, ids=[c[0] for c in CHECK_INPUTS])
def test_check_input_ranges_are_checked_against_the_dtype(case):
    _, spec, words = case
    with pytest.raises(InputError, match=rf"--input '{spec}': .*{__import__('re').escape(words)}"):
        parse_input(spec, 1000)


def test_check_input_range_on_the_command_line_is_one_line_and_exit_2(capsys):
    code = cli.main(["check", "no_module:fn", "no_module:Layer", "--input", "x:2,4:float32:-inf,inf"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE and "LO,HI must be finite numbers" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_check_input_integers_include_hi_floats_exclude_it():
    inputs, _ = inputs_from_options(None, None, ["i:400:int8:126,127", "u:400:uint64:0,18446744073709551615",
                                        "f:4000:float16:0,1", "b:400:bool", "d:400:int32"], 0, 4000)
    assert set(inputs["i"].tolist()) == {126, 127}  # HI drawn, nothing wrapped
    assert inputs["u"].dtype == np.uint64 and inputs["u"].max() > 2 ** 63
    assert 0 <= inputs["f"].min() and inputs["f"].max() < 1
    assert set(inputs["b"].tolist()) == {False, True}
    assert set(inputs["d"].tolist()) == {0, 1}  # the default range [0, 1]


# --------------------------------------------------------------------------
# convert-checkpoint
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    import tensorflow as tf
    from tests import checkpoint_models as cm
    folder = tmp_path_factory.mktemp("adam")
    prefix = cm.train_tf1(cm.slim_net, cm.images(), lambda: tf.compat.v1.train.AdamOptimizer(0.01), 2,
                          str(folder / "model"))
    return prefix


def _copy_checkpoint(prefix, dst, data=lambda b: b, keep_data=True):
    """A copy of checkpoint ``prefix`` at prefix ``dst``, its data bytes through ``data``."""
    shutil.copyfile(prefix + ".index", dst + ".index")
    if keep_data:
        with open(prefix + ".data-00000-of-00001", "rb") as f:
            payload = f.read()
        with open(dst + ".data-00000-of-00001", "wb") as f:
            f.write(data(payload))
    return dst


def _flip_middle(payload: bytes) -> bytes:
    middle = len(payload) // 2
    return payload[:middle] + bytes([payload[middle] ^ 0xFF]) + payload[middle + 1:]


def _convert(source, out, **kwargs):
    import tensorflow as tf
    from tests import checkpoint_models as cm
    return equivtool.convert_checkpoint(source, cm.NativeNet, cm.images(), out, rename=cm.NATIVE_RENAME,
                                        optimizer=kwargs.pop("optimizer", lambda: tf.keras.optimizers.Adam(0.01)),
                                        **kwargs)


def _rewritten(ckpt, folder, **changes):
    from tests.checkpoint_models import rewrite_checkpoint
    return rewrite_checkpoint(ckpt, str(folder / "changed"), **changes)


CHECKPOINTS = [
    ("index but no data", lambda c, d: _copy_checkpoint(c, str(d / "c"), keep_data=False), "cannot be read"),
    ("truncated data", lambda c, d: _copy_checkpoint(c, str(d / "c"), data=lambda b: b[: len(b) // 2]),
     "cannot be read"),
    ("checksum error", lambda c, d: _copy_checkpoint(c, str(d / "c"), data=_flip_middle), "cannot be read"),
    ("beta1_power inf", lambda c, d: _rewritten(c, d, beta1_power=np.inf), "beta1_power = inf; expected a finite"),
    ("beta1_power nan", lambda c, d: _rewritten(c, d, beta1_power=np.nan), "beta1_power = nan; expected a finite"),
    ("beta1_power -0.5", lambda c, d: _rewritten(c, d, beta1_power=-0.5), "beta1_power = -0.5; Adam's beta power "
                                                                          "is beta ** (step + 1), a number in [0, 1]"),
    ("beta2_power a vector", lambda c, d: _rewritten(c, d, beta2_power=np.array([0.9, 0.9])),
     "beta2_power has shape [2]; expected a scalar"),
    ("global_step a vector", lambda c, d: _rewritten(c, d, global_step=np.array([2, 2])),
     "global_step has shape [2]; expected a scalar"),
    ("slot shape mismatch", lambda c, d: _rewritten(c, d, **{"net/logits/biases/Adam": np.zeros(7)}),
     "slot 'net/logits/biases/Adam' has shape [7] in the checkpoint; tf-keras 'm' of"),
]


@pytest.mark.parametrize("case", CHECKPOINTS, ids=[c[0] for c in CHECKPOINTS])
def test_a_bad_checkpoint_is_one_line_and_nothing_is_written(ckpt, tmp_path, case):
    _, make, words = case
    source_folder = tmp_path / "source"
    source_folder.mkdir()
    source = make(ckpt, source_folder)
    out_folder = tmp_path / "out"
    with pytest.raises(ValueError) as raised:
        _convert(source, out_folder / "new" / "tf2")
    message = str(raised.value)
    assert words in message, message
    assert "\n" not in message or message.startswith("optimizer state does not convert (1 problems"), message
    assert not out_folder.exists()  # not even the missing folders


def test_a_bad_checkpoint_on_the_command_line_is_exit_2(ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    source = _copy_checkpoint(ckpt, str(tmp_path / "c"), data=_flip_middle)
    code = cli.main(["convert-checkpoint", source, "tests.checkpoint_models:NativeNet", str(tmp_path / "out"),
                     "--input-shape", "2,6,6,3", "--rename", "tests.checkpoint_models:NATIVE_RENAME",
                     "--optimizer", "tests.checkpoint_models:keras_adam"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE and "cannot be read" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and not os.path.exists(tmp_path / "out.index")


def test_a_read_only_output_folder_is_refused(ckpt, tmp_path, monkeypatch):
    folder = tmp_path / "ro"
    folder.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if os.fspath(p) == str(folder)
                        else real_access(p, mode, **kw))
    with pytest.raises(ValueError, match=f"output: folder {str(folder)!r} is not writable"):
        _convert(ckpt, folder / "tf2")
    assert os.listdir(folder) == []


def test_missing_folders_are_created_and_restore_assert_consumed_holds(ckpt, tmp_path):
    import tensorflow as tf
    from tests import checkpoint_models as cm
    prefix = _convert(ckpt, tmp_path / "a" / "b" / "tf2")
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["tf2.data-00000-of-00001", "tf2.index"]
    layer = cm.NativeNet()
    layer(cm.images(), training=False)
    optimizer = tf.keras.optimizers.Adam(0.01)
    optimizer.build(layer.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=layer, optimizer=optimizer)
    checkpoint.restore(prefix).assert_consumed()  # the idiom; raised without save_counter in the file
    assert int(checkpoint.save_counter.numpy()) == 0 and int(optimizer.iterations.numpy()) == 2
    reader = tf.train.load_checkpoint(ckpt)
    np.testing.assert_array_equal(layer.conv.kernel.numpy(), reader.get_tensor("net/conv1/weights"))


# --------------------------------------------------------------------------
# a record of a TF2 OLD can be localized
# --------------------------------------------------------------------------

def test_a_record_of_a_tf2_model_names_its_tensors_and_localizes(tmp_path):
    from tests.exported_models import build_all
    models = build_all(str(tmp_path / "models"))
    record = str(tmp_path / "tf2.npz")
    assert equivtool.compare_models(models["tf2"], models["tf2"], save_outputs=record, localize=True).passed
    with np.load(record, allow_pickle=False) as data:
        header = json.loads(bytes(data["__record__"]).decode())
    assert all(spec["tensor"] for spec in header["inputs"] + header["outputs"]), header["inputs"]
    bad = equivtool.compare_models(record, models["tf2_bad_eps"], localize=True)
    found = bad.steps[0].data["localization"]
    assert not bad.passed and found.status == "diverged" and "FusedBatchNorm" in found.tf1_op, found
    # a record written before (no tensor names) is refused with the reason, not TensorFlow's
    unnamed = rewrite_header(record, tmp_path / "unnamed.npz",
                             inputs=[{**spec, "tensor": ""} for spec in header["inputs"]])
    with pytest.raises(ModelLoadError, match=r"--localize: OLD .*unnamed.npz: the record does not name the graph "
                                             r"tensors of images"):
        equivtool.compare_models(unnamed, models["tf2_bad_eps"], localize=True)


# --------------------------------------------------------------------------
# conventions: map_variables with a layer instance, loss_fn's regularization_loss
# --------------------------------------------------------------------------

def test_map_variables_takes_a_layer_instance_made_before_the_tf1_graph():
    from tests import checkpoint_models as cm
    instance = cm.NativeNet()  # made before map_variables builds the tf-slim graph
    by_instance = equivtool.map_variables(cm.slim_net, instance, cm.images())
    by_factory = equivtool.map_variables(cm.slim_net, cm.NativeNet, cm.images())
    assert by_instance.rules == by_factory.rules and len(by_instance.rules) == 8
    assert {v.name for v in instance.variables}  # the caller's layer itself was built


def test_loss_fn_gets_a_zero_scalar_regularization_loss_without_regularizers():
    import tensorflow as tf
    from tests import checkpoint_models as cm
    received = []

    def loss_fn(outputs, regularization_loss):
        received.append(regularization_loss)
        return tf.reduce_mean(tf.square(outputs["fc3"])) + regularization_loss  # failed on None

    rename = equivtool.map_variables(cm.two_dense, cm.TwoDense, cm.images())
    report = equivtool.check_equivalence(cm.two_dense, cm.TwoDense, cm.images(), steps=["gradients"],
                                         rename=rename, loss_fn=loss_fn)
    assert report.step("gradients").status == "passed", str(report)
    assert len(received) >= 2 and all(r is not None and r.shape.rank == 0 for r in received)


# --------------------------------------------------------------------------
# composite outputs: ragged and sparse, compared by their parts
# --------------------------------------------------------------------------

def composites(x, split=1):
    """A dense, a non-uniform ragged and a sparse output of ``x`` (rows of the ragged
    one: all values but the last ``split``, then those); ``split`` plants a fault
    in the row partition alone (the flat values are the same)."""
    import tensorflow as tf
    flat = tf.reshape(x, [-1])
    count = tf.size(flat, out_type=tf.int64)
    ragged = tf.RaggedTensor.from_row_lengths(flat, tf.stack([count - split, tf.constant(split, tf.int64)]))
    sparse = tf.sparse.from_dense(tf.where(x > 0.5, x, tf.zeros_like(x)))
    return {"dense": x * 2.0, "ragged": ragged, "sparse": sparse}


def composites_tf1(x, training):
    return composites(x)


def _composite_layer(split=1, pad=False):
    import tensorflow as tf

    class Composites(tf.keras.layers.Layer):
        def call(self, x, training=None):
            outputs = composites(x, split)
            if pad:  # the same indices and values in a larger dense shape
                outputs["sparse"] = tf.sparse.reset_shape(outputs["sparse"], tf.shape(x, out_type=tf.int64) + 1)
            return outputs
    return Composites


COMPOSITE_X = np.array([[0.2, 0.7, 0.9], [0.6, 0.1, 0.8]], np.float32)


def test_check_compares_ragged_and_sparse_outputs_by_their_parts():
    report = equivtool.check_equivalence(composites_tf1, _composite_layer(), COMPOSITE_X, steps=["fixed_weights"])
    leaves = {leaf.name: leaf for leaf in report.step("fixed_weights").leaves}
    assert report.passed, str(report)
    for name in ("ragged/flat_values", "ragged/row_splits_0", "sparse/indices", "sparse/values",
                 "sparse/dense_shape"):
        assert leaves[f"end_points/{name}"].compared > 0, sorted(leaves)
    moved = equivtool.check_equivalence(composites_tf1, _composite_layer(split=2), COMPOSITE_X,
                                        steps=["fixed_weights"])
    assert not moved.passed and moved.step("fixed_weights").first_divergence == "end_points/ragged/row_splits_0"
    padded = equivtool.check_equivalence(composites_tf1, _composite_layer(pad=True), COMPOSITE_X,
                                         steps=["fixed_weights"])
    assert not padded.passed and padded.step("fixed_weights").first_divergence == "end_points/sparse/dense_shape"


@pytest.fixture(scope="module")
def composite_models(tmp_path_factory):
    import tensorflow as tf
    root = tmp_path_factory.mktemp("composite")
    paths = {}
    for name, split in (("tf2", 1), ("tf2_moved", 2)):
        class Module(tf.Module):
            @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="x")])
            def serve(self, x, split=split):
                return composites(x, split)
        module = Module()
        paths[name] = str(root / name)
        # a second signature name for the same function: --old-signature/--new-signature pick one per side
        tf.saved_model.save(module, paths[name], signatures={"serving_default": module.serve,
                                                             "composites": module.serve})
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default(), v1.Session(graph=graph) as session:
        x = v1.placeholder(tf.float32, [None, 3], name="x")
        paths["tf1"] = str(root / "tf1")
        builder = v1.saved_model.Builder(paths["tf1"])
        signature = v1.saved_model.predict_signature_def({"x": x}, composites(x))
        builder.add_meta_graph_and_variables(session, ["serve"], signature_def_map={"serving_default": signature})
        builder.add_meta_graph(["exported", "tf1"], signature_def_map={"serving_default": signature})
        builder.save()
    return paths


def test_compare_two_identical_tf2_models_with_ragged_and_sparse_outputs(composite_models):
    report = equivtool.compare_models(composite_models["tf2"], composite_models["tf2"], input_shapes="x:2,3")
    names = [leaf.name for leaf in report.step("outputs").leaves]
    assert report.passed, str(report)
    assert names == ["dense", "ragged/flat_values", "ragged/row_splits_0", "sparse/indices", "sparse/values",
                     "sparse/dense_shape"]


def test_compare_a_tf1_model_with_ragged_and_sparse_signature_outputs(composite_models):
    report = equivtool.compare_models(composite_models["tf1"], composite_models["tf2"], input_shapes="x:2,3")
    assert report.passed and all(leaf.compared for leaf in report.step("outputs").leaves), str(report)
    moved = equivtool.compare_models(composite_models["tf1"], composite_models["tf2_moved"], input_shapes="x:2,3")
    assert not moved.passed and moved.step("outputs").first_divergence == "ragged/row_splits_0"


def test_a_record_of_ragged_and_sparse_outputs_replays(composite_models, tmp_path, capsys):
    record = tmp_path / "composite.npz"
    code, out, err = compare_cli(composite_models["tf2"], composite_models["tf1"], "--input-shapes", "x:2,3",
                                 "--save-outputs", record, capsys=capsys)
    assert code == 0 and record.exists(), out + err
    code, out, err = compare_cli(record, composite_models["tf2_moved"], capsys=capsys)
    assert code == 1 and "'ragged/row_splits_0': NOT close" in out, out + err
    assert equivtool.compare_models(str(record), composite_models["tf1"]).passed


SIDE_OPTIONS = [
    ("each side its signature", ["--new-signature", "composites"], 0, "Verdict: EQUIVALENT"),
    ("each side its tags", ["--old-tags", "exported,tf1"], 0, "Verdict: EQUIVALENT"),
    ("--signature sets both sides", ["--signature", "composites"], 2,
     "--signature: {tf1} has no signature 'composites'"),
    ("--tags sets both sides", ["--tags", "exported,tf1"], 2, "--tags: {tf2} has no MetaGraph tagged 'exported,tf1'"),
    ("--old-signature is named in its error", ["--old-signature", "composites"], 2,
     "--old-signature: {tf1} has no signature 'composites'"),
    ("--new-tags is named in its error", ["--new-tags", "exported"], 2, "--new-tags: {tf2} has no MetaGraph"),
]


@pytest.mark.parametrize("case", SIDE_OPTIONS, ids=[c[0] for c in SIDE_OPTIONS])
def test_signature_and_tags_per_side(composite_models, case, capsys):
    _, options, expected_code, words = case
    words = words.format(**composite_models)
    code, out, err = compare_cli(composite_models["tf1"], composite_models["tf2"], "--input-shapes", "x:2,3",
                                 *options, capsys=capsys)
    assert code == expected_code, out + err
    assert words in (out if code != 2 else err), out + err


def test_the_recorder_script_refuses_the_same_ranges():
    """record-script runs alone in an old environment: its generator refuses what compare refuses."""
    bool_spec, half_spec = {"name": "b", "dtype": "bool", "shape": [3]}, {"name": "h", "dtype": "float16", "shape": [3]}
    with pytest.raises(_recorder.RecordError, match="a bool input takes no range"):
        _recorder.generate_inputs([bool_spec], ranges={"b": (0, 1)})
    with pytest.raises(_recorder.RecordError, match="float16 holds at most 65504"):
        _recorder.generate_inputs([half_spec], ranges={"h": (0, 1e5)})
    batches, _ = _recorder.generate_inputs([bool_spec, {**half_spec, "shape": [4000]}], ranges={"h": (0, 1)})
    assert batches[0]["b"].dtype == bool and batches[0]["h"].max() < 1  # HI excluded after rounding to float16
