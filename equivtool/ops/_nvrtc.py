"""The op's CUDA kernels compiled at run time by NVRTC, cached on disk.

No ``nvcc`` is needed for GPU support: ``tensorflow[and-cuda]`` installs
CUDA 12's NVRTC as a wheel (``nvidia-cuda-nvrtc-cu12``). At the op's first
use on a GPU, :func:`kernel_images` compiles ``custom_ops/xent_device.cuh``
(the very text the GPU harness compiles with nvcc) to a cubin for the
device's architecture, one per logits type, and the op library loads it with
the CUDA driver API (``xent_ops.cc``), linking no CUDA runtime: the driver
floor is the NVRTC's (CUDA 12: R525+).

Why Python (ctypes over ``libnvrtc``) rather than C++: compiling, naming the
kernels and caching are file and string work, testable without a GPU (the
tests compile real cubins here); the C++ op only receives bytes and names.

The cache (``$EQUIVTOOL_CACHE_DIR``, else ``$XDG_CACHE_HOME/equivtool`` or
``~/.cache/equivtool``, folder ``kernels/``) holds one file per source hash,
architecture, logits type and NVRTC version. Each entry carries the SHA-256
of its cubin and the key it was compiled for; an entry that fails either
check (truncated, damaged, a stale format) is recompiled, never loaded.
Entries are written to a temporary file in the cache folder and renamed into
place (a reader never sees half a file; ``os.replace`` replaces a symlink at
the destination, never its target), and a per-entry lock file
(``fcntl.flock``) makes a second process wait for the first one's compile
instead of doing it again.

This module imports neither TensorFlow nor the op library.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import fcntl
import glob
import hashlib
import importlib.util
import json
import os
import struct
import threading

from equivtool._base.render import write_bytes_atomic
from equivtool.ops._build import SOURCE_DIR

# The files NVRTC compiles (the program text only includes the first).
DEVICE_SOURCES = ("xent_device.cuh", "xent_plan.h", "xent_row.h")
# The harness's nvcc flags (_build.NVCC_FLAGS) in NVRTC's spelling.
NVRTC_OPTIONS = ("-std=c++17", "--fmad=false", "--ftz=true", "-DNDEBUG")

# Logits types: the key the op library uses, the C++ storage type.
DTYPES = {"float16": "equivtool_xent::half_bits", "bfloat16": "equivtool_xent::bf16_bits",
          "float32": "float", "float64": "double"}
LABELS = {"int32": "int", "int64": "long"}  # int64_t on LP64 Linux, as in xent_row.h
THREADS = (32, 256)  # a warp per row, a block per chunk (xent_plan.h)

_NS = "equivtool_xent::gpu::"
_CACHE_MAGIC = b"EQUIVTOOL-CUBIN-1\n"


class NvrtcError(RuntimeError):
    """NVRTC is missing, or it failed to compile the kernels (with its log)."""


def kernel_names(dtype: str) -> dict[str, str]:
    """key -> C++ name expression of every kernel instantiation of one logits type.

    Keys read ``SparseForward:float32:int64:32`` (kernel, logits, labels,
    threads per row chunk); the op library looks kernels up by these keys
    (``KernelKey`` in ``custom_ops/xent_launch.h`` spells them the same).
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    s = DTYPES[dtype]
    names = {}
    for label, l_type in LABELS.items():
        for t in THREADS:
            names[f"SparseForward:{dtype}:{label}:{t}"] = f"SparseForwardKernel<{s}, {l_type}, {t}>"
            names[f"SparseGrad:{dtype}:{label}:{t}"] = f"SparseGradKernel<{s}, {l_type}, {t}>"
        names[f"SparseMerge:{dtype}:{label}"] = f"SparseMergeKernel<{s}, {l_type}>"
    for t in THREADS:
        names[f"DenseForward:{dtype}:{t}"] = f"DenseForwardKernel<{s}, {t}>"
        names[f"DenseGrad:{dtype}:{t}"] = f"DenseGradKernel<{s}, {t}>"
    names[f"DenseMerge:{dtype}"] = f"DenseMergeKernel<{s}>"
    names[f"LabelSum:{dtype}"] = f"LabelSumKernel<{s}>"
    names[f"LabelSumMerge:{dtype}"] = f"LabelSumMergeKernel<{s}>"
    return {key: f"&{_NS}{expr}" for key, expr in names.items()}


