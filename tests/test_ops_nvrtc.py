"""The op's CUDA kernels compiled at run time by NVRTC, without a GPU.

NVRTC compiles to cubins for any architecture it knows on a machine with no
GPU, so CI compiles the kernel source (``custom_ops/xent_device.cuh``) for
sm_80, sm_89 and sm_90 with the ``nvidia-cuda-nvrtc-cu12`` wheel (a test
extra), reads each cubin's architecture and resource use from its ELF, and
compares them with nvcc's build of the same kernels where nvcc is installed.
The on-disk cache is tested with a stand-in compiler (fast): hits, damaged
entries, two concurrent processes, symlinks.

Only float32 kernels are compiled for real here (about 15 s per
architecture on two loaded cores); every logits type shares the same code.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from equivtool.ops import _build, _nvrtc
from xent_kernel_params import PARAM_SIZES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARCHS = (80, 89, 90)


@pytest.fixture(scope="module")
def nvrtc():
    found = _nvrtc.find_nvrtc()
    if found is None:
        pytest.skip("no NVRTC: install the test extra (nvidia-cuda-nvrtc-cu12)")
    return found


@pytest.fixture(scope="module")
def images(nvrtc, tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("cubins"))
    return {arch: _nvrtc.kernel_image("float32", arch, nvrtc, folder) for arch in ARCHS}


def test_nvrtc_is_the_cuda_12_wheel_when_installed(nvrtc):
    # CUDA 12's NVRTC makes cubins that R525+ drivers load (TensorFlow's floor)
    assert nvrtc.version[0] == 12, nvrtc
    assert set(ARCHS) <= set(nvrtc.archs)


@pytest.mark.parametrize("arch", ARCHS)
def test_kernels_compile_to_a_cubin_of_the_asked_architecture(images, arch):
    image = images[arch]
    info = _nvrtc.cubin_info(image.cubin)
    assert info.arch == arch
    # every kernel the op looks up is in the cubin, under the lowered name NVRTC gave
    assert set(image.names) == set(_nvrtc.kernel_names("float32"))
    assert set(image.names.values()) == set(info.kernels)
    for name, res in info.kernels.items():
        assert res.frame_bytes == 0 and res.stack_bytes == 0, (name, res)  # nothing spilled
        assert 0 < res.registers <= 255, (name, res)
    # the sparse kernels' launch bounds (4 blocks of 256 threads per SM) cap them at 64
    for key in ("SparseForward:float32:int64:256", "SparseGrad:float32:int32:32"):
        assert info.kernels[image.names[key]].registers <= 64, key
    assert "sm_%d" % arch in str(image) and str(info).startswith("sm_%d" % arch)


def _top_level_args(text: str) -> list[str]:
    args, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "(<":
            depth += 1
        elif ch in ")>":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
    args.append(text[start:].strip())
    return args


def _recipe_launches() -> dict:
    """kernel -> the argument counts of its launches in xent_launch.h (blocks excluded)."""
    with open(os.path.join(_build.SOURCE_DIR, "xent_launch.h")) as f:
        source = f.read()
    found = {}
    # ChunkPass<KernelId::X, ...> launches its kernel as Launch<K, ...>
    chunk_pass = set(re.findall(r"ChunkPass<KernelId::(\w+),", source))
    for m in re.finditer(r"Launch<(?:KernelId::(\w+)|K),[^>]*>\(", source):
        depth, end = 1, m.end()
        while depth:  # to the parenthesis that closes this call
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            end += 1
        count = len(_top_level_args(source[m.end():end - 1])) - 1
        for kernel in [m.group(1)] if m.group(1) else chunk_pass:
            found.setdefault(kernel, set()).add(count)
    return found


def test_recipe_launches_pass_what_each_kernel_takes(images):
    image = images[90]
    info = _nvrtc.cubin_info(image.cubin)
    launches = _recipe_launches()
    assert set(launches) == set(PARAM_SIZES), launches  # every kernel is launched somewhere
    for key, lowered in image.names.items():
        kernel = key.split(":")[0]
        sizes = info.kernels[lowered].param_sizes
        assert sizes == PARAM_SIZES[kernel], (key, sizes)
        assert launches[kernel] == {len(sizes)}, (key, launches[kernel])


def test_recipe_reader_counts_arguments_at_the_top_level_only():
    # the reader above can fail: nested calls and template arguments are one argument each
    assert len(_top_level_args("BlocksFor(items, kWarp), x, f<a, b>(c, d)")) == 3


def test_arch_is_accepted_in_every_spelling_and_refused_clearly():
    assert {_nvrtc._arch_number(a) for a in ("sm_90", "9.0", (9, 0), 90)} == {90}
    with pytest.raises(ValueError, match="arch must be like"):
        _nvrtc._arch_number("hopper")
    with pytest.raises(ValueError, match="dtype must be one of"):
        _nvrtc.kernel_names("int8")


def test_cubin_reader_refuses_what_is_not_a_cubin():
    with open(sys.executable, "rb") as f:
        host_elf = f.read()
    with pytest.raises(ValueError, match="not a cubin"):
        _nvrtc.cubin_info(host_elf)


# ---------------------------------------------------------------------------
# The same kernels through nvcc (the GPU harness's compiler, with its flags).

def _nvcc_cubin(nvcc, arch, tmp_path):
    """nvcc's cubin of the float32 kernels, and ptxas' own report of them."""
    refs = ",\n  ".join(f"(void*){expr}" for expr in _nvrtc.kernel_names("float32").values())
    source = tmp_path / "aot.cu"
    source.write_text(f'#include "xent_device.cuh"\nvoid* keep[] = {{\n  {refs}\n}};\n')
    out = tmp_path / f"aot_sm{arch}.cubin"
    proc = subprocess.run(
        [nvcc, "-cubin", f"-arch=sm_{arch}", *_build.NVCC_FLAGS, f"-I{_build.SOURCE_DIR}",
         "-Xptxas", "-v", str(source), "-o", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout
    report = {}
    for fn, frame, spill, regs in re.findall(
            r"Function properties for (\S+)\n\s*(\d+) bytes stack frame, (\d+) bytes spill "
            r"stores, \d+ bytes spill loads\n.*?Used (\d+) registers", proc.stdout):
        report[fn] = (int(regs), int(frame), int(spill))
    return out.read_bytes(), report


@pytest.mark.parametrize("arch", [90])
def test_nvrtc_cubins_match_the_nvcc_builds_resources(images, arch, tmp_path):
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc to compare with")
    cubin, ptxas = _nvcc_cubin(nvcc, arch, tmp_path)
    aot = _nvrtc.cubin_info(cubin)
    # the ELF reader agrees with ptxas' own report on nvcc's cubin
    assert aot.arch == arch and set(ptxas) == set(aot.kernels) and ptxas
    for fn, (regs, frame, spill) in ptxas.items():
        assert (aot.kernels[fn].registers, aot.kernels[fn].frame_bytes) == (regs, frame), fn
        assert spill == 0, fn
    # the same kernels (same mangled names: NVRTC and nvcc see the same types)
    rtc = _nvrtc.cubin_info(images[arch].cubin)
    assert set(rtc.kernels) == set(aot.kernels)
    differences = {}
    for fn, res in rtc.kernels.items():
        other = aot.kernels[fn]
        assert res.frame_bytes == other.frame_bytes == 0, fn
        assert res.shared_bytes == other.shared_bytes, fn
        if res.registers != other.registers:
            differences[fn] = (res.registers, other.registers)
    # different compiler releases (NVRTC 12.x, nvcc 13.x) may allocate registers
    # differently; the launch bounds cap both, and most kernels must agree exactly
    assert len(differences) <= len(rtc.kernels) // 4, differences


# ---------------------------------------------------------------------------
# The cache, with a stand-in compiler.

class FakeNvrtc:
    """Compiles nothing: returns a cubin-like blob derived from its inputs."""
    version = (12, 9)
    archs = (80, 89, 90)

    def __init__(self):
        self.calls = 0

    def compile(self, source, headers, arch, name_expressions):
        self.calls += 1
        blob = hashlib.sha256((source + repr(sorted(headers.items())) + str(arch)).encode())
        return blob.digest() * 64, {e: f"_Z{i}" for i, e in enumerate(name_expressions)}


def test_cache_hit_returns_the_compiled_bytes(tmp_path):
    fake = FakeNvrtc()
    first = _nvrtc.kernel_image("float32", "sm_80", fake, str(tmp_path))
    again = _nvrtc.kernel_image("float32", "sm_80", fake, str(tmp_path))
    assert (first.source, again.source, fake.calls) == ("compiled", "cache", 1)
    assert again.cubin == first.cubin and again.names == first.names
    assert set(first.names) == set(_nvrtc.kernel_names("float32"))
    # another architecture, logits type or NVRTC version is another entry
    _nvrtc.kernel_image("float32", "sm_90", fake, str(tmp_path))
    _nvrtc.kernel_image("float64", "sm_80", fake, str(tmp_path))
    newer = FakeNvrtc()
    newer.version = (12, 10)
    _nvrtc.kernel_image("float32", "sm_80", newer, str(tmp_path))
    assert fake.calls == 3 and newer.calls == 1
    assert len(_nvrtc.cached_entries(str(tmp_path))) == 4


def test_cache_key_follows_the_source(tmp_path):
    fake = FakeNvrtc()
    sources = tmp_path / "src"
    shutil.copytree(_build.SOURCE_DIR, sources)
    cache = str(tmp_path / "cache")
    a = _nvrtc.kernel_image("float32", 90, fake, cache, source_dir=str(sources))
    with open(sources / "xent_row.h", "a") as f:
        f.write("\n// an edit\n")
    b = _nvrtc.kernel_image("float32", 90, fake, cache, source_dir=str(sources))
    assert (a.source, b.source, fake.calls) == ("compiled", "compiled", 2)
    assert a.path != b.path and a.source_hash != b.source_hash


@pytest.mark.parametrize("damage", ["flip a cubin byte", "truncate", "garbage", "empty",
                                    "other key", "bad header"])
def test_a_damaged_entry_is_recompiled_not_loaded(tmp_path, damage):
    fake = FakeNvrtc()
    good = _nvrtc.kernel_image("float32", 90, fake, str(tmp_path))
    data = bytearray(open(good.path, "rb").read())
    if damage == "flip a cubin byte":
        data[-10] ^= 0xFF
    elif damage == "truncate":
        data = data[:-7]
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif damage == "empty":
        data = bytearray()
    elif damage == "other key":  # a valid entry written for sm_80, under sm_90's name
        other = _nvrtc.kernel_image("float32", 80, fake, str(tmp_path))
        data = bytearray(open(other.path, "rb").read())
    else:
        data[len(_nvrtc._CACHE_MAGIC) + 6] = ord("{")
    with open(good.path, "wb") as f:
        f.write(bytes(data))
    calls = fake.calls
    again = _nvrtc.kernel_image("float32", 90, fake, str(tmp_path))
    assert again.source == "compiled" and fake.calls == calls + 1
    assert again.cubin == good.cubin
    # and the entry was repaired in place
    assert _nvrtc.kernel_image("float32", 90, fake, str(tmp_path)).source == "cache"


def test_entries_are_written_atomically_never_through_a_symlink(tmp_path):
    fake = FakeNvrtc()
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    path = _nvrtc.entry_path(str(tmp_path), _nvrtc.source_hash(_nvrtc.device_sources()),
                             "float32", 90, fake.version)
    os.symlink(victim, path)
    image = _nvrtc.kernel_image("float32", 90, fake, str(tmp_path))
    assert image.source == "compiled" and victim.read_text() == "the user's file"
    assert not os.path.islink(path)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_an_unwritable_cache_still_compiles(tmp_path):
    fake = FakeNvrtc()
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    image = _nvrtc.kernel_image("float32", 90, fake, str(blocker / "kernels"))
    assert image.source.startswith("compiled, not cached (") and fake.calls == 1, image.source
    assert blocker.read_text() == "not a folder" and image.cubin


_RACER = textwrap.dedent("""
    import hashlib, os, sys, time
    sys.path.insert(0, {repo!r})
    from equivtool.ops import _nvrtc

    class SlowFake:
        version = (12, 9)
        archs = (90,)
        def compile(self, source, headers, arch, name_expressions):
            with open(os.path.join({log!r}, "compile-%d" % os.getpid()), "w"):
                pass
            time.sleep(1.0)  # long enough for the other process to arrive
            return b"cubin" * 1000, {{e: "_Z%d" % i for i, e in enumerate(name_expressions)}}

    open(os.path.join({log!r}, "ready-%d" % os.getpid()), "w").close()
    while len([n for n in os.listdir({log!r}) if n.startswith("ready-")]) < 2:
        time.sleep(0.01)
    image = _nvrtc.kernel_image("float32", 90, SlowFake(), {cache!r})
    print(image.source, hashlib.sha256(image.cubin).hexdigest())
