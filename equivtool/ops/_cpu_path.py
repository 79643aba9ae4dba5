"""Which CPU row functions the op's training step runs, for tests and benchmarks.

On a CPU with AVX-512F/BW/VL and F16C the library runs two variants of the
training step's rows (``custom_ops/xent_ops.cc``, ``CpuPath``): float16
logits converted by the hardware instead of by integer arithmetic, and, for a
fused forward whose ``[B, C]`` backprop is far larger than L2, streaming
stores of that backprop. Both are picked at run time and must give the
portable path's bits. To prove that, a test has to run both paths on the same
inputs and know that the one it asked for really ran: :func:`cpu_path` switches
them for a block (and restores the setting on every exit path) and
:func:`path_state` reads the settings and how many rows each variant wrote.

The switch is process-wide; it is not for use while other threads run the op.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import threading
from typing import Iterator

_lock = threading.Lock()
_entry = None


@dataclasses.dataclass(frozen=True)
class CpuPathState:
    """The library's CPU path: ``avx512`` whether the AVX-512 rows are in
    use, ``supported`` whether this CPU has them, ``stream_min_bytes`` the
    backprop size from which the fused forward streams, and the rows each
    variant has written in this process (``streamed_rows``: rows written
    with streaming stores, by the fused forward and by the scale op of 16-bit
    logits; ``f16c_rows``: float16 rows of either op); ``threads`` the
    thread count forced on every sharded loop (0: the pool's own), and
    ``helper_rows`` the rows that threads other than the op's caller
    computed, which tells a test that a loop really ran on several threads."""
    avx512: bool
    stream_min_bytes: int
    supported: bool
    streamed_rows: int
    f16c_rows: int
    poison: bool = False
    threads: int = 0
    helper_rows: int = 0

    def __str__(self) -> str:
        if not self.supported:
            return "portable rows (this CPU lacks AVX-512F/BW/VL or F16C)"
        if not self.avx512:
            return "portable rows (AVX-512 rows turned off)"
        return (f"AVX-512 rows: F16C conversions, streaming stores for a backprop of "
                f"{self.stream_min_bytes / 2**20:g} MiB or more")


def _call(avx512: int, stream_min_bytes: int, poison: int, threads: int = -1) -> CpuPathState:
    global _entry
    if _entry is None:
        from equivtool.ops._load import library_path, load_library

        load_library()  # checked and loaded by TensorFlow first
        fn = ctypes.CDLL(library_path()).equivtool_xent_cpu_path
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
                       ctypes.POINTER(ctypes.c_int64)]
        fn.restype = None
        _entry = fn
    out = (ctypes.c_int64 * 8)()
    _entry(avx512, stream_min_bytes, poison, threads, out)
    return CpuPathState(avx512=bool(out[0]), stream_min_bytes=int(out[1]),
                        supported=bool(out[2]), streamed_rows=int(out[3]), f16c_rows=int(out[4]),
                        poison=bool(out[5]), threads=int(out[6]), helper_rows=int(out[7]))


@dataclasses.dataclass(frozen=True)
class StepCalls:
    """How the one-pass training step's gradient op has finished in this
    process: ``handed_on`` the forward's guess held and its buffer became the
    gradient (no B x C pass), ``scaled`` a float/double buffer of
    ``softmax - onehot`` was scaled by the upstream gradient, ``recomputed``
    the gradient was recomputed from the logits."""
    handed_on: int
    scaled: int
    recomputed: int


def step_calls() -> StepCalls:
    """The one-pass step's gradient calls so far, by how each finished."""
    from equivtool.ops._load import library_path, load_library

    load_library()
    fn = ctypes.CDLL(library_path()).equivtool_xent_step_calls
    fn.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    fn.restype = None
    out = (ctypes.c_int64 * 3)()
    fn(out)
    return StepCalls(handed_on=int(out[0]), scaled=int(out[1]), recomputed=int(out[2]))


def path_state() -> CpuPathState:
    """The CPU path now in force and the rows each variant has written."""
    with _lock:
        return _call(-1, -1, -1)


@contextlib.contextmanager
def cpu_path(avx512: bool | None = None, stream_min_bytes: int | None = None,
             poison: bool | None = None, threads: int | None = None) -> Iterator[CpuPathState]:
    """Run the block with the AVX-512 rows on or off (``avx512``; on only
    where the CPU has them), with streaming from ``stream_min_bytes`` of
    backprop on (0: always), with the step's outputs poisoned or not
    (``poison``) and with every sharded loop run by exactly ``threads``
    threads (0: as many as the intra-op pool has, for work big enough);
    ``None`` leaves a setting as it is. Yields the state in force inside the
    block; the previous settings come back on exit, also after an
    exception."""
    for name, value in (("avx512", avx512), ("poison", poison)):
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"cpu_path: {name} must be True, False or None, got {value!r}.")
    if stream_min_bytes is not None and (isinstance(stream_min_bytes, bool)
                                         or not isinstance(stream_min_bytes, int)
                                         or stream_min_bytes < 0):
        raise ValueError(f"cpu_path: stream_min_bytes must be an int >= 0 or None, "
                         f"got {stream_min_bytes!r}.")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or not 0 <= threads <= 256):
        raise ValueError(f"cpu_path: threads must be an int from 0 to 256 or None, "
                         f"got {threads!r}.")
    with _lock:
        before = _call(-1 if avx512 is None else int(avx512),
                       -1 if stream_min_bytes is None else stream_min_bytes,
                       -1 if poison is None else int(poison),
                       -1 if threads is None else threads)
    try:
        yield path_state()
    finally:
        with _lock:
            _call(int(before.avx512), before.stream_min_bytes, int(before.poison),
                  before.threads)