def _arch_number(arch) -> int:
    """80 from ``"sm_80"``, ``"8.0"``, ``(8, 0)`` or 80."""
    if isinstance(arch, tuple) and len(arch) == 2:
        return int(arch[0]) * 10 + int(arch[1])
    text = str(arch).strip()
    if text.startswith("sm_") and text[3:].isdigit():
        return int(text[3:])
    if "." in text and text.replace(".", "", 1).isdigit():
        major, minor = text.split(".")
        return int(major) * 10 + int(minor)
    if text.isdigit():
        return int(text)
    raise ValueError(f"arch must be like 'sm_90', '9.0', (9, 0) or 90, got {arch!r}")


# ---------------------------------------------------------------------------
# Finding and calling libnvrtc.

def _wheel_nvrtc_dirs() -> list[str]:
    """lib/ of the ``nvidia-cuda-nvrtc-cu12`` wheel (``nvidia.cuda_nvrtc``)."""
    try:
        spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    except (ImportError, ValueError):
        return []
    locations = list(spec.submodule_search_locations or []) if spec else []
    return [os.path.join(p, "lib") for p in locations]


def nvrtc_candidates() -> list[str]:
    """Where NVRTC is looked for, in order: ``EQUIVTOOL_NVRTC`` (a path to
    libnvrtc), the CUDA 12 wheel, CUDA 12 installs, then any CUDA install.
    CUDA 12 comes first: its cubins load on R525+ drivers, TensorFlow's floor."""
    explicit = os.environ.get("EQUIVTOOL_NVRTC")
    if explicit:
        return [explicit]
    found = []
    for lib in _wheel_nvrtc_dirs():
        found += sorted(glob.glob(os.path.join(lib, "libnvrtc.so.12")))
    for root in sorted(glob.glob("/usr/local/cuda-12*"), reverse=True):
        found += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so.12")))
    for root in [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"] \
            + sorted(glob.glob("/usr/local/cuda-*"), reverse=True):
        if root:
            found += sorted(glob.glob(os.path.join(root, "lib64", "libnvrtc.so.*[0-9]")))
    return list(dict.fromkeys(p for p in found if os.path.isfile(p)))


class Nvrtc:
    """A loaded libnvrtc: its version, architectures, and :meth:`compile`."""

    def __init__(self, path: str):
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as exc:
            raise NvrtcError(f"cannot load NVRTC from {path}: {exc}") from exc
        self.path = path
        lib = self._lib
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
        lib.nvrtcGetLoweredName.argtypes = [ctypes.c_void_p, ctypes.c_char_p,
                                            ctypes.POINTER(ctypes.c_char_p)]
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)
        count = ctypes.c_int()
        self._check(lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)), "nvrtcGetNumSupportedArchs")
        archs = (ctypes.c_int * count.value)()
        self._check(lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
        self.archs = tuple(archs)

    def __repr__(self) -> str:
        return f"NVRTC {self.version[0]}.{self.version[1]} ({self.path})"

    def _check(self, result: int, what: str, log: str = "") -> None:
        if result != 0:
            text = self._lib.nvrtcGetErrorString(result).decode(errors="replace")
            raise NvrtcError(f"{what} failed: {text}" + (f"\n{log}" if log else ""))

    def compile(self, source: str, headers: dict[str, str], arch: int,
                name_expressions: list[str], options=NVRTC_OPTIONS) -> tuple[bytes, dict[str, str]]:
        """(cubin, name expression -> lowered name) for ``sm_<arch>``."""
        if arch not in self.archs:
            raise NvrtcError(f"NVRTC {self.version[0]}.{self.version[1]} cannot compile for "
                             f"sm_{arch} (it supports {', '.join(f'sm_{a}' for a in self.archs)})")
        lib = self._lib
        prog = ctypes.c_void_p()
        names = [n.encode() for n in headers]
        texts = [t.encode() for t in headers.values()]
        self._check(lib.nvrtcCreateProgram(
            ctypes.byref(prog), source.encode(), b"xent_nvrtc.cu", len(names),
            (ctypes.c_char_p * len(texts))(*texts), (ctypes.c_char_p * len(names))(*names)),
            "nvrtcCreateProgram")
        try:
            for expr in name_expressions:
                self._check(lib.nvrtcAddNameExpression(prog, expr.encode()), "nvrtcAddNameExpression")
            opts = [f"--gpu-architecture=sm_{arch}".encode()] + [o.encode() for o in options]
            result = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            self._check(result, f"compiling the kernels for sm_{arch}", self._log(prog))
            size = ctypes.c_size_t()
            self._check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
            cubin = ctypes.create_string_buffer(size.value)
            self._check(lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
            lowered = {}
            for expr in name_expressions:
                name = ctypes.c_char_p()
                self._check(lib.nvrtcGetLoweredName(prog, expr.encode(), ctypes.byref(name)),
                            f"nvrtcGetLoweredName({expr})")
                lowered[expr] = name.value.decode()
            return cubin.raw, lowered
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _log(self, prog) -> str:
        size = ctypes.c_size_t()
        if self._lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)) != 0 or size.value <= 1:
            return ""
        log = ctypes.create_string_buffer(size.value)
        self._lib.nvrtcGetProgramLog(prog, log)
        return log.value.decode(errors="replace")


