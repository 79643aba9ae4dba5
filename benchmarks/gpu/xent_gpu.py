"""Standalone GPU harness for equivtool's CUDA cross-entropy kernels.

One command, on a machine with an NVIDIA GPU, nvcc and PyTorch (no TensorFlow
needed)::

    python benchmarks/gpu/xent_gpu.py all --out results/

compiles ``custom_ops/xent_kernels.cu.cc`` with the op build's nvcc
flags (``equivtool/ops/_build.py``) and the C ABI in ``xent_capi.cu`` into a
small shared library, drives it through ctypes on PyTorch device buffers, and
runs the modes below. ``--launcher driver`` runs the op library's run-time
path instead: ``xent_capi_driver.cc`` (built by a C++ compiler alone) launches
NVRTC cubins through the driver API with the op's backend, the cubins either
compiled on the spot by ``equivtool/ops/_nvrtc.py`` or read from ``--cubins``
(written beforehand, anywhere, by ``export-cubins``: the CUDA 12 NVRTC that
pip users get). Both launchers run one recipe (``custom_ops/xent_launch.h``).
Modes:

- ``check``: correctness against a float64 reference (every shape, dtype, label
  kind and partition path; offset rows; huge finite logits; +-inf/NaN rows;
  out-of-range labels), with the error compared to PyTorch's fused
  ``F.cross_entropy`` on the same inputs;
- ``determinism``: bitwise-identical outputs over 100 runs, on several streams
  at once, in different launch orders, and for a row alone or inside a batch;
- ``sanitize``: a small case list meant to run under ``compute-sanitizer``
  (``--tool memcheck|racecheck|synccheck``);
- ``speed``: forward and forward+backward against PyTorch's ``F.cross_entropy``
  and a device-to-device copy of the logits (median of ``triton.testing.do_bench``).

- ``agree``: the runtime launcher, the driver launcher over ``--cubins`` and
  over cubins compiled on the spot give the same bits on every case;
- ``dump``: outputs for inputs saved by ``cpu_vs_gpu.py`` (CPU and GPU bits).

``all`` runs check, determinism and speed. ``--baseline SOURCE`` also builds
another version of the kernels file (e.g. the previous commit's) and times it;
``--other NAME=LIB`` times more built runtime libraries, ``--time-driver`` the
driver launcher beside the runtime one.

The reference maths and the case lists are plain NumPy/Python and importable
without a GPU (tests/test_gpu_harness.py checks them on the CPU).
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
KERNELS = os.path.join(REPO, "custom_ops")
CAPI = os.path.join(HERE, "xent_capi.cu")
CAPI_DRIVER = os.path.join(HERE, "xent_capi_driver.cc")

DTYPES = ("float16", "bfloat16", "float32", "float64")
DTYPE_CODE = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3}
LABEL_CODE = {"int32": 0, "int64": 1}


# ---------------------------------------------------------------------------
# Build (no GPU needed).
def load_build_module():
    """equivtool/ops/_build.py, loaded by path (it imports nothing from equivtool)."""
    spec = importlib.util.spec_from_file_location("_equivtool_build", os.path.join(
        REPO, "equivtool", "ops", "_build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_command(nvcc: str, output: str, kernels_source: str | None = None,
                  archs: Sequence[str] = ("sm_90",), defines: Sequence[str] = ()) -> list[str]:
    """The nvcc line that makes the harness library (the kernels' nvcc flags, plus
    ``-D`` for each of `defines`)."""
    build = load_build_module()
    source = kernels_source or os.path.join(KERNELS, "xent_kernels.cu.cc")
    gencode = []
    for arch in archs:
        number = arch.split("_", 1)[1]
        gencode += ["-gencode", f"arch=compute_{number},code=sm_{number}"]
    return [nvcc, *build.NVCC_FLAGS, *(f"-D{d}" for d in defines), "-shared", "-Xcompiler",
            "-fPIC", f"-I{KERNELS}", *gencode, "-x", "cu", CAPI, "-x", "cu", source, "-o", output]


def build_library(output: str, kernels_source: str | None = None, nvcc: str = "nvcc",
                  archs: Sequence[str] = ("sm_90",), defines: Sequence[str] = ()) -> str:
    cmd = build_command(nvcc, output, kernels_source, archs, defines)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"harness build failed:\n{' '.join(cmd)}\n{proc.stdout}")
    return output


def driver_build_command(cxx: str, output: str) -> list[str]:
    """The C++ line that makes the driver-launcher library (no CUDA toolkit)."""
    return [cxx, "-O3", "-std=c++17", "-ffp-contract=off", "-Wno-psabi", "-shared", "-fPIC",
            f"-I{KERNELS}", CAPI_DRIVER, "-ldl", "-o", output]


def build_driver_library(output: str, cxx: str = "g++") -> str:
    cmd = driver_build_command(cxx, output)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"driver harness build failed:\n{' '.join(cmd)}\n{proc.stdout}")
    return output


def nvrtc_module():
    """equivtool/ops/_nvrtc.py (it imports neither TensorFlow nor the op library)."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from equivtool.ops import _nvrtc
    return _nvrtc


@dataclasses.dataclass(frozen=True)
class Cubin:
    """One logits type's kernels for one architecture, as the op library receives them."""
    dtype: str
    arch: int
    cubin: bytes
    names: dict  # kernel key -> lowered name
    origin: str  # which NVRTC made it

    def names_text(self) -> bytes:
        return "".join(f"{k}={v}\n" for k, v in sorted(self.names.items())).encode()


def compile_cubins(arch: int, folder: str | None = None,
                   dtypes: Sequence[str] | None = None) -> list[Cubin]:
    """The op's run-time compile: every logits type (or `dtypes`) for sm_<arch>,
    through _nvrtc's cache (its default folder, or `folder`)."""
    nv = nvrtc_module()
    nvrtc = nv.find_nvrtc()
    if nvrtc is None:
        raise RuntimeError("no NVRTC found (see equivtool/ops/_nvrtc.py: nvrtc_candidates)")
    if dtypes is None:
        images = nv.kernel_images(arch, nvrtc, folder)
    else:
        images = [nv.kernel_image(dtype, arch, nvrtc, folder) for dtype in dtypes]
    return [Cubin(im.dtype, im.arch, im.cubin, dict(im.names),
                  f"NVRTC {nvrtc.version[0]}.{nvrtc.version[1]}") for im in images]


