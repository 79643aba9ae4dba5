"""The op library: CPU kernels plus a driver-API launcher for the kernels
NVRTC compiles at run time (``equivtool/ops/_gpu.py``,
``custom_ops/xent_driver.h``), tested on a machine without a GPU.

The library (built with the C++ compiler alone) loads; with no driver (a missing ``libcuda``), a ``libcuda`` that lacks the driver
API, or no NVRTC, the op says why once and computes on the CPU. With a stub
driver (a few C functions) and a stand-in compiler the whole hand-over runs:
cubins in, GPU kernels registered with TensorFlow, the CPU kernels
untouched. Launching on a GPU needs a GPU (benchmarks/gpu/).

Each scenario runs in a fresh interpreter: the library opens ``libcuda`` once
per process, as a real process does.
"""

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from equivtool.ops import _build, _load, _nvrtc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.slow  # each scenario starts an interpreter with TensorFlow

_STUB_DRIVER = r"""
int cuInit(unsigned flags) { return 0; }
int cuDriverGetVersion(int* v) { *v = 12040; return 0; }
int cuGetErrorString(int e, const char** s) { *s = "stub"; return 0; }
int cuPointerGetAttribute(void* d, int a, unsigned long long p) { return 1; }
int cuCtxPushCurrent_v2(void* c) { return 1; }
int cuCtxPopCurrent_v2(void** c) { return 1; }
int cuCtxGetDevice(int* d) { return 1; }
int cuDeviceGetAttribute(int* v, int a, int d) { return 1; }
int cuModuleLoadData(void** m, const void* i) { return 1; }
int cuModuleGetFunction(void** f, void* m, const char* n) { return 1; }
int cuLaunchKernel(void* f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e,
                   unsigned g, unsigned s, void* st, void** p, void** x) { return 1; }
int cuMemAlloc_v2(unsigned long long* p, unsigned long n) { return 1; }
int cuMemsetD8Async(unsigned long long p, unsigned char v, unsigned long n, void* s) { return 1; }
int cuStreamCreate(void** s, unsigned f) { return 1; }
int cuStreamSynchronize(void* s) { return 1; }
int cuStreamDestroy_v2(void* s) { return 1; }
int cuThreadExchangeStreamCaptureMode(int* m) { return 1; }
"""

_SCENARIO = textwrap.dedent("""
    import json, warnings
    import equivtool
    import tensorflow as tf
    from tensorflow.python.framework import kernels
    from equivtool import ops
    from equivtool.ops import _gpu, _load, _nvrtc

    class FakeNvrtc:  # compiles nothing: the driver is a stub that runs nothing
        version, archs = (12, 9), (80, 90)
        def __repr__(self):
            return "NVRTC 12.9 (stand-in)"
        def compile(self, source, headers, arch, exprs):
            return b"cubin", {{e: "_Z%d" % i for i, e in enumerate(exprs)}}

    if {fake_nvrtc}:
        _nvrtc.find_nvrtc = lambda: FakeNvrtc()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _load.load_library()  # sees no GPU: nothing to enable, nothing said
        path = _load.library_path()
        stamp = _load.read_stamp(path)
        first = _gpu.enable(path, archs=[90])
        second = _gpu.enable(path, archs=[80])
    loss = ops.sparse_softmax_cross_entropy_with_logits(labels=[1], logits=[[0.0, 0.0]])
    gpu_kernels = sorted({{(k.op, k.device_type) for k in
                         kernels.get_registered_kernels_for_op("EquivtoolSparseXent").kernel}})
    print("RESULT", json.dumps({{
        "stamp": stamp, "source": first.source, "reason": first.reason, "text": str(first),
        "second": second.source, "driver": first.driver, "archs": list(second.archs),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
        "loss": float(loss[0]), "devices": [d for _, d in gpu_kernels]}}))
""")


@pytest.fixture(scope="module")
def cpu_library():
    """The op library as built here: the C++ compiler alone, as every user gets it."""
    path = _load.library_path()
    if not os.path.isfile(path):
        pytest.skip(f"the op library is not built at {path}")
    return path


