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


def test_op_library_error_is_a_runtime_error():
    assert issubclass(ops.OpLibraryError, RuntimeError)


def test_op_status_of_the_installed_library():
    status = ops.op_status()
    assert set(status) == {"built", "path", "built_for_tf", "cuda", "gpu_kernels", "error"}
    assert status["built"] and status["error"] is None
    assert status["built_for_tf"] == tf.__version__
    # where GPU kernels come from: nvcc's, or none here (no GPU visible)
    kernels = status["gpu_kernels"]
    assert kernels.source == ("aot" if status["cuda"] else "none"), kernels
    if kernels.source == "none":
        assert kernels.reason and kernels.reason in str(kernels)


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
    monkeypatch.setenv("EQUIVTOOL_OPS_CUDA", "0")  # the CPU build is enough here
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
# What the built library holds: read from the file (nm/readelf's view, parsed
# by _build.cuda_contents), so CI without a GPU checks what users' GPUs load.

def _expected_sass() -> set:
    """The machine code the build asks for on this TensorFlow: its ``sm_`` archs
    that the nvcc it finds can target, plus sm_90 (TF 2.16 lists no sm_89)."""
    build_info = dict(tf.sysconfig.get_build_info())
    nvcc, _, _ = _build.find_nvcc(build_info.get("cuda_version"))
    _, used, _ = _build._gencode_flags(nvcc, build_info.get("cuda_compute_capabilities", []))
    return {arch for arch in used if arch.startswith("sm_")}


def test_built_library_carries_its_cuda_runtime_and_hopper_machine_code():
    if not ops.op_status()["cuda"]:
        pytest.skip("this op library was built without CUDA (no nvcc here): no CUDA code to read")
    contents = _build.cuda_contents(_load.library_path())
    # every CUDA runtime symbol resolved inside the library (static cudart
    # linked before TensorFlow's framework library, which exports a stub) ...
    assert contents.undefined_cuda == (), contents.undefined_cuda
    # ... and kept private, so it neither serves nor shadows TensorFlow's
    assert contents.exported_cuda == (), contents.exported_cuda
    assert "sm_90" in contents.sass and _expected_sass() <= set(contents.sass), contents.sass
    assert contents.ptx, "no PTX: GPUs newer than the SASS list could not run the kernels"
    assert "CUDA runtime linked statically" in str(contents)


def _fatbin(entries):
    """A fatbin container with (kind, arch, isa_major, isa_minor) entries of 8-byte payloads."""
    import struct
    body = b""
    for kind, arch, major, minor in entries:
        header = struct.pack("<HHIQII", kind, 0x0101, 64, 8, 0, 0)
        header += struct.pack("<II", (major << 16) | minor, arch)
        body += header.ljust(64, b"\0") + b"payload!"
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def _shared_library(tmp_path, c_source: str):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to make a test library")
    src, lib = tmp_path / "x.c", tmp_path / "libx.so"
    src.write_text(c_source)
    import subprocess
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return str(lib)


def test_cuda_contents_reports_a_runtime_left_undefined_and_the_fatbin_entries(tmp_path):
    # the fault the old link order made: runtime symbols left for the process
    blob = _fatbin([(2, 75, 1, 8), (1, 86, 8, 5)])
    array = ", ".join(str(b) for b in blob)
    lib = _shared_library(tmp_path, f"""
__attribute__((section(".nv_fatbin"), used)) const unsigned char fatbin[] = {{{array}}};
extern int cudaGetLastError(void);
extern void* __cudaRegisterFatBinary(void*);
int f(void) {{ return cudaGetLastError() + (__cudaRegisterFatBinary(0) != 0); }}
int cudaLaunchKernelExported(void) {{ return 1; }}
""")
    contents = _build.cuda_contents(lib)
    assert contents.undefined_cuda == ("__cudaRegisterFatBinary", "cudaGetLastError")
    assert contents.exported_cuda == ("cudaLaunchKernelExported",)
    assert contents.sass == ("sm_75",)
    assert contents.ptx == (("compute_86", "8.5"),)
    assert "NOT linked in (2 undefined symbols" in str(contents)