_found: dict[str, Nvrtc] = {}
_found_lock = threading.Lock()


def find_nvrtc() -> Nvrtc | None:
    """The first NVRTC of :func:`nvrtc_candidates` that loads, or None."""
    with _found_lock:
        for path in nvrtc_candidates():
            if path not in _found:
                try:
                    _found[path] = Nvrtc(path)
                except NvrtcError:
                    continue
            return _found[path]
    return None


# ---------------------------------------------------------------------------
# Sources, keys and the cache.

def device_sources(source_dir: str | None = None) -> dict[str, str]:
    """The header texts NVRTC compiles, by include name."""
    folder = source_dir or SOURCE_DIR
    texts = {}
    for name in DEVICE_SOURCES:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            texts[name] = f.read()
    return texts


def program(dtype: str) -> str:
    return f'// equivtool cross-entropy kernels, {dtype} logits\n#include "{DEVICE_SOURCES[0]}"\n'


def source_hash(headers: dict[str, str], options=NVRTC_OPTIONS) -> str:
    """SHA-256 over the sources and the options (the kernel set is per type)."""
    digest = hashlib.sha256()
    for name in sorted(headers):
        digest.update(name.encode() + b"\0" + headers[name].encode() + b"\0")
    digest.update("\0".join(options).encode())
    return digest.hexdigest()


