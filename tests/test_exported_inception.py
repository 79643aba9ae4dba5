"""Inception-ResNet-v2 at a small size through ``equivtool demo --exported``: the tf-slim
graph as a TF1 SavedModel (``tf.compat.v1.saved_model.Builder``), its shim as a TF2
SavedModel, and the shim with a planted batch-norm epsilon, compared."""

from __future__ import annotations

import os
import sys

import equivtool

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples.exported import export  # noqa: E402

SIZE = 75  # the smallest Inception-ResNet-v2 takes


def test_the_exported_demo_proves_the_pair_and_localizes_the_fault(tmp_path, capsys):
    assert export.main([str(tmp_path), "--image-size", str(SIZE), "--num-classes", "10"]) == 0
    out = capsys.readouterr().out
    assert "Verdict: EQUIVALENT" in out and "Verdict: NOT EQUIVALENT" in out
    assert "OK: the faithful pair" in out and "Conv2d_1a_3x3/BatchNorm/FusedBatchNormV3" in out

    # every node of the faithful pair compared: nothing diverges, and most nodes align
    options = {"input_shapes": {"images": [1, SIZE, SIZE, 3]}, "val_range": {"images": (-1.0, 1.0)}}
    report = equivtool.compare_models(str(tmp_path / "tf1"), str(tmp_path / "tf2"), localize=True, **options)
    found = report.steps[0].data["localization"]
    assert report.passed and found.status == "no_divergence", str(found)
    assert found.compared > 800 and found.unaligned_tf1_count == 0, str(found)
