"""Builds the cross-entropy op library against the TensorFlow in this interpreter.

One recipe for both entry points: ``setup.py``'s ``build_ext`` (run by
``pip install --no-build-isolation -e .``) loads this file by path, and
``equivtool build-ops`` calls :func:`build_ops` after a TensorFlow upgrade.

What it does:

- compiles ``equivtool/ops/kernels/xent_ops.cc`` with g++ (C++17, -O3) and
  TensorFlow's own ``tf.sysconfig.get_compile_flags()``;
- when nvcc is found, compiles ``xent_kernels.cu.cc`` with nvcc for the GPU
  architectures TensorFlow was built for (those this nvcc still supports),
  defines ``GOOGLE_CUDA=1`` for the host file so the GPU kernels register,
  and links the CUDA runtime statically; otherwise it builds a CPU-only
  library and says so;
- links with ``tf.sysconfig.get_link_flags()`` into a private temporary
  folder beside ``output``, appends the integrity trailer (the SHA-256 of the
  image, see :func:`digest_trailer`) and renames the file into place: a
  reader never sees a half-written library, and a symlink or a stale file at
  any temporary name is never followed (the folder is new and private).

The library carries a build stamp (the TensorFlow version of the headers it
was compiled against) and the trailer; ``_load`` checks both before loading.

Environment: ``EQUIVTOOL_NVCC`` names the nvcc to use; ``EQUIVTOOL_OPS_CUDA=0``
forces a CPU-only build; ``CXX`` overrides g++.

This module must stay importable by path (setup.py has no package on
``sys.path`` yet), so it imports nothing from equivtool.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

try:  # the project rule: equivtool's environment fix before TensorFlow
    import equivtool  # noqa: F401
except ImportError:  # setup.py loads this file before the package is importable
    pass

_HERE = os.path.dirname(os.path.abspath(__file__))
# The C++/CUDA sources ship inside the package (package data), so an installed
# equivtool can rebuild its op with ``equivtool build-ops``.
SOURCE_DIR = os.path.join(_HERE, "kernels")
LIBRARY_STEM = "_xent_ops"


def default_output() -> str:
    """Where ``_load`` looks: next to this file, named like an extension module."""
    return os.path.join(_HERE, LIBRARY_STEM + sysconfig.get_config_var("EXT_SUFFIX"))


def digest_trailer(image: bytes) -> bytes:
    """The integrity trailer appended to the library image: its SHA-256 and
    size. ELF loaders ignore bytes after the image."""
    return (b"\nEQUIVTOOL_XENT_DIGEST{sha256=" + hashlib.sha256(image).hexdigest().encode()
            + b";size=" + str(len(image)).encode() + b"}\n")


def _install(staged: str, output: str) -> None:
    """Append the trailer to ``staged`` and rename it over ``output`` (os.replace
    replaces a symlink at ``output`` itself, never its target)."""
    with open(staged, "rb") as f:
        image = f.read()
    with open(staged, "ab") as f:
        f.write(digest_trailer(image))
        f.flush()
        os.fsync(f.fileno())
    os.chmod(staged, 0o755)
    os.replace(staged, output)


class BuildError(RuntimeError):
    """The op library could not be compiled; the message holds the compiler output."""


def _log(verbose: bool, message: str) -> None:
    if verbose:
        print(f"[equivtool build-ops] {message}", file=sys.stderr)


def _run(cmd: list[str], verbose: bool) -> None:
    _log(verbose, " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise BuildError(
            f"command failed with exit code {proc.returncode}:\n  {' '.join(cmd)}\n"
            f"{proc.stdout}")


def _nvcc_version(nvcc: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([nvcc, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


def find_nvcc(tf_cuda_version: str | None) -> tuple[str | None, tuple[int, int] | None, str]:
    """(nvcc path, (major, minor), note). Prefers the CUDA major TF was built with."""
    if os.environ.get("EQUIVTOOL_OPS_CUDA", "1") == "0":
        return None, None, "CUDA disabled by EQUIVTOOL_OPS_CUDA=0"
    explicit = os.environ.get("EQUIVTOOL_NVCC")
    candidates = [explicit] if explicit else []
    candidates += [shutil.which("nvcc")]
    candidates += sorted(glob.glob("/usr/local/cuda-*/bin/nvcc"), reverse=True)
    candidates += ["/usr/local/cuda/bin/nvcc"]
    found = []
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            real = os.path.realpath(path)
            version = _nvcc_version(path)
            if version and all(os.path.realpath(p) != real for p, _ in found):
                found.append((path, version))
    if not found:
        return None, None, "nvcc not found: built the CPU kernels only"
    want_major = int(tf_cuda_version.split(".")[0]) if tf_cuda_version else None
    if explicit:
        path, version = found[0]
    else:
        path, version = next(((p, v) for p, v in found if v[0] == want_major), found[0])
    note = f"nvcc {version[0]}.{version[1]} at {path}"
    if want_major is not None and version[0] != want_major:
        note += (f" (TensorFlow was built with CUDA {tf_cuda_version}; no CUDA {want_major}"
                 " nvcc found, so the kernels are compiled with this one)")
    return path, version, note


def _gencode_flags(nvcc: str, tf_archs: list[str]) -> tuple[list[str], list[str], list[str]]:
    """-gencode flags for TF's architectures that this nvcc supports."""
    try:
        listed = subprocess.run([nvcc, "--list-gpu-arch"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, timeout=60).stdout.split()
    except (OSError, subprocess.SubprocessError):
        listed = []
    supported = {a.split("_", 1)[1] for a in listed if a.startswith("compute_")}
    flags, used, dropped = [], [], []
    for arch in tf_archs or ["sm_80", "compute_90"]:
        kind, _, number = arch.partition("_")
        if supported and number not in supported:
            dropped.append(arch)
            continue
        code = f"sm_{number}" if kind == "sm" else f"compute_{number}"
        flags += ["-gencode", f"arch=compute_{number},code={code}"]
        used.append(arch)
    if not flags and supported:  # nothing of TF's list survives: PTX for the oldest
        oldest = min(supported, key=int)
        flags = ["-gencode", f"arch=compute_{oldest},code=compute_{oldest}"]
        used = [f"compute_{oldest}"]
    return flags, used, dropped


def _cudart_static(nvcc: str, version: tuple[int, int]) -> str | None:
    """libcudart_static.a of this nvcc's toolkit (nvcc may be a wrapper script)."""
    roots = [os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))]
    roots += [os.environ[v] for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    roots += [f"/usr/local/cuda-{version[0]}.{version[1]}", "/usr/local/cuda"]
    for root in roots:
        for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
            path = os.path.join(root, sub, "libcudart_static.a")
            if os.path.isfile(path):
                return path
    return None


def build_ops(output: str | None = None, verbose: bool = False) -> str:
    """Compile the op library into ``output`` (default: next to ``_load.py``).

    Returns the path written. Raises :class:`BuildError` with the compiler's
    output when a compilation fails. A CUDA compile failure is an error too
    (set ``EQUIVTOOL_OPS_CUDA=0`` to build without CUDA).
    """
    import tensorflow as tf

    output = os.path.abspath(output or default_output())
    host_source = os.path.join(SOURCE_DIR, "xent_ops.cc")
    cuda_source = os.path.join(SOURCE_DIR, "xent_kernels.cu.cc")
    if not os.path.isfile(host_source):
        raise BuildError(
            f"op sources not found at {SOURCE_DIR}: this equivtool was installed without "
            "its package data; reinstall it (pip install --no-build-isolation equivtool)")
    cxx = os.environ.get("CXX", "g++")
    compile_flags = tf.sysconfig.get_compile_flags()
    link_flags = tf.sysconfig.get_link_flags()
    build_info = dict(tf.sysconfig.get_build_info())
    common = ["-O3", "-std=c++17", "-fPIC", "-DNDEBUG", "-ffp-contract=off",
              "-Wno-deprecated-declarations",
              f"-I{SOURCE_DIR}"]

    nvcc, nvcc_version, note = (None, None, "TensorFlow was built without CUDA")
    if build_info.get("is_cuda_build"):
        nvcc, nvcc_version, note = find_nvcc(build_info.get("cuda_version"))
    _log(verbose or nvcc is None, note)

    os.makedirs(os.path.dirname(output), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="equivtool-ops-") as tmp:
        objects = []
        extra_libs: list[str] = []
        host_defines: list[str] = []
        if nvcc:
            gencode, used, dropped = _gencode_flags(nvcc, build_info.get("cuda_compute_capabilities", []))
            if dropped:
                _log(True, f"nvcc {nvcc_version[0]}.{nvcc_version[1]} cannot target "
                           f"{', '.join(dropped)} (in TensorFlow's list); skipped")
            cuda_obj = os.path.join(tmp, "xent_kernels.o")
            _run([nvcc, "-x", "cu", "-std=c++17", "-O3", "--fmad=false", "-DNDEBUG",
                  "-Xcompiler", "-fPIC", "-D_GLIBCXX_USE_CXX11_ABI=1", f"-I{SOURCE_DIR}",
                  *gencode, "-c", cuda_source, "-o", cuda_obj], verbose)
            objects.append(cuda_obj)
            cudart = _cudart_static(nvcc, nvcc_version)
            if cudart is None:
                raise BuildError(f"libcudart_static.a not found next to {nvcc}")
            extra_libs = [cudart, "-ldl", "-lrt", "-lpthread"]
            host_defines = [
                "-DGOOGLE_CUDA=1",
                f'-DEQUIVTOOL_XENT_NVCC_VERSION="{nvcc_version[0]}.{nvcc_version[1]}"',
                f'-DEQUIVTOOL_XENT_CUDA_ARCHS="{",".join(used)}"',
            ]
        host_defines.append(f'-DEQUIVTOOL_XENT_TF_VERSION="{tf.__version__}"')
        host_obj = os.path.join(tmp, "xent_ops.o")
        _run([cxx, *common, *compile_flags, *host_defines, "-c", host_source,
              "-o", host_obj], verbose)
        objects.insert(0, host_obj)
        # a new private folder in output's own folder: same file system, so the
        # final rename is atomic, and no name in it can be pre-planted
        private = tempfile.mkdtemp(prefix=".equivtool-build-", dir=os.path.dirname(output))
        try:
            staged = os.path.join(private, os.path.basename(output))
            _run([cxx, "-shared", "-o", staged, *objects, *link_flags, *extra_libs], verbose)
            _install(staged, output)
        finally:
            shutil.rmtree(private, ignore_errors=True)
    _log(verbose, f"wrote {output} ({'CPU + CUDA' if nvcc else 'CPU only'})")
    return output