def cache_dir() -> str:
    root = os.environ.get("EQUIVTOOL_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "equivtool")
    return os.path.join(root, "kernels")


@dataclasses.dataclass(frozen=True)
class KernelImage:
    """One compiled cubin: the kernels of one logits type for one architecture.

    ``names``: the op's kernel key -> the cubin's (lowered) function name;
    ``source``: where it came from this time (``"cache"``, ``"compiled"``, or
    ``"compiled, not cached (<why>)"`` where the cache folder is not writable).
    """
    dtype: str
    arch: int
    nvrtc: tuple
    source_hash: str
    cubin: bytes
    names: dict
    path: str
    source: str

    def __str__(self) -> str:
        return (f"{self.dtype} kernels for sm_{self.arch}: {len(self.cubin)} bytes, "
                f"{len(self.names)} kernels, NVRTC {self.nvrtc[0]}.{self.nvrtc[1]}, "
                f"{self.source} ({self.path})")


def entry_path(folder: str, digest: str, dtype: str, arch: int, version: tuple) -> str:
    return os.path.join(folder, f"xent-{digest[:16]}-{dtype}-sm_{arch}"
                                f"-nvrtc{version[0]}.{version[1]}.cubin")


def _pack(header: dict, cubin: bytes) -> bytes:
    header = dict(header, sha256=hashlib.sha256(cubin).hexdigest(), size=len(cubin))
    text = json.dumps(header, sort_keys=True).encode()
    return _CACHE_MAGIC + struct.pack("<I", len(text)) + text + cubin


def _unpack(data: bytes, want: dict) -> tuple[bytes, dict] | None:
    """(cubin, names) of a cache entry written for ``want``, or None when the
    entry is damaged, of another format, or for another key."""
    try:
        if not data.startswith(_CACHE_MAGIC):
            return None
        pos = len(_CACHE_MAGIC)
        length, = struct.unpack_from("<I", data, pos)
        header = json.loads(data[pos + 4:pos + 4 + length])
        cubin = data[pos + 4 + length:]
    except (struct.error, ValueError):
        return None
    if not isinstance(header, dict) or any(header.get(k) != v for k, v in want.items()):
        return None
    if header.get("size") != len(cubin) or header.get("sha256") != hashlib.sha256(cubin).hexdigest():
        return None
    names = header.get("names")
    return (cubin, names) if isinstance(names, dict) else None


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def kernel_image(dtype: str, arch, nvrtc: Nvrtc | None = None, folder: str | None = None,
                 source_dir: str | None = None) -> KernelImage:
    """The cubin of ``dtype``'s kernels for ``arch``: from the cache, or compiled
    by NVRTC and cached. Raises :class:`NvrtcError` when no NVRTC is found or
    the compile fails."""
    arch = _arch_number(arch)
    names = kernel_names(dtype)
    nvrtc = nvrtc or find_nvrtc()
    if nvrtc is None:
        raise NvrtcError("no NVRTC found (install nvidia-cuda-nvrtc-cu12, as "
                         "`pip install tensorflow[and-cuda]` does, or set EQUIVTOOL_NVRTC "
                         "to a libnvrtc.so)")
    headers = device_sources(source_dir)
    digest = source_hash(headers)
    folder = folder or cache_dir()
    path = entry_path(folder, digest, dtype, arch, nvrtc.version)
    want = {"dtype": dtype, "arch": arch, "nvrtc": list(nvrtc.version), "source_hash": digest,
            "kernels": sorted(names)}

    def image(cubin, lowered, how):
        return KernelImage(dtype=dtype, arch=arch, nvrtc=nvrtc.version, source_hash=digest,
                           cubin=cubin, names=lowered, path=path, source=how)

    def compile_now():
        cubin, lowered = nvrtc.compile(program(dtype), headers, arch, list(names.values()))
        return cubin, {key: lowered[expr] for key, expr in names.items()}

    try:
        os.makedirs(folder, exist_ok=True)
        lock = open(path + ".lock", "a")
    except OSError as exc:  # a read-only or missing home: compile, cache nothing
        cubin, by_key = compile_now()
        return image(cubin, by_key, f"compiled, not cached ({exc.strerror or exc})")
    with lock:  # one compile per entry across processes
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            data = _read(path)
            cached = _unpack(data, want) if data is not None else None
            if cached is not None:
                return image(cached[0], cached[1], "cache")
            cubin, by_key = compile_now()
            try:
                write_bytes_atomic(path, _pack(dict(want, names=by_key), cubin))
            except OSError as exc:
                return image(cubin, by_key, f"compiled, not cached ({exc.strerror or exc})")
            return image(cubin, by_key, "compiled")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def kernel_images(arch, nvrtc: Nvrtc | None = None, folder: str | None = None,
                  dtypes=tuple(DTYPES)) -> list[KernelImage]:
    """Every logits type's cubin for ``arch``, compiled in parallel (NVRTC
    releases the interpreter lock; each type is its own program)."""
    nvrtc = nvrtc or find_nvrtc()
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(dtypes)) as pool:
        return list(pool.map(lambda d: kernel_image(d, arch, nvrtc, folder), dtypes))


def cached_entries(folder: str | None = None) -> list[str]:
    """Names of the cache's entries (for ``equivtool doctor``)."""
    folder = folder or cache_dir()
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "xent-*.cubin")))


# ---------------------------------------------------------------------------
# What a cubin holds: its architecture and each kernel's resource use, read
# from the ELF (no CUDA tools needed): the architecture from the ELF flags,
# registers and the per-thread stack frame (where spills and local arrays
# live) from the .nv.info attributes, static shared memory from the kernel's
# .nv.shared section.

_EIATTR_FRAME_SIZE, _EIATTR_MAX_STACK_SIZE, _EIATTR_REGCOUNT = 0x11, 0x23, 0x2F
_EIATTR_KPARAM_INFO = 0x17  # per kernel: index, ordinal, offset, size << 18 | flags


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """One kernel's resource use: registers per thread, stack frame and
    largest stack in bytes per thread (0 = nothing spilled to local
    memory), static shared memory in bytes per block (the section's size),
    and the size in bytes of each parameter, in order (what a driver-API
    launch must pass)."""
    registers: int
    frame_bytes: int
    stack_bytes: int
    shared_bytes: int
    param_sizes: tuple = ()

    def __str__(self) -> str:
        return (f"{self.registers} registers, frame {self.frame_bytes} B, stack "
                f"{self.stack_bytes} B, shared {self.shared_bytes} B")


