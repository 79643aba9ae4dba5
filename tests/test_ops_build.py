"""The op library's build stamp, the loader's errors and op_status()."""

import equivtool  # noqa: F401  (must precede TensorFlow)

import os
import shutil
import struct
import subprocess
import sys
import sysconfig

import numpy as np
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
    image = b"\x7fELF...EQUIVTOOL_XENT_BUILD{tensorflow=2.0.0;cuda=0}..."
    fake.write_bytes(image + _build.digest_trailer(image))
    with pytest.raises(ops.OpLibraryError,
                       match=r"built for TensorFlow 2\.0\.0.*runs TensorFlow .*`equivtool build-ops`"):
        _load._check(str(fake))


def test_library_with_kernels_compiled_by_nvcc_is_refused(tmp_path):
    # what equivtool built where nvcc was found, before issue 39
    fake = tmp_path / "aot.so"
    image = b"\x7fELF...EQUIVTOOL_XENT_BUILD{tensorflow=" + tf.__version__.encode() + b";cuda=1;nvcc=13.0}..."
    fake.write_bytes(image + _build.digest_trailer(image))
    with pytest.raises(ops.OpLibraryError, match=r"older equivtool.*nvcc.*NVRTC.*`equivtool build-ops`"):
        _load._check(str(fake))
    # the same file stamped as this equivtool builds it passes the check
    good = tmp_path / "nvrtc.so"
    image = image.replace(b";cuda=1;nvcc=13.0", b";cuda=0;gpu=nvrtc")
    good.write_bytes(image + _build.digest_trailer(image))
    assert _load._check(str(good))["gpu"] == "nvrtc"


def test_op_library_error_is_a_runtime_error():
    assert issubclass(ops.OpLibraryError, RuntimeError)


def test_op_status_of_the_installed_library():
    status = ops.op_status()
    assert set(status) == {"built", "path", "built_for_tf", "gpu_kernels", "error"}
    assert status["built"] and status["error"] is None
    assert status["built_for_tf"] == tf.__version__
    # where GPU kernels come from: NVRTC where a GPU is visible, else none and why
    kernels = status["gpu_kernels"]
    if tf.config.list_physical_devices("GPU"):
        assert kernels.source in ("nvrtc", "none"), kernels
    else:
        assert kernels.source == "none" and kernels.reason == "no GPU visible to TensorFlow", kernels
        assert kernels.reason in str(kernels)


def test_op_status_reports_a_missing_library_without_raising(monkeypatch, tmp_path):
    monkeypatch.setenv("EQUIVTOOL_OPS_LIBRARY", str(tmp_path / "absent.so"))
    monkeypatch.setattr(_load, "_library", None)
    status = ops.op_status()
    assert not status["built"] and "equivtool build-ops" in status["error"]


def test_default_output_is_where_the_loader_looks(monkeypatch):
    monkeypatch.delenv("EQUIVTOOL_OPS_LIBRARY", raising=False)
    assert _load.library_path() == _build.default_output()
    assert _build.default_output().endswith(".so") and "_xent_ops" in _build.default_output()


# ---------------------------------------------------------------------------
# A damaged library is refused before dlopen, in every entry point. Each load
# runs in a subprocess: a crash (SIGBUS, SIGSEGV) must fail the test, not kill
# pytest.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_USE_OP = """
import equivtool
import tensorflow as tf
from equivtool import ops
try:
    ops.sparse_softmax_cross_entropy_with_logits(labels=[0], logits=tf.zeros([1, 3]))
except ops.OpLibraryError as exc:
    print("OpLibraryError:", exc)
else:
    print("LOADED")
"""


def _python(code_or_args, library):
    env = dict(os.environ, PYTHONPATH=REPO, EQUIVTOOL_OPS_LIBRARY=str(library),
               TF_CPP_MIN_LOG_LEVEL="3")
    args = ["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args
    return subprocess.run([sys.executable, *args], env=env, cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)


def _elf_section(data: bytes, wanted: str) -> tuple[int, int]:
    """(file offset, size) of a section of a 64-bit little-endian ELF image."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i):
        name, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, offset, size

    _, names_at, _ = header(shstrndx)
    for i in range(shnum):
        name, offset, size = header(i)
        end = data.index(b"\0", names_at + name)
        if data[names_at + name:end].decode() == wanted:
            return offset, size
    raise AssertionError(f"no {wanted} section")


