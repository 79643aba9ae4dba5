"""Builds the cross-entropy op library against the TensorFlow in this interpreter.

One recipe for both entry points: ``setup.py``'s ``build_ext`` (run by
``pip install --no-build-isolation -e .``) loads this file by path, and
``equivtool build-ops`` calls :func:`build_ops` after a TensorFlow upgrade.

What it does:

- compiles ``xent_ops.cc`` from :data:`SOURCE_DIR` with g++ (C++17, -O3) and
  TensorFlow's own ``tf.sysconfig.get_compile_flags()``: the CPU kernels and
  the GPU kernels' host side, which launches the CUDA kernels through the
  driver API once NVRTC has compiled them at run time (``_nvrtc``, ``_gpu``);
  no CUDA toolkit is needed here and none is linked in;
- links with ``tf.sysconfig.get_link_flags()`` into a private temporary
  folder beside ``output``, appends the integrity trailer (the SHA-256 of the
  image, see :func:`digest_trailer`) and renames the file into place: a
  reader never sees a half-written library, and a symlink or a stale file at
  any temporary name is never followed (the folder is new and private).

No kernel is compiled ahead of time with nvcc any more (issue 39): on an
H200 the NVRTC cubins gave the nvcc build's bits on every case and its
times within noise, for 0.3 to 0.6 µs more host time per forward and
backward, while nvcc added about 80 s to every build and a statically linked
CUDA runtime.
:data:`NVCC_FLAGS` stays: the standalone GPU harness (``benchmarks/gpu/``)
still builds the same kernels with nvcc, as a second compiler to agree with.

The library carries a build stamp (the TensorFlow version of the headers it
was compiled against) and the trailer; ``_load`` checks both before loading.

Environment: ``CXX`` overrides g++.

This module must stay importable by path (setup.py has no package on
``sys.path`` yet), so it imports nothing from equivtool.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile

try:  # the project rule: equivtool's environment fix before TensorFlow
    import equivtool  # noqa: F401
except ImportError:  # setup.py loads this file before the package is importable
    pass

_HERE = os.path.dirname(os.path.abspath(__file__))


def _source_dir() -> str:
    """The op's C++/CUDA sources: the repository's top-level ``custom_ops/``
    in a source checkout (editable install, setup.py), or the copy an installed
    package carries as ``equivtool/ops/kernels`` (package data, mapped from
    ``custom_ops/`` by setup.py), so that ``equivtool build-ops`` works there."""
    installed = os.path.join(_HERE, "kernels")
    checkout = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "custom_ops")
    return installed if os.path.isfile(os.path.join(installed, "xent_ops.cc")) else checkout


SOURCE_DIR = _source_dir()
LIBRARY_STEM = "_xent_ops"


def default_output() -> str:
    """Where ``_load`` looks: next to this file, named like an extension module."""
    return os.path.join(_HERE, LIBRARY_STEM + sysconfig.get_config_var("EXT_SUFFIX"))


# nvcc flags of the CUDA kernels (the GPU harness in benchmarks/gpu/; NVRTC's
# options in _nvrtc spell the same): no contraction into FMA (the CPU build
# uses -ffp-contract=off) and float denormals flushed to zero (the CPU
# kernels flush them in every shard).
NVCC_FLAGS = ["-std=c++17", "-O3", "--fmad=false", "-ftz=true", "-DNDEBUG",
              "-D_GLIBCXX_USE_CXX11_ABI=1"]


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


def build_ops(output: str | None = None, verbose: bool = False) -> str:
    """Compile the op library into ``output`` (default: next to ``_load.py``).

    Returns the path written. Raises :class:`BuildError` with the compiler's
    output when the compilation fails.
    """
    import tensorflow as tf

    output = os.path.abspath(output or default_output())
    host_source = os.path.join(SOURCE_DIR, "xent_ops.cc")
    if not os.path.isfile(host_source):
        raise BuildError(
            f"op sources not found at {SOURCE_DIR}: this equivtool was installed without "
            "its package data; reinstall it (pip install --no-build-isolation equivtool)")
    cxx = os.environ.get("CXX", "g++")
    compile_flags = tf.sysconfig.get_compile_flags()
    link_flags = tf.sysconfig.get_link_flags()
    common = ["-O3", "-std=c++17", "-fPIC", "-DNDEBUG", "-ffp-contract=off",
              "-Wno-deprecated-declarations",
              f"-I{SOURCE_DIR}"]

    os.makedirs(os.path.dirname(output), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="equivtool-ops-") as tmp:
        host_defines = [f'-DEQUIVTOOL_XENT_TF_VERSION="{tf.__version__}"']
        host_obj = os.path.join(tmp, "xent_ops.o")
        _run([cxx, *common, *compile_flags, *host_defines, "-c", host_source,
              "-o", host_obj], verbose)
        # a new private folder in output's own folder: same file system, so the
        # final rename is atomic, and no name in it can be pre-planted
        private = tempfile.mkdtemp(prefix=".equivtool-build-", dir=os.path.dirname(output))
        try:
            staged = os.path.join(private, os.path.basename(output))
            _run([cxx, "-shared", "-o", staged, host_obj, *link_flags], verbose)
            _install(staged, output)
        finally:
            shutil.rmtree(private, ignore_errors=True)
    _log(verbose, f"wrote {output} (CPU kernels; GPU kernels by NVRTC at run time)")
    return output


# ---------------------------------------------------------------------------
# ELF (the cubin reader in _nvrtc uses it).

def elf_section_table(data: bytes) -> list[tuple[str, int, int, int, int, int]]:
    """(name, offset, size, link, info, entsize) of each section of a
    little-endian ELF64 file (a shared library or a cubin)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = []
    for i in range(shnum):
        name, _type, _flags, _addr, off, size, link, info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", data, shoff + i * shentsize)
        headers.append((name, off, size, link, info, entsize))
    str_off = headers[shstrndx][1]
    table = []
    for name, off, size, link, info, entsize in headers:
        end = data.index(b"\0", str_off + name)
        table.append((data[str_off + name:end].decode(), off, size, link, info, entsize))
    return table