@pytest.fixture(scope="module")
def stub_driver(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stub-driver")
    source = folder / "stub.c"
    source.write_text(_STUB_DRIVER)
    library = folder / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return str(library)


def _scenario(library, libcuda, fake_nvrtc=True, nvrtc=None):
    env = dict(os.environ, PYTHONPATH=REPO, EQUIVTOOL_OPS_LIBRARY=library,
               EQUIVTOOL_LIBCUDA=libcuda, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    if nvrtc:
        env["EQUIVTOOL_NVRTC"] = nvrtc
    proc = subprocess.run([sys.executable, "-c", _SCENARIO.format(fake_nvrtc=fake_nvrtc)],
                          env=env, cwd=REPO, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_the_library_has_no_cuda_code_and_says_it_uses_nvrtc(cpu_library):
    with open(cpu_library, "rb") as f:
        data = f.read()
    assert ".nv_fatbin" not in {name for name, *_ in _build.elf_section_table(data)}
    assert b"cuda=0;gpu=nvrtc" in data


def test_a_missing_libcuda_falls_back_to_the_cpu_with_one_message(cpu_library, tmp_path):
    missing = str(tmp_path / "nowhere" / "libcuda.so.1")
    out = _scenario(cpu_library, missing)
    assert out["source"] == out["second"] == "none"
    assert out["reason"].startswith(f"no NVIDIA driver: cannot open {missing}"), out
    assert len(out["warnings"]) == 1 and "runs on the CPU" in out["warnings"][0], out
    assert missing in out["warnings"][0]
    assert abs(out["loss"] - 0.6931472) < 1e-6  # the CPU kernel served
    assert out["devices"] == ["CPU"]  # no GPU kernel was registered


def test_a_libcuda_without_the_driver_api_falls_back_too(cpu_library):
    libm = ctypes.util.find_library("m")  # a real library, but not a driver
    out = _scenario(cpu_library, libm)
    assert out["source"] == "none" and out["reason"] == "libcuda has no cuInit", out
    assert len(out["warnings"]) == 1 and abs(out["loss"] - 0.6931472) < 1e-6


def test_no_nvrtc_falls_back_with_the_install_hint(cpu_library, stub_driver, tmp_path):
    out = _scenario(cpu_library, stub_driver, fake_nvrtc=False,
                    nvrtc=str(tmp_path / "libnvrtc.so.12"))
    assert out["source"] == "none" and out["driver"] == "12.4", out
    assert "no NVRTC found" in out["reason"] and "nvidia-cuda-nvrtc-cu12" in out["reason"]
    assert len(out["warnings"]) == 1 and out["devices"] == ["CPU"]


def test_with_a_driver_and_nvrtc_the_gpu_kernels_are_registered(cpu_library, stub_driver):
    out = _scenario(cpu_library, stub_driver)
    assert out["source"] == out["second"] == "nvrtc" and out["warnings"] == [], out
    assert out["archs"] == [80] and out["driver"] == "12.4"
    assert "compiled at run time by NVRTC 12.9 (stand-in) for sm_90" in out["text"]
    assert sorted(out["devices"]) == ["CPU", "GPU"]  # registered, and the CPU kernel kept
    assert abs(out["loss"] - 0.6931472) < 1e-6


_HAND_OVER = textwrap.dedent("""
    import ctypes, json
    import equivtool
    from equivtool.ops import _load, _nvrtc
    _load.load_library()
    lib = ctypes.CDLL(_load.library_path())  # the handle TensorFlow opened
    lib.equivtool_xent_add_cubin.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                                             ctypes.c_char_p]
    names = "\\n".join(f"{k}=_Z{i}" for i, k in enumerate(_nvrtc.kernel_names("float32")))
    results = [lib.equivtool_xent_add_cubin(90, b"cubin", 5, names.encode())]
    for bad in (b"", b"no-equals-sign", b"key=", b"=value", b"a=b\\n\\nc=d"):
        results.append(lib.equivtool_xent_add_cubin(90, b"cubin", 5, bad))
    results.append(lib.equivtool_xent_add_cubin(90, b"", 0, names.encode()))
    print("RESULT", json.dumps(results))
""")


def test_the_library_takes_cubins_and_refuses_malformed_hand_overs(cpu_library):
    # in a child: loading a second op library into this process would register
    # the ops twice
    env = dict(os.environ, PYTHONPATH=REPO, EQUIVTOOL_OPS_LIBRARY=cpu_library,
               TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", _HAND_OVER], env=env, cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:]
    results = json.loads(lines[-1][len("RESULT "):])
    assert results[0] == len(_nvrtc.kernel_names("float32")) == 17
    assert results[1:] == [-1] * 6, results  # each malformed hand-over refused