def export_cubins(folder: str, arch: int, cache: str | None = None,
                  dtypes: Sequence[str] | None = None) -> list[str]:
    """Writes compile_cubins(arch) to `folder` (no GPU needed), for --cubins."""
    os.makedirs(folder, exist_ok=True)
    written = []
    for c in compile_cubins(arch, cache, dtypes):
        base = os.path.join(folder, f"xent-{c.dtype}-sm{c.arch}")
        with open(base + ".cubin", "wb") as f:
            f.write(c.cubin)
        with open(base + ".json", "w") as f:
            json.dump({"dtype": c.dtype, "arch": c.arch, "names": c.names, "origin": c.origin}, f)
        written.append(base + ".cubin")
    return written


def read_cubins(folder: str) -> list[Cubin]:
    found = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("xent-") and name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                meta = json.load(f)
            with open(os.path.join(folder, name[:-5] + ".cubin"), "rb") as f:
                found.append(Cubin(meta["dtype"], meta["arch"], f.read(), meta["names"],
                                   meta["origin"]))
    if not found:
        raise RuntimeError(f"--cubins {folder}: no xent-*.json/.cubin pairs (see export-cubins)")
    return found


# ---------------------------------------------------------------------------
# Reference (float64, NumPy or PyTorch arrays; TensorFlow's special-value rules).
class _Ops:
    """The few array operations the reference needs, for NumPy or PyTorch."""

    def __init__(self, like: Any):
        self.torch = type(like).__module__.startswith("torch")

    def max(self, a, axis):
        return a.amax(dim=axis, keepdim=True) if self.torch else a.max(axis=axis, keepdims=True)

    def sum(self, a, axis):
        return a.sum(dim=axis, keepdim=True) if self.torch else a.sum(axis=axis, keepdims=True)

    def any(self, a, axis):
        return a.any(dim=axis) if self.torch else a.any(axis=axis)

    def all(self, a, axis):
        return a.all(dim=axis) if self.torch else a.all(axis=axis)

    def exp(self, a):
        return a.exp() if self.torch else np.exp(a)

    def log(self, a):
        return a.log() if self.torch else np.log(a)


def _bad_rows(x, ops: _Ops):
    """Rows TensorFlow's fused kernels make NaN: +inf or NaN present, or all -inf."""
    nan_or_inf = (x != x) | (x == float("inf"))
    all_minus_inf = ops.all(x == float("-inf"), 1) if x.shape[1] else (x.sum(1) == x.sum(1))
    return ops.any(nan_or_inf, 1) | all_minus_inf if x.shape[1] else all_minus_inf


def _log_softmax(x, ops: _Ops):
    if x.shape[1] == 0:
        return x, x
    z = x - ops.max(x, 1)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        lse = ops.log(ops.sum(ops.exp(z), 1))
    return z, lse


def reference_sparse(x, labels, grad_loss):
    """(loss, dlogits) in float64 for sparse labels; NaN rows as TensorFlow's GPU op."""
    ops = _Ops(x)
    rows, classes = x.shape
    valid = (labels >= 0) & (labels < classes)
    bad = _bad_rows(x, ops) | ~valid
    safe = labels * valid
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        z, lse = _log_softmax(x, ops)
        if classes == 0:
            loss = x.sum(1) * float("nan")
            return loss, x.clone() if ops.torch else x.copy()
        if ops.torch:
            import torch
            picked = z.gather(1, safe.long()[:, None])
            onehot = torch.zeros_like(x).scatter_(1, safe.long()[:, None], 1.0)
        else:
            picked = np.take_along_axis(z, safe.astype(np.int64)[:, None], 1)
            onehot = np.zeros_like(x)
            onehot[np.arange(rows), safe.astype(np.int64)] = 1.0
        loss = (lse - picked)[:, 0]
        p = ops.exp(z - lse)
        grad = grad_loss[:, None] * (p - onehot)
    nan = float("nan")
    loss[bad] = nan
    grad[bad] = nan
    return loss, grad


def reference_dense(x, y, grad_loss, exact: bool = False):
    """(loss, dlogits) in float64 for dense labels: dlogits = g * (p - y), as
    TensorFlow's, or with ``exact`` the true derivative g * (sum(y) p - y)."""
    ops = _Ops(x)
    bad = _bad_rows(x, ops)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        z, lse = _log_softmax(x, ops)
        loss = ops.sum(y * (lse - z), 1)[:, 0]
        p = ops.exp(z - lse)
        ysum = ops.sum(y, 1) if exact else 1.0
        grad = grad_loss[:, None] * (ysum * p - y)
    loss[bad] = float("nan")
    grad[bad] = float("nan")
    return loss, grad


# ---------------------------------------------------------------------------
# Cases (plain data; no GPU needed to list them).
@dataclasses.dataclass(frozen=True)
class Case:
    rows: int
    classes: int
    dtype: str = "float32"
    labels: str = "int64"      # int32 | int64 | dense
    kind: str = "normal"       # normal | offset | huge | special | bad_labels
    offset_bytes: int = 0      # logits start this many elements past a 16-byte boundary
    exact: bool = False        # dense: the exact gradient (sum(y) p - y), not TF's (p - y)

    @property
    def name(self) -> str:
        extra = f" +{self.offset_bytes}" if self.offset_bytes else ""
        exact = " exact" if self.exact else ""
        return f"[{self.rows},{self.classes}] {self.dtype} {self.labels}{exact} {self.kind}{extra}"


# Row lengths that hit every partition path and its edges (see PlanFor in the
# kernels file: a warp per row up to 1024 elements for float32 (2048 for
# 16-bit types, 512 for float64), a block up to 8 times that, chunks beyond).
EDGE_CLASSES = (1, 3, 7, 10, 127, 128, 129, 511, 512, 513, 1000, 1023, 1024, 1025, 2047,
                2048, 2049, 4095, 4096, 4097, 8191, 8192, 8193, 16383, 16384, 16385, 32000)