def _damaged(tmp_path, how: str):
    data = bytearray(open(_load.library_path(), "rb").read())
    rng = np.random.default_rng(0)
    if how == "truncated":
        data = data[:len(data) // 2]
    else:
        offset, size = _elf_section(bytes(data), how)
        n = min(size, 4096)
        data[offset:offset + n] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    path = tmp_path / f"damaged{sysconfig.get_config_var('EXT_SUFFIX')}"
    path.write_bytes(bytes(data))
    return path


DAMAGE = ["truncated", ".text", ".dynsym"]


@pytest.mark.parametrize("how", DAMAGE)
def test_damaged_library_is_refused_at_first_use_without_crashing(tmp_path, how):
    proc = _python(_USE_OP, _damaged(tmp_path, how))
    assert proc.returncode == 0, f"interpreter died with {proc.returncode}:\n{proc.stdout[-2000:]}"
    assert "OpLibraryError:" in proc.stdout and "`equivtool build-ops`" in proc.stdout, proc.stdout
    assert "integrity digest" in proc.stdout


@pytest.mark.parametrize("how", DAMAGE)
def test_doctor_reports_a_damaged_library_without_crashing(tmp_path, how):
    proc = _python(["-m", "equivtool.cli", "doctor"], _damaged(tmp_path, how))
    assert proc.returncode >= 0, f"doctor died with signal {-proc.returncode}:\n{proc.stdout[-2000:]}"
    assert "xent op" in proc.stdout and "integrity digest" in proc.stdout, proc.stdout[-2000:]


def test_the_intact_library_loads_in_a_subprocess(tmp_path):
    """The control for the damage tests: the same code loads an undamaged copy."""
    copy = tmp_path / f"intact{sysconfig.get_config_var('EXT_SUFFIX')}"
    shutil.copyfile(_load.library_path(), copy)
    proc = _python(_USE_OP, copy)
    assert proc.returncode == 0 and "LOADED" in proc.stdout, proc.stdout[-2000:]


def test_digest_check_refuses_one_flipped_byte(tmp_path):
    data = bytearray(open(_load.library_path(), "rb").read())
    data[len(data) // 3] ^= 0x01
    bad = tmp_path / "flipped.so"
    bad.write_bytes(bytes(data))
    with pytest.raises(ops.OpLibraryError, match="does not match its integrity digest.*build-ops"):
        _load._check(str(bad))


@pytest.mark.parametrize("stamp", [b"tensorflow2.21.0;cuda=0", b"tensorflow=2.21.0;\xff=1",
                                   b"=2.21.0"])
def test_malformed_stamp_is_an_op_library_error(tmp_path, stamp):
    image = b"\x7fELF...EQUIVTOOL_XENT_BUILD{" + stamp + b"}..."
    bad = tmp_path / "stamp.so"
    bad.write_bytes(image + _build.digest_trailer(image))
    with pytest.raises(ops.OpLibraryError, match="build stamp.*`equivtool build-ops`"):
        _load._check(str(bad))
    with pytest.raises(ops.OpLibraryError, match="`equivtool build-ops`"):
        _load.read_stamp(str(bad))


def test_install_replaces_a_symlink_at_the_destination_not_its_target(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    output = tmp_path / "lib.so"
    output.symlink_to(victim)
    staged = tmp_path / "private" / "lib.so"
    staged.parent.mkdir()
    staged.write_bytes(b"\x7fELF image")
    _build._install(str(staged), str(output))
    assert victim.read_text() == "keep me"
    assert not output.is_symlink()
    assert output.read_bytes() == b"\x7fELF image" + _build.digest_trailer(b"\x7fELF image")


@pytest.mark.slow
def test_build_ops_ignores_a_planted_partial_symlink(tmp_path, monkeypatch):
    """A pre-existing <lib>.partial symlink is neither written through nor installed."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    output = tmp_path / f"_xent_ops{sysconfig.get_config_var('EXT_SUFFIX')}"
    os.symlink(victim, str(output) + ".partial")
    _build.build_ops(output=str(output))
    assert victim.read_text() == "keep me"
    assert output.is_file() and not output.is_symlink()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".equivtool-build-")] == []
    proc = _python(_USE_OP, output)
    assert proc.returncode == 0 and "LOADED" in proc.stdout, proc.stdout[-2000:]


# ---------------------------------------------------------------------------
# What the built library holds, read from the file: no CUDA code, no CUDA
# runtime (GPU kernels come from NVRTC at run time, issue 39).

def test_built_library_holds_no_cuda_code_and_says_its_gpu_kernels_come_from_nvrtc():
    path = _load.library_path()
    with open(path, "rb") as f:
        data = f.read()
    sections = {name for name, *_ in _build.elf_section_table(data)}
    assert ".text" in sections and ".nv_fatbin" not in sections and "__nv_module_id" not in sections
    assert b"cuda=0;gpu=nvrtc" in data and b"libcudart" not in data
    assert not any(name.startswith((".nv", "__nv")) for name in sections), sorted(sections)


def test_nvcc_flags_match_the_cpu_builds_arithmetic():
    # no FMA contraction (the CPU build: -ffp-contract=off) and denormals
    # flushed (the CPU kernels flush them in every shard)
    assert "--fmad=false" in _build.NVCC_FLAGS and "-ftz=true" in _build.NVCC_FLAGS


def test_doctor_says_where_the_gpu_kernels_come_from(monkeypatch, tmp_path):
    from equivtool import cli
    from equivtool.cli import doctor
    from equivtool.ops import _gpu
    assert ("xent op GPU", doctor.doctor_xent_gpu) in doctor.DOCTOR_CHECKS
    ok, text = doctor.doctor_xent_gpu()
    assert ok and "run time (NVRTC, driver API)" in text and "ahead of time" not in text
    # the run-time path's line: NVRTC, the cache's architectures, the driver
    cache = tmp_path / "cache"
    (cache / "kernels").mkdir(parents=True)
    (cache / "kernels" / "xent-0123456789abcdef-float32-sm_89-nvrtc12.9.cubin").write_bytes(b"x")
    monkeypatch.setenv("EQUIVTOOL_CACHE_DIR", str(cache))
    monkeypatch.setenv("EQUIVTOOL_NVRTC", str(tmp_path / "absent" / "libnvrtc.so.12"))
    line = _gpu.describe_gpu(ops.op_status()["path"])
    assert line.startswith("run time (NVRTC, driver API): no NVRTC found; cached sm_89 in "), line
    assert str(cache) in line and ("driver CUDA" in line or "no NVIDIA driver" in line), line