def test_cuda_contents_of_a_library_without_cuda_code(tmp_path):
    lib = _shared_library(tmp_path, "int f(void) { return 1; }\n")
    contents = _build.cuda_contents(lib)
    assert not contents.has_cuda and contents.sass == () and contents.ptx == ()
    assert str(contents) == "no CUDA code"


def test_cuda_contents_refuses_a_file_that_is_not_elf(tmp_path):
    path = tmp_path / "not.so"
    path.write_bytes(b"MZ not an ELF file at all")
    with pytest.raises(ValueError, match="not a little-endian 64-bit ELF"):
        _build.cuda_contents(str(path))


def test_gencode_adds_hopper_machine_code_to_tensorflows_list():
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    flags, used, _ = _build._gencode_flags(nvcc, ["sm_80", "sm_89", "compute_90"])
    assert "arch=compute_90,code=sm_90" in flags and "arch=compute_90,code=compute_90" in flags
    assert used == ["sm_80", "sm_89", "sm_90", "compute_90"]


def test_nvcc_flags_match_the_cpu_builds_arithmetic():
    # no FMA contraction (the CPU build: -ffp-contract=off) and denormals
    # flushed (the CPU kernels flush them in every shard)
    assert "--fmad=false" in _build.NVCC_FLAGS and "-ftz=true" in _build.NVCC_FLAGS


def test_cuda_report_states_runtime_driver_and_archs():
    if not ops.op_status()["cuda"]:
        pytest.skip("this op library was built without CUDA (no nvcc here): no CUDA code to report")
    line = _build.cuda_report(_load.library_path())
    assert "runtime linked statically (needs an NVIDIA driver R" in line
    sass = _build.cuda_contents(_load.library_path()).sass
    assert "sm_90" in sass and _expected_sass() <= set(sass)
    assert f"SASS {', '.join(sass)}" in line and "PTX ISA" in line


def test_cuda_report_flags_a_library_that_leaves_the_runtime_out(tmp_path):
    blob = _fatbin([(2, 80, 1, 8)]) + b"EQUIVTOOL_XENT_BUILD{tensorflow=2.21.0;cuda=1;nvcc=12.5}"
    array = ", ".join(str(b) for b in blob)
    lib = _shared_library(tmp_path, f"""
__attribute__((section(".nv_fatbin"), used)) const unsigned char fatbin[] = {{{array}}};
extern int cudaGetLastError(void);
int f(void) {{ return cudaGetLastError(); }}
""")
    line = _build.cuda_report(lib)
    assert "NOT linked in (1 runtime symbols" in line and "equivtool build-ops" in line


def test_doctor_prints_the_ops_cuda_line():
    if not ops.op_status()["cuda"]:
        pytest.skip("this op library was built without CUDA (no nvcc here): no CUDA line")
    from equivtool import cli
    from equivtool.cli import doctor
    assert ("xent op CUDA", doctor.doctor_xent_cuda) in doctor.DOCTOR_CHECKS
    ok, text = doctor.doctor_xent_cuda()
    assert ok and text.startswith("CUDA ") and "SASS sm_80" in text


def test_doctor_says_where_the_gpu_kernels_come_from(monkeypatch, tmp_path):
    from equivtool import cli
    from equivtool.cli import doctor
    from equivtool.ops import _gpu
    assert ("xent op GPU", doctor.doctor_xent_gpu) in doctor.DOCTOR_CHECKS
    ok, text = doctor.doctor_xent_gpu()
    assert ok
    if ops.op_status()["cuda"]:
        assert text == "compiled ahead of time by nvcc (in the library)"
    # the run-time path's line: NVRTC, the cache's architectures, the driver
    cache = tmp_path / "cache"
    (cache / "kernels").mkdir(parents=True)
    (cache / "kernels" / "xent-0123456789abcdef-float32-sm_89-nvrtc12.9.cubin").write_bytes(b"x")
    monkeypatch.setenv("EQUIVTOOL_CACHE_DIR", str(cache))
    monkeypatch.setenv("EQUIVTOOL_NVRTC", str(tmp_path / "absent" / "libnvrtc.so.12"))
    line = _gpu.describe_gpu(ops.op_status()["path"], {"cuda": "0"})
    assert line.startswith("run time (NVRTC, driver API): no NVRTC found; cached sm_89 in "), line
    assert str(cache) in line and ("driver CUDA" in line or "no NVIDIA driver" in line), line