ISSUE_SHAPES = ((1, 1), (7, 3), (8192, 1000), (1024, 32000), (4096, 128256), (64, 262144),
                (1, 1048576), (65536, 10), (0, 10))
SPEED_SHAPES = ((8192, 1000), (1024, 32000), (4096, 128256), (1, 1048576))


def check_cases(full: bool = True) -> list[Case]:
    cases: list[Case] = []
    big = {(4096, 128256), (64, 262144), (1, 1048576)}
    for rows, classes in ISSUE_SHAPES:
        for dtype in DTYPES:
            if not full and (rows, classes) in big:
                continue
            for labels in ("int32", "int64", "dense"):
                if (rows, classes) in big and labels == "int32" and dtype != "float32":
                    continue
                cases.append(Case(rows, classes, dtype, labels))
            cases.append(Case(rows, classes, dtype, "dense", exact=True))
    for classes in EDGE_CLASSES:
        for dtype in DTYPES:
            cases.append(Case(37, classes, dtype, "int64"))
            cases.append(Case(5, classes, dtype, "dense"))
            cases.append(Case(5, classes, dtype, "dense", exact=True))
            cases.append(Case(5, classes, dtype, "int32", offset_bytes=1))
    many = (1 << 20) + 3 if full else 4099
    cases += [Case(many, 10, "float32", "int32"), Case(many, 10, "bfloat16", "int64")]
    for dtype in DTYPES:
        for classes in (10, 1000, 20000):
            for labels in ("int64", "dense"):
                for kind in ("offset", "huge", "special"):
                    cases.append(Case(24, classes, dtype, labels, kind))
            cases.append(Case(24, classes, dtype, "int32", "bad_labels"))
    return cases


def sanitize_cases() -> list[Case]:
    """Small, every path: warp, block, chunked; aligned and not; sparse and dense."""
    cases = []
    for dtype in DTYPES:
        for classes in (3, 1000, 1025, 8193, 20000):
            cases.append(Case(9, classes, dtype, "int64"))
            cases.append(Case(3, classes, dtype, "dense"))
            cases.append(Case(3, classes, dtype, "dense", exact=True))
            cases.append(Case(3, classes, dtype, "int32", "special", offset_bytes=1))
        cases.append(Case(4, 9000, dtype, "int32", "bad_labels"))
    return cases


class _NumpyRandom:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.xp = np

    def normal(self, shape):
        return self.rng.standard_normal(shape)

    def uniform(self, shape):
        return self.rng.random(shape)

    def integers(self, high: int, n: int, dtype: str):
        return self.rng.integers(0, high, size=n).astype(dtype)


class _TorchRandom:
    """The same draws' kind on the device (large cases would take minutes in NumPy)."""

    def __init__(self, seed: int):
        import torch
        self.torch = torch
        self.gen = torch.Generator(device="cuda").manual_seed(seed)

    def normal(self, shape):
        return self.torch.randn(shape, generator=self.gen, device="cuda", dtype=self.torch.float64)

    def uniform(self, shape):
        return self.torch.rand(shape, generator=self.gen, device="cuda", dtype=self.torch.float64)

    def integers(self, high: int, n: int, dtype: str):
        return self.torch.randint(0, high, (n,), generator=self.gen, device="cuda",
                                  dtype=getattr(self.torch, dtype))


