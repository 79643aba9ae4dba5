"""``equivtool compare`` / ``compare_models``: exported models compared output by output and node by node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import equivtool
from equivtool import cli
from equivtool.exported import _record, _recorder

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from exported_models import build_all  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build_all(str(tmp_path_factory.mktemp("exported")))


def run_cli(*argv, capsys):
    code = cli.main(["compare", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def images(batch=2, dtype=np.float32):
    return np.random.RandomState(3).uniform(size=(batch, 8, 8, 3)).astype(dtype)


# -- faithful pairs ------------------------------------------------------------

def test_tf1_and_tf2_saved_models_are_equivalent(models, capsys):
    code, out, err = run_cli(models["tf1"], models["tf2"], "--input-shapes", "images:2,8,8,3", capsys=capsys)
    assert code == 0, out + err
    assert "Verdict: EQUIVALENT" in out
    report = equivtool.compare_models(models["tf1"], models["tf2"], input_shapes={"images": (2, 8, 8, 3)})
    assert report.passed
    leaves = report.step("outputs").leaves
    assert sorted(leaf.name for leaf in leaves) == ["logits", "pool1"]
    assert all(leaf.compared > 0 for leaf in leaves)
    assert report.meta["old"]["kind"] == "tf1-saved-model" and report.meta["new"]["kind"] == "tf2-saved-model"
    assert report.meta["new"]["tensorflow_version"]  # the version that wrote the SavedModel


def test_unknown_batch_dimension_defaults_to_one_with_a_note(models):
    report = equivtool.compare_models(models["tf1"], models["tf2"])
    assert report.passed
    assert report.meta["input_shapes"] == {"images": [1, 8, 8, 3]}
    assert any("unknown dimensions set to 1" in n for n in report.step("outputs").notes)


def test_frozen_graph_against_tf2_saved_model(models):
    report = equivtool.compare_models(models["pb"], models["tf2"], graph_inputs="images=images:0",
                                      graph_outputs=models["graph_outputs"], input_shapes=["images:2,8,8,3"])
    assert report.passed, str(report)
    assert [leaf.name for leaf in report.step("outputs").leaves] == ["logits", "pool1"]
    # an output NEW has and OLD has not fails the comparison: nothing is silently left out
    one = models["graph_outputs"].split(",")[0]
    report = equivtool.compare_models(models["pb"], models["tf2"], graph_inputs="images=images:0",
                                      graph_outputs=one, input_shapes=["images:2,8,8,3"])
    extra = report.step("outputs").leaves[-1]
    assert not report.passed and extra.name == "pool1" and extra.missing_in_expected


def test_keras_file_against_its_saved_model(models):
    report = equivtool.compare_models(models["h5"], models["keras_sm"], input_shapes="features:4,6",
                                      val_range="features:-2,2")
    assert report.passed, str(report)
    assert report.meta["input_shapes"] == {"features": [4, 6]}


def test_inputs_mapped_by_order_with_a_note_or_by_name(models):
    report = equivtool.compare_models(models["tf1"], models["tf2_x"])
    assert report.passed
    assert any("matched by order" in n for n in report.step("outputs").notes)
    report = equivtool.compare_models(models["tf1"], models["tf2_x"], map_inputs={"images": "x"})
    assert report.passed and report.meta["input_map"] == {"images": "x"}


# -- planted fault, localized -----------------------------------------------------

def test_planted_batch_norm_epsilon_is_not_equivalent_and_localized(models, capsys, tmp_path):
    code, out, err = run_cli(models["tf1"], models["tf2_bad_eps"], "--localize", "--json", str(tmp_path / "r.json"),
                             "--html", str(tmp_path / "r.html"), capsys=capsys)
    assert code == 1, out + err
    assert "NOT EQUIVALENT" in out and "first divergent op: small_net/bn1/FusedBatchNormV3" in out
    again = equivtool.EquivalenceReport.from_json(str(tmp_path / "r.json"))
    assert again.steps[0].data["localization"]["tf1_op"] == "small_net/bn1/FusedBatchNormV3"
    assert "FusedBatchNormV3" in (tmp_path / "r.html").read_text()
    report = equivtool.compare_models(models["tf1"], models["tf2_bad_eps"], localize=True)
    frozen = equivtool.compare_models(models["pb"], models["tf2_bad_eps"], localize=True,
                                      graph_inputs="images=images:0", graph_outputs=models["graph_outputs"])
    assert frozen.step("outputs").data["localization"].tf1_op == "small_net/bn1/FusedBatchNormV3"
    found = report.step("outputs").data["localization"]
    assert found.diverged
    assert found.tf1_op == "small_net/bn1/FusedBatchNormV3"
    assert found.tf2_op.endswith("small_net/bn1/FusedBatchNormV3") and found.tf2_type == "FusedBatchNormV3"
    assert found.compared >= 2  # the convolution before it was compared and agreed
    assert found.path[-1].name == found.tf1_op and all(e.ok for e in found.path[:-1])


def test_faithful_pair_localizes_no_divergence(models):
    report = equivtool.compare_models(models["tf1"], models["tf2"], localize=True)
    found = report.step("outputs").data["localization"]
    assert found.status == "no_divergence" and found.compared >= 5
    assert found.unaligned_tf1_count == 0


def test_a_tolerance_per_output(models):
    # atol 10 covers every value of both sides: nothing compared could differ at that
    # tolerance, so the step is inconclusive, not passed (and not failed)
    loose = equivtool.compare_models(models["tf1"], models["tf2_bad_eps"], atol=["10"], rtol=["1"])
    assert not loose.failed_steps and loose.step("outputs").status == "inconclusive"
    one = equivtool.compare_models(models["tf1"], models["tf2_bad_eps"], atol=["logits:10"], rtol=["logits:1"])
    leaves = {leaf.name: leaf for leaf in one.step("outputs").leaves}
    assert leaves["logits"].ok and not leaves["pool1"].ok and not one.passed


def test_nothing_compared_is_inconclusive(models, tmp_path, capsys):
    empty = tmp_path / "empty.npz"
    np.savez(empty, features=np.zeros((0, 6), np.float32))  # an empty batch: outputs of size 0
    code, out, err = run_cli(models["h5"], models["keras_sm"], "--inputs", str(empty), capsys=capsys)
    assert code == 1 and "Verdict: INCONCLUSIVE" in out, out + err


# -- golden records ------------------------------------------------------------------

def test_save_outputs_then_replay(models, tmp_path):
    record = str(tmp_path / "old.npz")
    report = equivtool.compare_models(models["tf1"], models["tf2"], save_outputs=record, localize=True, batches=2)
    assert report.passed and len(report.steps) == 2
    with np.load(record, allow_pickle=False) as data:
        header = json.loads(bytes(data["__record__"]).decode())
        assert header["version"] == 1 and header["batches"] == 2 and header["nodes"]
    assert equivtool.compare_models(record, models["tf2"]).passed
    bad = equivtool.compare_models(record, models["tf2_bad_eps"], localize=True)
    assert not bad.passed
    assert bad.steps[0].data["localization"].tf1_op == "small_net/bn1/FusedBatchNormV3"


def test_recorder_script_in_a_subprocess(models, tmp_path, capsys):
    assert cli.main(["record-script"]) == 0
    script = tmp_path / "record.py"
    script.write_text(capsys.readouterr().out)
    record = str(tmp_path / "golden.npz")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, str(script), models["tf1"], record, "--input-shapes", "images:2,8,8,3",
                           "--seed", "5", "--intermediates"], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "intermediate(s)" in done.stdout
    report = equivtool.compare_models(record, models["tf2"], localize=True)
    assert report.passed, str(report)
    assert "seed 5" in report.meta["inputs"]
    bad = equivtool.compare_models(record, models["tf2_bad_eps"], localize=True)
    assert bad.steps[0].data["localization"].diverged
    failed = subprocess.run([sys.executable, str(script), str(tmp_path / "nowhere"), record],
                            capture_output=True, text=True, env=env, timeout=300)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr


def _rewrite_header(src, dst, **changes):
    with np.load(src, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    header = json.loads(bytes(arrays["__record__"]).decode())
    for key, value in changes.items():
        if key == "writer_equivtool":
            header["writer"]["equivtool"] = value
        else:
            header[key] = value
    arrays["__record__"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    np.savez(dst, **arrays)


# -- bad input: one line, exit code 2 -------------------------------------------------

@pytest.fixture(scope="module")
def broken(models, tmp_path_factory):
    root = tmp_path_factory.mktemp("broken")
    paths = {}
    record = str(root / "good.npz")
    equivtool.compare_models(models["tf1"], models["tf2"], save_outputs=record)
    paths["record"] = record
    paths["v2"] = str(root / "v2.npz")
    _rewrite_header(record, paths["v2"], version=2)
    paths["newer"] = str(root / "newer.npz")
    _rewrite_header(record, paths["newer"], writer_equivtool="99.0.0")
    paths["truncated"] = str(root / "truncated.pb")
    with open(models["pb"], "rb") as f:
        data = f.read()
    with open(paths["truncated"], "wb") as f:
        f.write(data[: len(data) // 2])
    import tensorflow as tf
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(data)
    graph_def.node.add(name="gelu", op="Addons>Gelu")
    paths["addons"] = str(root / "addons.pb")
    with open(paths["addons"], "wb") as f:
        f.write(graph_def.SerializeToString())
    paths["corrupt"] = str(root / "corrupt_sm")
    shutil.copytree(models["tf2"], paths["corrupt"])
    for name in os.listdir(os.path.join(paths["corrupt"], "variables")):
        if name.startswith("variables.data"):
            with open(os.path.join(paths["corrupt"], "variables", name), "wb") as f:
                f.write(b"\0" * 7)
    paths["float64"] = str(root / "float64.npz")
    np.savez(paths["float64"], images=images(dtype=np.float64))
    paths["shape"] = str(root / "shape.npz")
    np.savez(paths["shape"], images=np.zeros((2, 9, 8, 3), np.float32))
    paths["not_a_model"] = str(root / "notes.txt")
    with open(paths["not_a_model"], "w") as f:
        f.write("hello")
    return paths


BAD = [
    ("not_a_model", lambda m, b: [b["not_a_model"], m["tf2"]], "is not a model or record"),
    ("missing", lambda m, b: [m["tf1"] + "_nowhere", m["tf2"]], "does not exist"),
    ("unknown tag", lambda m, b: [m["tf1"], m["tf2"], "--tags", "train"], "--tags: "),
    ("unknown signature", lambda m, b: [m["tf1"], m["tf2"], "--signature", "predict"], "--signature: "),
    ("inputs differ", lambda m, b: [m["tf1"], m["keras_sm"]], "map them with --map-inputs"),
    ("unregistered op", lambda m, b: [b["addons"], m["tf2"], "--graph-inputs", "images=images:0",
                                      "--graph-outputs", m["graph_outputs"]], "Addons>Gelu (likely from TF Addons"),
    ("truncated pb", lambda m, b: [b["truncated"], m["tf2"], "--graph-inputs", "images=images:0",
                                   "--graph-outputs", m["graph_outputs"]], "truncated or corrupt"),
    ("corrupt variables", lambda m, b: [m["tf1"], b["corrupt"]], "cannot load the TF2 SavedModel"),
    ("record version", lambda m, b: [b["v2"], m["tf2"]], "record format version 2"),
    ("newer equivtool", lambda m, b: [b["newer"], m["tf2"]], "newer than this equivtool"),
    ("dtype rejected", lambda m, b: [m["tf1"], m["tf2"], "--inputs", b["float64"]], "dtype float64"),
    ("shape rejected", lambda m, b: [m["tf1"], m["tf2"], "--inputs", b["shape"]], "shape (2, 9, 8, 3)"),
    ("record inputs", lambda m, b: [b["record"], m["keras_sm"], "--map-inputs", "images=features"],
     "NEW's inputs: input 'features'"),
    ("bad shape option", lambda m, b: [m["tf1"], m["tf2"], "--input-shapes", "images:2,x"], "--input-shapes: "),
    ("bad tolerance", lambda m, b: [m["tf1"], m["tf2"], "--atol", "logits:-1"], "--atol: "),
    ("bad map", lambda m, b: [m["tf1"], m["tf2"], "--map-inputs", "images"], "--map-inputs: "),
    ("op library", lambda m, b: [m["tf1"], m["tf2"], "--load-op-library", b["not_a_model"]], "--load-op-library: "),
    ("seed", lambda m, b: [m["tf1"], m["tf2"], "--seed", "-1"], "--seed: "),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_input_is_one_line_and_exit_2(models, broken, case, capsys):
    _, argv, expected = case
    code, out, err = run_cli(*argv(models, broken), capsys=capsys)
    lines = [line for line in err.splitlines() if line.startswith("equivtool compare: error:")]
    assert code == 2, out + err
    assert len(lines) == 1 and expected in lines[0], err
    assert "Traceback" not in err + out


def test_the_recorder_writes_atomically_and_without_pickle(tmp_path):
    meta = {"inputs": [{"name": "x", "dtype": "float32", "shape": [2]}],
            "outputs": [{"name": "y", "dtype": "object", "shape": [1]}]}
    target = tmp_path / "r.npz"
    with pytest.raises(_recorder.RecordError, match="without pickle"):
        _recorder.write_record(str(target), meta, [{"x": np.zeros(2, np.float32)}], [{"y": np.array([None])}])
    assert not target.exists() and os.listdir(tmp_path) == []


def test_side_capabilities_refuse_training(models):
    with equivtool.load_side(models["tf1"]) as side:
        assert side.capabilities["forward"] is None
        assert "forward pass only" in side.capabilities["training"]
        from equivtool.engine import sides as engine_sides  # the engine's side protocol asks the class
        assert engine_sides.refusal(type(side), [engine_sides.FORWARD, engine_sides.INTERMEDIATES]) is None
        assert "forward pass only" in engine_sides.refusal(type(side), [engine_sides.TRAINING])
        assert [str(t) for t in side.inputs] == ["images: float32 (?, 8, 8, 3)"]
    assert _record.recorder_source().startswith("# equivtool golden-record writer")


@pytest.mark.parametrize("kind", ["tf1", "tf2"])
def test_sides_run_the_graph_as_written(models, kind):
    """Under the default graph_rewrites="as_written" no fused kernel runs: the kernels
    that ran are read, the conv among them. The check can fail: the same kernels with
    the conv's swapped for oneDNN's fused conv are caught. (Whether TensorFlow's
    defaults fuse this small net depends on the version: 2.21 does, 2.16 does not;
    tests/test_execution.py proves the defaults fuse where they do.)"""
    from equivtool._platform import graph_rewrites as _graph_rewrites
    with equivtool.load_side(models[kind]) as side:
        if kind == "tf1":
            feed = {side.input_tensors["images"]: images()}
            kernels = _graph_rewrites.session_kernels(side.session, dict(side.output_tensors), feed)
            written = _graph_rewrites.written_types(side.graph.as_graph_def())
        else:  # the signature's function graphs, as the runtime executed them
            kernels, written = _graph_rewrites.function_kernels(side.run, {"images": images()})
    assert _graph_rewrites.fused_kernels(kernels, written) == {}
    convs = [name for name, kind_ in kernels.items() if "Conv2D" in kind_]
    assert convs, f"no conv kernel ran: nothing was checked ({sorted(set(kernels.values()))})"
    planted = {**kernels, convs[0]: "_MklNativeFusedConv2D"}
    assert _graph_rewrites.fused_kernels(planted, written) == {convs[0]: "_MklNativeFusedConv2D"}


def test_data_loader_batches_each_a_step(models, tmp_path):
    loader = tmp_path / "loader.py"
    loader.write_text("import numpy as np\n"
                      "def batches():\n"
                      "    for i in range(5):\n"
                      "        yield {'features': np.random.RandomState(i).uniform(-3, 3, (2, 6)).astype(np.float32)}\n")
    report = equivtool.compare_models(models["h5"], models["keras_sm"], data_loader=f"{loader}:batches", batches=3)
    assert report.passed and [s.name for s in report.steps] == ["outputs/batch0", "outputs/batch1", "outputs/batch2"]
    with pytest.raises(ValueError, match="--data-loader: expected FILE.py:FUNCTION"):
        equivtool.compare_models(models["h5"], models["keras_sm"], data_loader=str(loader))


def test_generated_integers_honour_the_value_range():
    specs = [{"name": "ids", "dtype": "int32", "shape": [None, 50]}, {"name": "x", "dtype": "float32", "shape": [3]}]
    (batch,), notes = _recorder.generate_inputs(specs, {"ids": (4, 50)}, {"ids": (3, 5), "x": (-2, -1)}, seed=1)
    assert batch["ids"].dtype == np.int32 and batch["ids"].shape == (4, 50)
    assert set(np.unique(batch["ids"])) == {3, 4, 5}  # both ends included
    assert batch["x"].dtype == np.float32 and ((-2 <= batch["x"]) & (batch["x"] < -1)).all()
    again, _ = _recorder.generate_inputs(specs, {"ids": (4, 50)}, {"ids": (3, 5), "x": (-2, -1)}, seed=1)
    assert np.array_equal(again[0]["ids"], batch["ids"])  # seeded
    with pytest.raises(_recorder.RecordError, match="holds no int32 value"):
        _recorder.generate_inputs(specs, {"ids": (4, 50)}, {"ids": (3.2, 3.8)})


def test_demo_exported_is_dispatched_and_refuses_bad_options_before_exporting(capsys):
    """``equivtool demo --exported`` runs examples/exported/export.py (its run, three IRv2
    exports and two comparisons, is measured by hand: see the README)."""
    assert cli.main(["demo", "--exported", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: equivtool demo --exported") and "--image-size" in out
    assert cli.main(["demo", "--exported", "--image-size", "40"]) == 2
    assert "--image-size: Inception-ResNet-v2 needs at least 75 px" in capsys.readouterr().err
    assert cli.main(["demo", "--exported", "--html", "/no/such/folder/r.html"]) == 2
    assert "--html: the folder of" in capsys.readouterr().err
    assert cli.main(["demo", "--help"]) == 0
    assert "equivtool demo --exported" in capsys.readouterr().out  # the parity demo points to it