@dataclasses.dataclass(frozen=True)
class CubinInfo:
    """A cubin's architecture (``sm_90`` -> 90) and its kernels' resources."""
    arch: int
    kernels: dict

    def __str__(self) -> str:
        lines = [f"sm_{self.arch}, {len(self.kernels)} kernels"]
        lines += [f"  {name}: {res}" for name, res in sorted(self.kernels.items())]
        return "\n".join(lines)


def _cubin_arch(data: bytes) -> int:
    flags, = struct.unpack_from("<I", data, 0x30)
    if data[7] == 0x33 and data[8] == 7:  # CUDA OS/ABI, version 7: SM in the low byte
        return flags & 0xFF
    if data[7] == 0x41 and data[8] == 8:  # the newer CUDA OS/ABI (nvcc 13): bits 8-15
        return (flags >> 8) & 0xFF
    raise ValueError(f"not a cubin of a known CUDA ELF ABI (OS/ABI {data[7]:#x}, "
                     f"version {data[8]})")


def _nv_info(blob: bytes):
    """(attribute, payload) of each entry of a .nv.info section."""
    pos = 0
    while pos + 4 <= len(blob):
        fmt, attr, value = struct.unpack_from("<BBH", blob, pos)
        pos += 4
        if fmt == 4:  # EIFMT_SVAL: value is the payload size
            yield attr, blob[pos:pos + value]
            pos += value
        else:
            yield attr, struct.pack("<H", value)


def cubin_info(cubin: bytes) -> CubinInfo:
    """Read a cubin's architecture and its kernels' registers, stack and shared memory."""
    from equivtool.ops._build import elf_section_table

    table = elf_section_table(cubin)
    by_name = {entry[0]: entry for entry in table}
    symtab = by_name[".symtab"]
    strtab_off = table[symtab[3]][1]
    symbols = []
    for i in range(symtab[2] // (symtab[5] or 24)):
        name, = struct.unpack_from("<I", cubin, symtab[1] + i * (symtab[5] or 24))
        end = cubin.index(b"\0", strtab_off + name)
        symbols.append(cubin[strtab_off + name:end].decode(errors="replace"))
    attrs: dict[str, dict[int, int]] = {}
    if ".nv.info" in by_name:
        _, off, size, *_ = by_name[".nv.info"]
        for attr, payload in _nv_info(cubin[off:off + size]):
            if attr in (_EIATTR_FRAME_SIZE, _EIATTR_MAX_STACK_SIZE, _EIATTR_REGCOUNT) \
                    and len(payload) == 8:
                sym, value = struct.unpack("<II", payload)
                attrs.setdefault(symbols[sym], {})[attr] = value
    kernels = {}
    for name, *_ in table:
        if not name.startswith(".text."):
            continue
        fn = name[len(".text."):]
        own = attrs.get(fn, {})
        if _EIATTR_REGCOUNT not in own:
            raise ValueError(f"{fn}: no register count in the cubin's .nv.info")
        shared = by_name.get(".nv.shared." + fn)
        params = {}
        if ".nv.info." + fn in by_name:
            _, off, size, *_ = by_name[".nv.info." + fn]
            for attr, payload in _nv_info(cubin[off:off + size]):
                if attr == _EIATTR_KPARAM_INFO and len(payload) >= 12:
                    _index, ordinal, _offset, flags = struct.unpack_from("<IHHI", payload)
                    params[ordinal] = (flags >> 18) & 0x3FFF
        kernels[fn] = KernelResources(param_sizes=tuple(params[i] for i in sorted(params)),
                                      registers=own[_EIATTR_REGCOUNT],
                                      frame_bytes=own.get(_EIATTR_FRAME_SIZE, 0),
                                      stack_bytes=own.get(_EIATTR_MAX_STACK_SIZE, 0),
                                      shared_bytes=shared[2] if shared else 0)
    return CubinInfo(arch=_cubin_arch(cubin), kernels=kernels)