def make_inputs(case: Case, seed: int, device: bool = False) -> dict[str, Any]:
    """float64 logits (before rounding to the dtype), labels and grad_loss:
    NumPy arrays, or PyTorch CUDA tensors with ``device=True``."""
    rnd = _TorchRandom(seed) if device else _NumpyRandom(seed)
    b, c = case.rows, case.classes
    x = rnd.normal((b, c)) * 3.0
    if case.kind == "offset":
        x += 1e4
    if case.kind == "huge":
        # float64: 1e307, so that the float64 reference's x - max stays finite
        big = {"float16": 6.0e4, "bfloat16": 3.0e38, "float32": 3.0e38, "float64": 1.0e307}[case.dtype]
        if c:
            x[0::3, 0] = big
            x[1::3, c - 1] = -big
            x[2::3, c // 2] = big
            x[2::3, 0] = -big
    inf, nan = float("inf"), float("nan")
    if case.kind == "special" and c:
        x[0, c // 2] = inf
        x[1, 0] = nan
        x[2, :] = -inf
        if b > 3:
            x[3, c - 1] = -inf  # a -inf among finite values: probability 0
        if b > 4:
            x[4, :] = -inf
            x[4, c - 1] = 0.5
    out = {"logits": x}
    if case.labels == "dense":
        y = rnd.uniform((b, c))
        total = y.sum(1)[:, None]
        y = y / (total + (total == 0))
        if b > 1:
            y[1] *= 0.5  # a row that does not sum to one
        out["labels"] = y
    else:
        labels = rnd.integers(max(c, 1), b, case.labels)
        if case.kind == "bad_labels" and b:
            labels[0::4] = c
            labels[1::4] = -1
            labels[2::4] = 2**31 - 1
        if case.kind == "special" and b > 3:
            labels[3] = c - 1  # the -inf logit is the label: infinite loss
        out["labels"] = labels
    out["grad_loss"] = rnd.uniform((b,)) + 0.5
    return out


# ---------------------------------------------------------------------------
# The GPU side (imported lazily: PyTorch and a device are needed from here on).
class Kernels:
    """ctypes over the harness library."""

    def __init__(self, path: str):
        lib = ctypes.CDLL(path)
        P, I, L = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
        lib.xent_sparse_forward.argtypes = [I, I, P, P, P, L, L, P, P, P]
        lib.xent_sparse_grad.argtypes = [I, I, P, P, P, L, L, P, P, P, P]
        lib.xent_dense_forward.argtypes = [I, P, P, P, L, L, P, P, P]
        lib.xent_dense_grad.argtypes = [I, P, P, P, L, L, P, P, P, I, P]
        for f in (lib.xent_sparse_forward, lib.xent_sparse_grad, lib.xent_dense_forward,
                  lib.xent_dense_grad):
            f.restype = ctypes.c_char_p
        self.lib = lib

    @staticmethod
    def _check(err: bytes | None, what: str) -> None:
        if err is not None:
            raise RuntimeError(f"{what}: {err.decode()}")

    def forward(self, x, labels, loss, shift, log_norm, stream) -> None:
        import torch
        b, c = x.shape
        code = DTYPE_CODE[str(x.dtype).replace("torch.", "")]
        if labels.dtype in (torch.int32, torch.int64):
            self._check(self.lib.xent_sparse_forward(
                code, 0 if labels.dtype == torch.int32 else 1, stream, x.data_ptr(),
                labels.data_ptr(), b, c, loss.data_ptr(), shift.data_ptr(), log_norm.data_ptr()),
                "sparse forward")
        else:
            self._check(self.lib.xent_dense_forward(
                code, stream, x.data_ptr(), labels.data_ptr(), b, c, loss.data_ptr(),
                shift.data_ptr(), log_norm.data_ptr()), "dense forward")

    def grad(self, x, labels, shift, log_norm, grad_loss, dx, stream, exact: bool = False) -> None:
        import torch
        b, c = x.shape
        code = DTYPE_CODE[str(x.dtype).replace("torch.", "")]
        if labels.dtype in (torch.int32, torch.int64):
            self._check(self.lib.xent_sparse_grad(
                code, 0 if labels.dtype == torch.int32 else 1, stream, x.data_ptr(),
                labels.data_ptr(), b, c, shift.data_ptr(), log_norm.data_ptr(),
                grad_loss.data_ptr(), dx.data_ptr()), "sparse grad")
        else:
            self._check(self.lib.xent_dense_grad(
                code, stream, x.data_ptr(), labels.data_ptr(), b, c, shift.data_ptr(),
                log_norm.data_ptr(), grad_loss.data_ptr(), int(exact), dx.data_ptr()), "dense grad")


class DriverKernels(Kernels):
    """The driver-launcher library with its cubins handed over (as _gpu.py does for the op)."""

    def __init__(self, path: str, cubins: Sequence[Cubin]):
        super().__init__(path)
        lib = self.lib
        lib.xent_driver_error.restype = ctypes.c_char_p
        lib.xent_add_cubin.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                                       ctypes.c_char_p]
        lib.xent_add_cubin.restype = ctypes.c_int
        error = lib.xent_driver_error().decode()
        if error:
            raise RuntimeError(f"driver launcher: {error}")
        for c in cubins:
            if lib.xent_add_cubin(c.arch, c.cubin, len(c.cubin), c.names_text()) <= 0:
                raise RuntimeError(f"driver launcher refused the {c.dtype} sm_{c.arch} cubin")
        self.origin = sorted({c.origin for c in cubins})


def _torch_dtype(name: str):
    import torch
    return getattr(torch, name)


def _offset_view(t, offset: int):
    """t's values in a buffer that starts `offset` elements past an aligned one."""
    import torch
    if offset == 0:
        return t.contiguous()
    flat = torch.empty(t.numel() + offset, dtype=t.dtype, device=t.device)
    view = flat[offset:].view(t.shape)
    view.copy_(t)
    return view


def run_case(k: Kernels, case: Case, seed: int, stream=None, poison: bool = True):
    """Inputs on the device and our (loss, dlogits) for one case."""
    import torch
    dev = "cuda"
    data = make_inputs(case, seed, device=True)
    dt = _torch_dtype(case.dtype)
    x = _offset_view(data["logits"].to(dt), case.offset_bytes)
    if case.labels == "dense":
        labels = _offset_view(data["labels"].to(dt), case.offset_bytes)
    else:
        labels = data["labels"]
    g = data["grad_loss"].to(dt)
    acc = torch.float64 if case.dtype == "float64" else torch.float32
    b, c = case.rows, case.classes
    fill = float("nan") if poison else 0.0
    loss = torch.full((b,), fill, dtype=dt, device=dev)
    shift = torch.full((b,), fill, dtype=acc, device=dev)
    log_norm = torch.full((b,), fill, dtype=acc, device=dev)
    dx = _offset_view(torch.full((b, c), 7.0, dtype=dt, device=dev), case.offset_bytes)
    s = stream.cuda_stream if stream is not None else torch.cuda.current_stream().cuda_stream
    k.forward(x, labels, loss, shift, log_norm, s)
    k.grad(x, labels, shift, log_norm, g, dx, s, case.exact)
    return {"x": x, "labels": labels, "g": g, "loss": loss, "dx": dx}


def _rel_err(out, ref):
    """max |out - ref| / max(1, max|ref|) over finite reference entries (NaN and
    infinities are checked separately)."""
    import torch
    out = out.double()
    finite = torch.isfinite(ref)
    if not finite.any():
        return 0.0
    diff = (out[finite] - ref[finite]).abs()
    if torch.isnan(diff).any():
        return float("inf")
    scale = max(1.0, ref[finite].abs().max().item())
    return diff.max().item() / scale


def _l2_rel(out, ref):
    import torch
    out = out.double()
    finite = torch.isfinite(ref)
    num = torch.linalg.vector_norm((out - ref)[finite]).item()
    den = torch.linalg.vector_norm(ref[finite]).item()
    return num / den if den else num


OUTPUT_EPS = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}


