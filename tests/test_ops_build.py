"""The op library's build stamp, the loader's errors and op_status()."""

import equivtool  # noqa: F401  (must precede TensorFlow)

import shutil

import pytest
import tensorflow as tf

from equivtool import ops
from equivtool.ops import _build, _load


def test_installed_library_is_stamped_with_this_tensorflow():
    stamp = _load.read_stamp(_load.library_path())
    assert stamp is not None and stamp["tensorflow"] == tf.__version__


def test_build_info_op_reports_the_same_stamp():
    info = _load.load_library().equivtool_xent_build_info().numpy().decode()
    assert f"tensorflow={tf.__version__}" in info


def test_missing_library_error_names_the_fix(tmp_path):
    with pytest.raises(ops.OpLibraryError, match="not built.*`equivtool build-ops`"):
        _load._check(str(tmp_path / "absent.so"))


def test_library_built_for_another_tensorflow_is_refused(tmp_path):
    fake = tmp_path / "stale.so"
    fake.write_bytes(b"\x7fELF...EQUIVTOOL_XENT_BUILD{tensorflow=2.0.0;cuda=0}...")
    with pytest.raises(ops.OpLibraryError,
                       match=r"built for TensorFlow 2\.0\.0.*runs TensorFlow .*`equivtool build-ops`"):
        _load._check(str(fake))


def test_op_library_error_is_a_runtime_error():
    assert issubclass(ops.OpLibraryError, RuntimeError)


def test_op_status_of_the_installed_library():
    status = ops.op_status()
    assert set(status) == {"built", "path", "built_for_tf", "cuda", "error"}
    assert status["built"] and status["error"] is None
    assert status["built_for_tf"] == tf.__version__


def test_op_status_reports_a_missing_library_without_raising(monkeypatch, tmp_path):
    monkeypatch.setenv("EQUIVTOOL_OPS_LIBRARY", str(tmp_path / "absent.so"))
    monkeypatch.setattr(_load, "_library", None)
    status = ops.op_status()
    assert not status["built"] and "equivtool build-ops" in status["error"]


def test_cuda_kernels_are_compiled_when_nvcc_exists():
    """CI with nvcc must at least compile the CUDA path (no GPU needed)."""
    nvcc, _, note = _build.find_nvcc(tf.sysconfig.get_build_info().get("cuda_version"))
    if nvcc is None or not tf.sysconfig.get_build_info().get("is_cuda_build"):
        pytest.skip(f"no CUDA build here: {note}")
    assert ops.op_status()["cuda"], "library built without CUDA although nvcc exists"


def test_default_output_is_where_the_loader_looks(monkeypatch):
    monkeypatch.delenv("EQUIVTOOL_OPS_LIBRARY", raising=False)
    assert _load.library_path() == _build.default_output()
    assert _build.default_output().endswith(".so") and "_xent_ops" in _build.default_output()


def test_gencode_keeps_only_architectures_nvcc_supports():
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    flags, used, dropped = _build._gencode_flags(nvcc, ["sm_10", "sm_80", "compute_90"])
    assert "sm_10" in dropped and "sm_10" not in used
    assert "arch=compute_80,code=sm_80" in flags
