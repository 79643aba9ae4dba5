"""Where the op's GPU kernels come from, and switching the run-time ones on.

The library (built with a C++ compiler alone) has CPU kernels and, for the
GPU, a driver-API launcher (``custom_ops/xent_driver.h``). When the library loads and
TensorFlow sees GPUs, :func:`enable` compiles the kernels for each GPU's
architecture with NVRTC (``_nvrtc``, cached on disk), hands the cubins to
the library and registers its GPU kernels. Without a driver or NVRTC it says
so once (a ``RuntimeWarning``) and the op runs on the CPU: TensorFlow places
an op that has no GPU kernel on the CPU.

Never raises: a GPU that cannot be used is a reason, not an error.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import warnings

_lock = threading.Lock()
_warned = False


@dataclasses.dataclass(frozen=True)
class GpuKernels:
    """Where the GPU kernels come from: ``"nvrtc"`` (compiled at run time) or
    ``"none"`` (with ``reason``); the NVRTC used, the architectures enabled
    and the driver's CUDA version, where known."""
    source: str
    reason: str = ""
    nvrtc: str = ""
    archs: tuple = ()
    driver: str = ""

    def __str__(self) -> str:
        parts = []
        if self.source == "nvrtc":
            parts.append(f"compiled at run time by {self.nvrtc} for "
                         f"{', '.join(f'sm_{a}' for a in self.archs)}")
        else:
            parts.append(f"none ({self.reason})")
            if self.nvrtc:
                parts.append(f"NVRTC: {self.nvrtc}")
        if self.driver:
            parts.append(f"driver CUDA {self.driver}")
        return "; ".join(parts)


def visible_archs() -> list[int]:
    """Compute capabilities (80 for 8.0) of the GPUs TensorFlow sees."""
    import tensorflow as tf

    archs = []
    for device in tf.config.list_physical_devices("GPU"):
        capability = tf.config.experimental.get_device_details(device).get("compute_capability")
        if capability:
            archs.append(int(capability[0]) * 10 + int(capability[1]))
    return sorted(set(archs))


def _entry_points(path: str):
    lib = ctypes.CDLL(path)  # the handle TensorFlow's load_op_library opened
    lib.equivtool_xent_driver_error.restype = ctypes.c_char_p
    lib.equivtool_xent_add_cubin.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                                             ctypes.c_char_p]
    return lib


def driver_state(path: str) -> tuple[str, str]:
    """(driver CUDA version like ``"12.4"`` or "", why the driver is unusable or "")
    as the op library sees it (it opens libcuda itself)."""
    lib = _entry_points(path)
    error = lib.equivtool_xent_driver_error().decode(errors="replace")
    version = lib.equivtool_xent_driver_version()
    return (f"{version // 1000}.{version % 1000 // 10}" if version else ""), error


def _say_once(reason: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"equivtool's cross-entropy op runs on the CPU, not on the GPU: {reason}",
                      RuntimeWarning, stacklevel=3)


def enable(path: str, archs: list[int] | None = None) -> GpuKernels:
    """Compile, hand over and register the run-time GPU kernels of the op
    library at ``path`` (already loaded by TensorFlow) for ``archs`` (default:
    the GPUs TensorFlow sees). Returns where the GPU kernels come from."""
    from equivtool.ops import _nvrtc

    with _lock:
        try:
            archs = visible_archs() if archs is None else archs
            nvrtc = _nvrtc.find_nvrtc()
            nvrtc_text = repr(nvrtc) if nvrtc else ""
            if not archs:
                return GpuKernels(source="none", reason="no GPU visible to TensorFlow",
                                  nvrtc=nvrtc_text)
            driver, error = driver_state(path)
            if error:
                _say_once(error)
                return GpuKernels(source="none", reason=error, nvrtc=nvrtc_text, driver=driver)
            if nvrtc is None:
                reason = ("no NVRTC found (pip install nvidia-cuda-nvrtc-cu12, which "
                          "`pip install tensorflow[and-cuda]` installs)")
                _say_once(reason)
                return GpuKernels(source="none", reason=reason, driver=driver)
            lib = _entry_points(path)
            for arch in archs:
                for image in _nvrtc.kernel_images(arch, nvrtc):
                    names = "\n".join(f"{k}={v}" for k, v in sorted(image.names.items()))
                    added = lib.equivtool_xent_add_cubin(arch, image.cubin, len(image.cubin),
                                                         names.encode())
                    if added != len(image.names):
                        raise _nvrtc.NvrtcError(f"the op library refused the cubin {image.path}")
            if lib.equivtool_xent_enable_gpu() < 0:
                raise _nvrtc.NvrtcError("the op library could not register its GPU kernels")
            return GpuKernels(source="nvrtc", nvrtc=nvrtc_text, archs=tuple(archs), driver=driver)
        except Exception as exc:  # noqa: BLE001 - the CPU kernels still serve
            reason = f"{type(exc).__name__}: {exc}"
            _say_once(reason)
            return GpuKernels(source="none", reason=reason)


def describe_gpu(path: str) -> str:
    """One line for ``equivtool doctor``: where the GPU kernels come from, which
    NVRTC, the architectures in the cache, the driver. Loads nothing new."""
    from equivtool.ops import _nvrtc

    nvrtc = _nvrtc.find_nvrtc()
    cached = sorted({name.split("-")[3] for name in _nvrtc.cached_entries()
                     if len(name.split("-")) > 4}, key=lambda a: int(a[3:]))
    parts = [f"run time (NVRTC, driver API): {repr(nvrtc) if nvrtc else 'no NVRTC found'}",
             f"cached {', '.join(cached) or 'none'} in {_nvrtc.cache_dir()}"]
    try:
        driver, error = driver_state(path)
        parts.append(f"driver CUDA {driver}" if driver else error)
    except OSError as exc:
        parts.append(f"driver unknown ({exc})")
    return "; ".join(parts)