def check_one(k: Kernels, case: Case, seed: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    r = run_case(k, case, seed)
    x64 = r["x"].double()
    g64 = r["g"].double()
    if case.labels == "dense":
        ref_loss, ref_dx = reference_dense(x64, r["labels"].double(), g64, case.exact)
    else:
        ref_loss, ref_dx = reference_sparse(x64, r["labels"].long(), g64)
    loss, dx = r["loss"], r["dx"]
    # the reference rounded to the output type: a loss beyond the type's range
    # is +-inf there, as it must be in ours
    ref_loss = ref_loss.to(loss.dtype).double()
    ref_dx = ref_dx.to(dx.dtype).double()
    problems = []
    # NaN exactly where the reference has NaN (rows TF makes NaN); inf where it has inf
    if not torch.equal(torch.isnan(loss.double()), torch.isnan(ref_loss)):
        problems.append("loss NaN pattern differs")
    if case.rows and case.classes and not torch.equal(torch.isnan(dx.double()), torch.isnan(ref_dx)):
        problems.append("dlogits NaN pattern differs")
    for out, ref, what in ((loss, ref_loss, "losses"), (dx, ref_dx, "dlogits")):
        inf_ref = torch.isinf(ref)
        if not torch.equal(out.double()[inf_ref], ref[inf_ref]):
            problems.append(f"infinite {what} differ")
    result = {"case": case.name, "loss_err": _rel_err(loss, ref_loss), "dx_err": _rel_err(dx, ref_dx),
              "loss_l2": _l2_rel(loss, ref_loss), "dx_l2": _l2_rel(dx, ref_dx)}
    # PyTorch's fused kernel on the same inputs, where it is defined (finite
    # logits, labels in range, sparse or probabilities).
    # (PyTorch's soft-label gradient is the exact one: compare dense rows with it
    # only in that mode)
    comparable = (case.kind in ("normal", "offset") and case.rows > 0 and case.classes > 0
                  and (case.labels != "dense" or case.exact))
    if comparable:
        xt = r["x"].detach().clone().requires_grad_(True)
        target = r["labels"].long() if case.labels != "dense" else r["labels"]
        tl = F.cross_entropy(xt, target, reduction="none")
        (tdx,) = torch.autograd.grad(tl, xt, r["g"])
        t_loss_err, t_dx_err = _rel_err(tl.detach(), ref_loss), _rel_err(tdx, ref_dx)
        result.update(torch_loss_err=t_loss_err, torch_dx_err=t_dx_err,
                      torch_loss_l2=_l2_rel(tl.detach(), ref_loss), torch_dx_l2=_l2_rel(tdx, ref_dx))
        # two roundings of the output (four for float64, where PyTorch's loss
        # is computed by the very operations of the reference)
        slack = (4 if case.dtype == "float64" else 2) * OUTPUT_EPS[case.dtype]
        for ours, theirs, what in ((result["loss_l2"], result["torch_loss_l2"], "loss"),
                                   (result["dx_l2"], result["torch_dx_l2"], "dlogits")):
            if ours > 1.1 * theirs + slack:
                problems.append(f"{what} error {ours:.3g} > PyTorch's {theirs:.3g}")
    else:
        slack = 8 * OUTPUT_EPS[case.dtype] if case.dtype != "float64" else 1e-12
        tol = slack if case.kind != "offset" else slack * 1e4
        for what in ("loss_err", "dx_err"):
            if result[what] > max(tol, 1e-6 if case.dtype == "float32" else tol):
                problems.append(f"{what} {result[what]:.3g} over {tol:.3g}")
    result["problems"] = problems
    return result


def cmd_check(k: Kernels, full: bool, log: Callable[[str], None]) -> bool:
    cases = check_cases(full)
    failures = 0
    worst: dict[str, float] = {}
    for i, case in enumerate(cases):
        res = check_one(k, case, seed=1000 + i)
        key = case.dtype
        worst[key] = max(worst.get(key, 0.0), res["dx_l2"])
        if res["problems"]:
            failures += 1
            log(f"FAIL {case.name}: {res['problems']} {json.dumps({a: b for a, b in res.items() if a != 'problems'})}")
        elif "torch_loss_l2" in res and case.rows * case.classes >= 1_000_000:
            log(f"ok   {case.name}: loss l2 {res['loss_l2']:.2e} (torch {res['torch_loss_l2']:.2e}), "
                f"dx l2 {res['dx_l2']:.2e} (torch {res['torch_dx_l2']:.2e})")
    log(f"check: {len(cases) - failures}/{len(cases)} cases passed")
    return failures == 0


def _bits(t):
    import torch
    view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(view).clone()


def cmd_determinism(k: Kernels, log: Callable[[str], None], repeats: int = 100) -> bool:
    import torch
    cases = [Case(512, 1000, "float32"), Case(64, 32000, "bfloat16", "int32"),
             Case(3, 100000, "float32"), Case(33, 20000, "float16", "dense", exact=True),
             Case(9, 40000, "float32", "dense"),
             Case(16, 5000, "float64"), Case(1000, 10, "bfloat16", "dense"),
             Case(2, 262144, "bfloat16"), Case(600, 40000, "float32"),
             Case(1000, 40000, "float16", "dense", exact=True)]
    base = {}
    for i, case in enumerate(cases):
        r = run_case(k, case, seed=77 + i)
        torch.cuda.synchronize()
        base[case] = (_bits(r["loss"]), _bits(r["dx"]))
    ok = True

    def same(case, r):
        return torch.equal(_bits(r["loss"]), base[case][0]) and torch.equal(_bits(r["dx"]), base[case][1])

    for rep in range(repeats):
        for i, case in enumerate(cases):
            if not same(case, run_case(k, case, seed=77 + i)):
                ok = False
                log(f"FAIL repeat {rep}: {case.name} changed bits")
    log(f"determinism: {repeats} repeats x {len(cases)} cases: {'identical' if ok else 'DIFFERENT'}")
    streams = [torch.cuda.Stream() for _ in range(4)]
    for trial in range(10):
        results = []
        torch.cuda.synchronize()
        for j, st in enumerate(streams):  # each stream: the cases in a rotated order
            order = cases[j:] + cases[:j] if trial % 2 == 0 else list(reversed(cases[j:] + cases[:j]))
            with torch.cuda.stream(st):
                for case in order:
                    results.append((case, run_case(k, case, seed=77 + cases.index(case), stream=st)))
        torch.cuda.synchronize()
        for case, r in results:
            if not same(case, r):
                ok = False
                log(f"FAIL streams trial {trial}: {case.name} changed bits")
    log(f"determinism: 4 concurrent streams x 10 trials, rotated/reversed orders: "
        f"{'identical' if ok else 'DIFFERENT'}")
    # a row's bits do not depend on the batch around it
    for case in (Case(300, 1000, "float32"), Case(40, 70000, "bfloat16"),
                 Case(40, 3000, "float16", "dense", exact=True), Case(8, 30000, "float32", "dense", exact=True)):
        r = run_case(k, case, seed=5)
        x, labels, g = r["x"], r["labels"], r["g"]
        for row in (0, case.rows // 2, case.rows - 1):
            sub = dataclasses.replace(case, rows=1)
            dev = "cuda"
            acc = torch.float64 if case.dtype == "float64" else torch.float32
            loss = torch.empty(1, dtype=x.dtype, device=dev)
            sh = torch.empty(1, dtype=acc, device=dev)
            ln = torch.empty(1, dtype=acc, device=dev)
            dx = torch.empty(1, case.classes, dtype=x.dtype, device=dev)
            s = torch.cuda.current_stream().cuda_stream
            lab = labels[row:row + 1].contiguous()
            xr = x[row:row + 1].contiguous()
            k.forward(xr, lab, loss, sh, ln, s)
            k.grad(xr, lab, sh, ln, g[row:row + 1].contiguous(), dx, s, case.exact)
            if not (torch.equal(_bits(loss), _bits(r["loss"][row:row + 1]))
                    and torch.equal(_bits(dx), _bits(r["dx"][row:row + 1]))):
                ok = False
                log(f"FAIL {sub.name}: row {row} alone differs from the batch")
    log(f"determinism: rows alone vs in a batch: {'identical' if ok else 'DIFFERENT'}")
    return ok


def cmd_sanitize(k: Kernels, log: Callable[[str], None]) -> bool:
    import torch
    for i, case in enumerate(sanitize_cases()):
        run_case(k, case, seed=i)
    torch.cuda.synchronize()
    log(f"sanitize: {len(sanitize_cases())} cases ran")
    return True


def agree_cases() -> list[Case]:
    """Every path (warp, block, chunked; aligned or not; sparse, dense, exact) and
    the issue's long rows: what the launchers must agree on bit for bit."""
    cases = sanitize_cases()
    for dtype in DTYPES:
        cases += [Case(64, 32000, dtype, "int64"), Case(2, 1048576, dtype, "int32"),
                  Case(4, 262144, dtype, "dense", exact=True), Case(300, 1000, dtype, "dense"),
                  # chunks enough for the merge kernels (xent_launch.h: FusedMerge)
                  Case(1000, 40000, dtype, "int64"), Case(1000, 40000, dtype, "dense", exact=True)]
    return cases


def cmd_agree(kernels: dict, log: Callable[[str], None]) -> bool:
    """The same inputs through each named launcher: losses and gradients bitwise equal."""
    import torch
    names = list(kernels)
    cases = agree_cases()
    differ = 0
    for i, case in enumerate(cases):
        bits = {}
        for name in names:
            r = run_case(kernels[name], case, seed=500 + i)
            torch.cuda.synchronize()
            bits[name] = (_bits(r["loss"]), _bits(r["dx"]))
        first = bits[names[0]]
        for name in names[1:]:
            if not (torch.equal(bits[name][0], first[0]) and torch.equal(bits[name][1], first[1])):
                differ += 1
                log(f"FAIL {case.name}: {name} differs from {names[0]}")
    log(f"agree: {len(cases)} cases through {', '.join(names)}: "
        f"{'bitwise identical' if differ == 0 else f'{differ} differ'}")
    return differ == 0


def cmd_dump(k: Kernels, inputs: str, out: str, log: Callable[[str], None]) -> bool:
    """Runs the inputs of cpu_vs_gpu.py (an .npz) and writes the outputs beside `out`."""
    import torch
    data = np.load(inputs)
    results = {}
    names = sorted({key.split("/")[0] for key in data.files})
    for name in names:
        dtype = str(data[f"{name}/dtype"])
        dt = _torch_dtype(dtype)
        raw = data[f"{name}/logits"]
        if dtype in ("float16", "bfloat16"):
            x = torch.from_numpy(raw.astype(np.int16)).cuda().view(dt)
            g = torch.from_numpy(data[f"{name}/grad_loss"].astype(np.int16)).cuda().view(dt)
        else:
            x = torch.from_numpy(raw).cuda()
            g = torch.from_numpy(data[f"{name}/grad_loss"]).cuda()
        labels = torch.from_numpy(data[f"{name}/labels"]).cuda()
        b, c = x.shape
        acc = torch.float64 if dtype == "float64" else torch.float32
        loss = torch.full((b,), float("nan"), dtype=dt, device="cuda")
        sh = torch.full((b,), float("nan"), dtype=acc, device="cuda")
        ln = torch.full((b,), float("nan"), dtype=acc, device="cuda")
        dx = torch.full((b, c), float("nan"), dtype=dt, device="cuda")
        s = torch.cuda.current_stream().cuda_stream
        k.forward(x, labels, loss, sh, ln, s)
        k.grad(x, labels, sh, ln, g, dx, s)
        torch.cuda.synchronize()
        results[f"{name}/loss"] = _bits(loss).cpu().numpy()
        results[f"{name}/dlogits"] = _bits(dx).cpu().numpy()
    np.savez_compressed(out, **results)
    log(f"dump: {len(names)} inputs -> {out}")
    return True


# ---------------------------------------------------------------------------
# Speed.
def _bench(fn: Callable[[], None]) -> float:
    """Median ms per call, events around each call, L2 flushed before each."""
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=50, rep=300, return_mode="median"))