""")


def test_two_processes_compile_once_and_read_the_same_entry(tmp_path):
    log, cache = tmp_path / "log", tmp_path / "cache"
    log.mkdir()
    code = _RACER.format(repo=REPO, log=str(log), cache=str(cache))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    results = sorted(out.split() for out, _err in outs)
    assert [r[0] for r in results] == ["cache", "compiled"], results  # one compiled, one waited
    assert results[0][1] == results[1][1]
    assert len([n for n in os.listdir(log) if n.startswith("compile-")]) == 1
    assert len(_nvrtc.cached_entries(str(cache))) == 1


def test_no_nvrtc_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("EQUIVTOOL_NVRTC", str(tmp_path / "libnvrtc.so.12"))
    assert _nvrtc.find_nvrtc() is None
    with pytest.raises(_nvrtc.NvrtcError, match="no NVRTC found.*nvidia-cuda-nvrtc-cu12"):
        _nvrtc.kernel_image("float32", 90, folder=str(tmp_path))


def test_compile_errors_carry_nvrtcs_log(nvrtc):
    with pytest.raises(_nvrtc.NvrtcError, match="(?s)compiling the kernels for sm_90 failed.*error: expected a declaration"):
        nvrtc.compile("this is not C++;", {}, 90, [])
    with pytest.raises(_nvrtc.NvrtcError, match="cannot compile for sm_7\\b"):
        nvrtc.compile("", {}, 7, [])