def _bench_graph(fn: Callable[[], None]) -> float | None:
    """Median ms per call replayed from a CUDA graph (no host launch gaps; L2 not
    flushed, so inputs that fit in L2 stay there); None if capture fails."""
    from triton.testing import do_bench_cudagraph
    try:
        return float(do_bench_cudagraph(fn, rep=100, return_mode="median"))
    except Exception:  # noqa: BLE001 - report the eager number alone
        return None


def cmd_speed(k: Kernels, log: Callable[[str], None], baseline: Kernels | None = None,
              others: dict | None = None, repeat: int = 1) -> list[dict]:
    """Times `k` (and `baseline`, the previous kernels, and each of `others` by
    name) against PyTorch and the copy, side by side in this one process."""
    import torch
    import torch.nn.functional as F
    rows_out = []
    for dtype in ("float32", "bfloat16"):
        for b, c in SPEED_SHAPES:
            dt = _torch_dtype(dtype)
            torch.manual_seed(0)
            x = (torch.randn(b, c, device="cuda") * 3).to(dt)
            labels = torch.randint(0, c, (b,), device="cuda")
            g = torch.ones(b, device="cuda", dtype=dt)
            loss = torch.empty(b, device="cuda", dtype=dt)
            sh = torch.empty(b, device="cuda", dtype=torch.float32)
            ln = torch.empty(b, device="cuda", dtype=torch.float32)
            dx = torch.empty_like(x)
            copy_dst = torch.empty_like(x)
            nbytes = x.numel() * x.element_size()

            def ours_fwd(kern=k):  # the current stream: graph capture runs on its own
                kern.forward(x, labels, loss, sh, ln, torch.cuda.current_stream().cuda_stream)

            def ours_fb(kern=k):
                s = torch.cuda.current_stream().cuda_stream
                kern.forward(x, labels, loss, sh, ln, s)
                kern.grad(x, labels, sh, ln, g, dx, s)

            xt = x.detach().clone().requires_grad_(True)

            def torch_fwd():
                F.cross_entropy(x, labels, reduction="none")

            def torch_fb():
                tl = F.cross_entropy(xt, labels, reduction="none")
                torch.autograd.grad(tl, xt, g)

            def copy():
                copy_dst.copy_(x)

            benches = [("copy", copy), ("ours_fwd", ours_fwd), ("ours_fb", ours_fb),
                       ("torch_fwd", torch_fwd), ("torch_fb", torch_fb)]
            if baseline is not None:
                benches += [("old_fwd", lambda: ours_fwd(baseline)),
                            ("old_fb", lambda: ours_fb(baseline))]
            for name, other in (others or {}).items():
                benches += [(f"{name}_fwd", lambda o=other: ours_fwd(o)),
                            (f"{name}_fb", lambda o=other: ours_fb(o))]
            # each variant `repeat` times, interleaved (forward, then backward
            # order), so that drift in the card's state falls on all alike
            samples: dict = {name: [] for name, _ in benches}
            for r in range(repeat):
                for name, fn in (benches if r % 2 == 0 else benches[::-1]):
                    samples[name].append(_bench(fn))
            t = {name: float(np.median(v)) for name, v in samples.items()}
            spread = {f"{name}_spread": round((max(v) - min(v)) / float(np.median(v)), 3)
                      for name, v in samples.items() if repeat > 1 and name.endswith("_fb")}
            for name, fn in (("copy_graph", copy), ("ours_fb_graph", ours_fb),
                             ("torch_fb_graph", torch_fb)):
                value = _bench_graph(fn)
                if value is not None:
                    t[name] = value
            copy_bw = 2 * nbytes / (t["copy"] * 1e-3)
            row = {"shape": f"[{b}, {c}]", "dtype": dtype, **{kk: round(v * 1000, 2) for kk, v in t.items()},
                   "copy_GBps": round(copy_bw / 1e9, 1),
                   "fwd_bw_frac": round(nbytes / (t["ours_fwd"] * 1e-3) / copy_bw, 3),
                   "fb_bw_frac": round(3 * nbytes / (t["ours_fb"] * 1e-3) / copy_bw, 3),
                   "fb_vs_3pass": round(t["ours_fb"] / (3 * nbytes / copy_bw * 1e3), 3),
                   "speedup_vs_torch_fb": round(t["torch_fb"] / t["ours_fb"], 2),
                   "repeat": repeat, **spread}
            rows_out.append(row)
            log(json.dumps(row))
    return rows_out


def speed_table(rows: list[dict]) -> str:
    head = ("| shape | dtype | copy µs | ours fwd µs | ours fwd+bwd µs | PyTorch fwd+bwd µs | "
            "fwd+bwd vs PyTorch | fwd bandwidth / copy's | fwd+bwd bandwidth / copy's | "
            "fwd+bwd / (3 passes at copy speed) |")
    if rows and "old_fb" in rows[0]:
        head += " previous kernels fwd+bwd µs |"
    standard = {"ours_fb", "torch_fb", "old_fb", "speedup_vs_torch_fb"}
    extra = [key[:-3] for key in (rows[0] if rows else {}) if key.endswith("_fb") and key not in standard]
    for name in extra:
        head += f" {name} fwd+bwd µs |"
    graphs = rows and "ours_fb_graph" in rows[0]
    if graphs:
        head += " graph replay: copy / ours fwd+bwd / PyTorch fwd+bwd µs |"
    lines = [head, "|---|---|" + "---:|" * (head.count("|") - 3)]
    for r in rows:
        line = (f"| {r['shape']} | {r['dtype']} | {r['copy']:.1f} | {r['ours_fwd']:.1f} | {r['ours_fb']:.1f} | "
                f"{r['torch_fb']:.1f} | {r['speedup_vs_torch_fb']:.2f}x | {r['fwd_bw_frac']:.2f} | "
                f"{r['fb_bw_frac']:.2f} | {r['fb_vs_3pass']:.2f} |")
        if "old_fb" in r:
            line += f" {r['old_fb']:.1f} |"
        for name in extra:
            line += f" {r[name + '_fb']:.1f} |"
        if graphs:
            line += (f" {r.get('copy_graph', float('nan')):.1f} / {r.get('ours_fb_graph', float('nan')):.1f}"
                     f" / {r.get('torch_fb_graph', float('nan')):.1f} |")
        lines.append(line)
    return "\n".join(lines)


def describe_machine() -> str:
    import torch
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], stdout=subprocess.PIPE, text=True).stdout.strip()
    except OSError:
        smi = "nvidia-smi not found"
    try:
        nvcc = subprocess.run(["nvcc", "--version"], stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-2]
    except (OSError, IndexError):
        nvcc = "?"
    import triton
    return (f"{smi}; {torch.cuda.get_device_properties(0).multi_processor_count} SMs; "
            f"torch {torch.__version__} (CUDA {torch.version.cuda}); triton {triton.__version__}; "
            f"{nvcc}; Python {platform.python_version()}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["build", "check", "determinism", "sanitize", "speed", "all",
                                         "agree", "dump", "export-cubins"])
    parser.add_argument("--launcher", choices=["runtime", "driver"], default="runtime",
                        help="runtime: the nvcc-built launchers; driver: NVRTC cubins through "
                             "the driver API, as the op library runs them (default runtime)")
    parser.add_argument("--lib", help="use this built runtime-launcher library instead of building "
                                      "one (build: write it there)")
    parser.add_argument("--driver-lib", help="use this built driver-launcher library")
    parser.add_argument("--cubins", help="driver launcher: the cubins export-cubins wrote "
                                         "(default: compile them now with NVRTC)")
    parser.add_argument("--arch", type=int, default=90, help="export-cubins: sm_<arch> (default 90)")
    parser.add_argument("--baseline", help="another xent_kernels.cu.cc to time side by side")
    parser.add_argument("--baseline-lib", help="a built harness library of other kernels to time")
    parser.add_argument("--other", action="append", default=[], metavar="NAME=LIB",
                        help="speed: also time this built runtime library (repeatable)")
    parser.add_argument("--time-driver", action="store_true",
                        help="speed: also time the driver launcher (--driver-lib, --cubins)")
    parser.add_argument("--inputs", help="dump: the .npz cpu_vs_gpu.py wrote")
    parser.add_argument("--repeat", type=int, default=1,
                        help="speed: time every variant this many times, interleaved; medians")
    parser.add_argument("--quick", action="store_true", help="check: skip the largest shapes")
    parser.add_argument("--out", help="folder for the log and results.json")
    parser.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    parser.add_argument("--define", action="append", default=[], metavar="NAME[=VALUE]",
                        help="build: also compile the runtime library with -DNAME[=VALUE] "
                             "(e.g. EQUIVTOOL_XENT_GPU_HOST_EXP; repeatable)")
    parser.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    args = parser.parse_args(argv)
    for spec in args.other:
        if "=" not in spec or not spec.split("=", 1)[0] or not spec.split("=", 1)[1]:
            parser.error(f"--other must be NAME=LIB, got {spec!r}")
    if args.mode == "dump" and not args.inputs:
        parser.error("dump needs --inputs FILE.npz")
    if args.repeat < 1:
        parser.error(f"--repeat must be a positive integer, got {args.repeat}")
    out = args.out or tempfile.mkdtemp(prefix="xent-gpu-")
    os.makedirs(out, exist_ok=True)
    log_path = os.path.join(out, f"{args.mode}-{args.launcher}.log")

    def log(msg: str) -> None:
        print(msg, flush=True)
        with open(log_path, "a") as f:
            f.write(msg + "\n")

    if args.mode == "export-cubins":
        for path in export_cubins(out, args.arch):
            log(f"wrote {path}")
        return 0

    def runtime_kernels() -> Kernels:
        lib = args.lib
        if lib is None:
            lib = os.path.join(out, "libxent_harness.so")
            t0 = time.time()
            build_library(lib, nvcc=args.nvcc)
            log(f"built {lib} in {time.time() - t0:.0f} s")
        return Kernels(lib)

    def driver_kernels(cubins_folder: str | None) -> DriverKernels:
        import torch
        lib = args.driver_lib
        if lib is None:
            lib = os.path.join(out, "libxent_driver.so")
            build_driver_library(lib, cxx=args.cxx)
        major, minor = torch.cuda.get_device_capability(0)
        if cubins_folder:
            cubins = read_cubins(cubins_folder)
        else:
            t0 = time.time()
            cubins = compile_cubins(major * 10 + minor)
            log(f"compiled the cubins for sm_{major}{minor} with {cubins[0].origin} "
                f"in {time.time() - t0:.1f} s (or read them from its cache)")
        k = DriverKernels(lib, cubins)
        log(f"driver launcher: {lib}, cubins by {', '.join(k.origin)}")
        return k

    if args.mode == "build":
        if args.launcher == "driver":
            lib = args.driver_lib or os.path.join(out, "libxent_driver.so")
            build_driver_library(lib, cxx=args.cxx)
            log(f"built {lib}")
        else:
            lib = args.lib or os.path.join(out, "libxent_harness.so")
            build_library(lib, nvcc=args.nvcc, defines=args.define)
            log(f"built {lib}")
        return 0
    k = driver_kernels(args.cubins) if args.launcher == "driver" else runtime_kernels()
    baseline = Kernels(args.baseline_lib) if args.baseline_lib else None
    if args.baseline:
        base_lib = os.path.join(out, "libxent_baseline.so")
        build_library(base_lib, kernels_source=args.baseline, nvcc=args.nvcc)
        baseline = Kernels(base_lib)
    ok = True
    if args.mode != "sanitize":
        log(describe_machine())
    if args.mode in ("check", "all"):
        ok &= cmd_check(k, full=not args.quick, log=log)
    if args.mode in ("determinism", "all"):
        ok &= cmd_determinism(k, log)
    if args.mode == "sanitize":
        ok &= cmd_sanitize(k, log)
    if args.mode == "agree":
        runtime = runtime_kernels() if args.launcher == "driver" else k
        driver = k if args.launcher == "driver" else driver_kernels(args.cubins)
        launchers = {"runtime": runtime, "driver": driver}
        if args.cubins:  # and the NVRTC found here, compiling now
            try:
                launchers["driver-here"] = driver_kernels(None)
            except RuntimeError as exc:
                log(f"agree: no cubins compiled here ({exc})")
        ok &= cmd_agree(launchers, log)
    if args.mode == "dump":
        ok &= cmd_dump(k, args.inputs, os.path.join(out, "gpu_outputs.npz"), log)
    if args.mode in ("speed", "all"):
        others = {spec.split("=", 1)[0]: Kernels(spec.split("=", 1)[1]) for spec in args.other}
        if args.time_driver and args.launcher != "driver":
            others["driver"] = driver_kernels(args.cubins)
        rows = cmd_speed(k, log, baseline, others, repeat=args.repeat)
        with open(os.path.join(out, "speed.json"), "w") as f:
            json.dump(rows, f, indent=1)
        log(speed_table(rows))
    log(f"RESULT {args.mode}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
