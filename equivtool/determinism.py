"""Is a step reproducible? Run it several times from the same state and compare bits.

Why this exists
---------------
An equivalence check between a TF1 graph and its TF2 port means little when
either side does not even reproduce itself: the difference you chase may be
run-to-run noise. ``audit_determinism(fn)`` runs ``fn`` (a forward pass or a
training step: eager code, a ``tf.function``, or a function running a TF1
graph) ``runs`` times from the same starting state, compares every returned
value and every variable afterwards *bitwise*, and names the usual causes it
can see:

``unseeded_random_op``
    a stateful random op (``tf.random.uniform``, ``tf.nn.dropout``, an
    initializer ...) created with no op seed while no global seed was set: it
    draws new numbers on every run. Named by the user's source line.
``random_op_state_in_session``
    a seeded stateful random op in the graph of a ``tf.compat.v1.Session``
    that ``fn`` reuses: the session keeps the op's random state, so every
    ``session.run`` draws the next numbers and nothing can rewind it.
``nondeterministic_dataset``
    a ``tf.data`` transformation that may reorder elements: ``map``,
    ``interleave`` or ``batch`` with ``num_parallel_calls`` and
    ``deterministic=False`` (or ``Options.deterministic = False``), or the
    legacy ``sloppy=True``.
``reshuffling_dataset``
    a dataset ``fn`` iterates afresh on every run that contains
    ``shuffle(..., reshuffle_each_iteration=True)`` (the default): each new
    iteration is a new order.
``dataset_iterator``
    an iterator ``fn`` draws from: every run consumes the next elements.
``gpu_nondeterministic_op``
    an op with a non-deterministic GPU kernel (TensorFlow's cross-entropy
    ops, ``BiasAddGrad``, convolution backprops, segment sums, scatter ops
    ...), reported only when a GPU is visible and
    ``tf.config.experimental.enable_op_determinism()`` has not been called.

The verdict is what the runs showed; the causes are what inspection found.
A report *passes* only when the runs agree bit for bit and no cause was found
(a non-deterministic pipeline can produce the same order three times by luck).

What "the same starting state" means
------------------------------------
Variables
    ``variables`` (a list, a dict, a ``tf.Module``/Keras layer/model/optimizer,
    or a mix) are read before the first run and written back before each
    later run and after the last one, also when ``fn`` raises. With
    ``variables=None`` the audit finds them: the variables, modules, Keras
    objects and sessions that ``fn`` captures (its closure, the module globals
    it names, ``self`` of a bound method, the arguments of a
    ``functools.partial``, one level into lists, dicts and plain objects), the
    variables of ``fn``'s concrete graph when ``fn`` is a ``tf.function``
    (traced first, without running), and the global and local variables of a
    captured session's graph. Variables created eagerly during the first run
    (a Keras optimizer's slots, a layer built on first call) are put back to
    their initial values before each later run and at the end.
Seeds
    With ``seed=None`` (the default) every run starts from the random state
    found when the audit started: TensorFlow's global seed *and* its op-seed
    counter, NumPy's global ``RandomState`` and Python's ``random``. Resetting
    the global seed also clears TensorFlow's kernel cache, so seeded eager ops
    and the random ops of ``tf.function``\\ s start their sequences again.
    A program with no global seed therefore keeps its unseeded ops random, as
    it would be in production. With ``seed=<int>`` each run starts with
    ``tf.random.set_seed(seed)`` instead (NumPy and Python as above). The
    starting random state is put back at the end.
    Not reset: the state kept by a ``tf.compat.v1.Session`` (see
    ``random_op_state_in_session``), ``tf.random.Generator`` objects unless
    their state variable is among the variables, and iterators.

Endpoints
---------
With ``endpoints="end_points"`` (a key of the dict ``fn`` returns) or a
zero-argument callable returning a dict (``lambda: model.end_points``, called
after each run), the report names the first endpoint, in the dict's order, that
differs between runs: where non-determinism enters the forward pass.

Example::

    tf.random.set_seed(0)
    tf.config.experimental.enable_op_determinism()

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))
        return {"loss": loss}

    report = equivtool.audit_determinism(train_step, runs=3)
    print(report)              # verdict, differing leaves, causes with source lines
    report.raise_for_failure()

From the command line, ``equivtool audit MODULE:FN --runs N`` (see
:func:`audit_main`).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import importlib
import inspect
import json
import math
import os
import random
import sys
import sysconfig
import time
import types
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import numpy as np

import equivtool  # noqa: F401  (environment fix before TensorFlow)
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.client import session as _session_lib
from tensorflow.python.eager import context as _context
from tensorflow.python.framework import config as _tf_config
from tensorflow.python.framework import op_callbacks as _op_callbacks

from equivtool._progress import write_reports
from equivtool._stack import user_frame_location
from equivtool.comparison import Comparison, LeafComparison, Tolerance, _fmt_err, compare
from equivtool.report import _CSS, StepResult, _e, _error_plot_png, _json_safe, _leaf_rows, _status_cell
from equivtool.runners import flatten_tensors, to_numpy

__all__ = [
    "audit_determinism",
    "audit_main",
    "DeterminismReport",
    "Cause",
    "LeafDifference",
    "CAUSE_KINDS",
    "STATEFUL_RANDOM_OPS",
    "GPU_NONDETERMINISTIC_OPS",
]

CAUSE_KINDS = (
    "unseeded_random_op",
    "random_op_state_in_session",
    "nondeterministic_dataset",
    "reshuffling_dataset",
    "dataset_iterator",
    "gpu_nondeterministic_op",
)

# Stateful random ops: they take a (seed, seed2) pair of attributes; (0, 0)
# means "no seed at all" and TensorFlow then seeds the kernel at random.
STATEFUL_RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "RandomCrop", "RandomShuffleQueue",
    "RandomShuffleQueueV2", "RandomDataset", "RandomDatasetV2", "ExperimentalRandomDataset",
    "ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2", "SampleDistortedBoundingBox", "SampleDistortedBoundingBoxV2",
    "AllCandidateSampler", "UniformCandidateSampler", "LogUniformCandidateSampler",
    "LearnedUnigramCandidateSampler", "FixedUnigramCandidateSampler",
    "ThreadUnsafeUnigramCandidateSampler",
})
# Dataset ops whose seeds are inputs, not attributes: never judged by attributes.
_SEED_AS_INPUT = frozenset({
    "ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3", "ShuffleAndRepeatDataset",
    "ShuffleAndRepeatDatasetV2", "RandomDataset", "RandomDatasetV2", "ExperimentalRandomDataset",
})

_XENT_HINT = ("use equivtool's deterministic cross-entropy: wrap the step in "
              "`with equivtool.ops.deterministic_xent():` or call "
              "`equivtool.ops.sparse_softmax_cross_entropy_with_logits` directly; "
              "or call tf.config.experimental.enable_op_determinism()")
_DETERMINISM_HINT = "call tf.config.experimental.enable_op_determinism() before building the step"

# Ops with a non-deterministic GPU kernel when op determinism is disabled
# (atomic accumulation, or cuDNN algorithms chosen by autotuning), and what to do.
GPU_NONDETERMINISTIC_OPS: Mapping[str, str] = types.MappingProxyType({
    "SparseSoftmaxCrossEntropyWithLogits": _XENT_HINT,
    "SoftmaxCrossEntropyWithLogits": _XENT_HINT,
    "BiasAddGrad": _DETERMINISM_HINT,
    "Conv2DBackpropFilter": _DETERMINISM_HINT + " (cuDNN backprop algorithms)",
    "Conv2DBackpropInput": _DETERMINISM_HINT + " (cuDNN backprop algorithms)",
    "Conv3DBackpropFilterV2": _DETERMINISM_HINT + " (cuDNN backprop algorithms)",
    "Conv3DBackpropInputV2": _DETERMINISM_HINT + " (cuDNN backprop algorithms)",
    "DepthwiseConv2dNativeBackpropFilter": _DETERMINISM_HINT,
    "DepthwiseConv2dNativeBackpropInput": _DETERMINISM_HINT,
    "MaxPoolGrad": _DETERMINISM_HINT + " (cuDNN max-pool backprop)",
    "MaxPoolGradV2": _DETERMINISM_HINT + " (cuDNN max-pool backprop)",
    "MaxPool3DGrad": _DETERMINISM_HINT,
    "FusedBatchNormGradV3": _DETERMINISM_HINT,
    "UnsortedSegmentSum": _DETERMINISM_HINT + " (also the gradient of tf.gather)",
    "UnsortedSegmentProd": _DETERMINISM_HINT,
    "UnsortedSegmentMax": _DETERMINISM_HINT,
    "UnsortedSegmentMin": _DETERMINISM_HINT,
    "SegmentSum": _DETERMINISM_HINT,
    "SegmentProd": _DETERMINISM_HINT,
    "SparseSegmentSumGrad": _DETERMINISM_HINT,
    "SparseSegmentMeanGrad": _DETERMINISM_HINT,
    "SparseSegmentSqrtNGrad": _DETERMINISM_HINT,
    "ScatterAdd": _DETERMINISM_HINT, "ScatterSub": _DETERMINISM_HINT,
    "ScatterNd": _DETERMINISM_HINT, "ScatterNdAdd": _DETERMINISM_HINT,
    "ScatterNdSub": _DETERMINISM_HINT, "TensorScatterAdd": _DETERMINISM_HINT,
    "TensorScatterSub": _DETERMINISM_HINT, "ResourceScatterAdd": _DETERMINISM_HINT,
    "ResourceScatterSub": _DETERMINISM_HINT, "ResourceScatterNdAdd": _DETERMINISM_HINT,
    "ResourceScatterNdSub": _DETERMINISM_HINT,
    "SparseTensorDenseMatMul": _DETERMINISM_HINT,
    "ResizeBilinearGrad": _DETERMINISM_HINT, "ResizeNearestNeighborGrad": _DETERMINISM_HINT,
    "ResizeBicubicGrad": _DETERMINISM_HINT,
    "CropAndResizeGradImage": _DETERMINISM_HINT, "CropAndResizeGradBoxes": _DETERMINISM_HINT,
    "CTCLoss": _DETERMINISM_HINT, "CTCLossV2": _DETERMINISM_HINT, "CudnnCTCLoss": _DETERMINISM_HINT,
    "Bincount": _DETERMINISM_HINT, "DenseBincount": _DETERMINISM_HINT,
})

# tf.data ops that may hand out elements out of order, and the method that makes them.
_PARALLEL_DATASET_OPS = {
    "ParallelMapDataset": "map", "ParallelMapDatasetV2": "map",
    "ParallelInterleaveDatasetV2": "interleave", "ParallelInterleaveDatasetV3": "interleave",
    "ParallelInterleaveDatasetV4": "interleave", "ParallelBatchDataset": "batch",
    "MapAndBatchDataset": "map_and_batch",
    "LegacyParallelInterleaveDatasetV2": "parallel_interleave",
    "ExperimentalParallelInterleaveDataset": "parallel_interleave",
    "ParseExampleDatasetV2": "parse_example_dataset",
}
_SHUFFLE_DATASET_OPS = frozenset({"ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
                                  "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2"})

_INTERESTING_OPS = STATEFUL_RANDOM_OPS | frozenset(_PARALLEL_DATASET_OPS) | frozenset(GPU_NONDETERMINISTIC_OPS)


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Cause:
    """One detected cause of non-determinism.

    ``kind`` is one of :data:`CAUSE_KINDS`; ``subject`` the op type or the
    dataset; ``location`` the user's source line (``"path:line in function"``)
    or where the object was found; ``count`` how many places matched the same
    kind, subject and location; ``hint`` what to do.
    """

    kind: str
    subject: str
    message: str
    location: str = ""
    hint: str = ""
    count: int = 1

    def __str__(self) -> str:
        where = f" at {self.location}" if self.location else ""
        times = f" (x{self.count})" if self.count > 1 else ""
        text = f"{self.kind}{where}{times}: {self.message}"
        return text + (f"\n    fix: {self.hint}" if self.hint else "")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LeafDifference:
    """A leaf (output or variable) that differed from run 1 in at least one later run.

    ``runs`` are the run numbers (2, 3, ...) that differed; ``worst`` is the
    comparison with the largest max abs difference among them (run 1 is its
    "expected" side).
    """

    name: str
    runs: tuple[int, ...]
    worst: LeafComparison

    @property
    def max_abs(self) -> float:
        return self.worst.max_abs

    @property
    def mismatched(self) -> int:
        return self.worst.mismatched

    @property
    def size(self) -> int:
        return self.worst.size

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "runs": list(self.runs), "max_abs": self.max_abs,
                "mismatched": self.mismatched, "size": self.size, "worst": self.worst.to_dict()}


def _fmt_count(leaf: LeafComparison) -> str:
    if not leaf.values_compared:
        return "-"
    percent = 100.0 * leaf.fraction
    return f"{leaf.mismatched} / {leaf.size} ({percent:.3g}%)"


@dataclass(frozen=True)
class DeterminismReport:
    """What :func:`audit_determinism` found.

    ``comparisons`` holds one :class:`~equivtool.comparison.Comparison` per run
    after the first ("run 2 vs run 1", ...), exact and bitwise, over the
    leaves ``outputs/...``, ``endpoints/...`` (when given as a callable) and
    ``variables/...``. ``causes`` lists what inspection found, ``notes`` how
    the audit was set up (which variables, what was reset).
    """

    name: str
    runs: int
    comparisons: tuple[Comparison, ...]
    causes: tuple[Cause, ...] = ()
    endpoint_prefix: Optional[str] = None
    notes: tuple[str, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "comparisons", tuple(self.comparisons))
        object.__setattr__(self, "causes", tuple(self.causes))
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "meta", types.MappingProxyType(dict(self.meta)))

    # -- reading -------------------------------------------------------------

    @property
    def reproducible(self) -> bool:
        """Every run matched run 1 bit for bit."""
        return all(c.ok for c in self.comparisons)

    @property
    def passed(self) -> bool:
        """Reproducible, and no cause of non-determinism was found."""
        return self.reproducible and not self.causes

    @property
    def leaf_names(self) -> tuple[str, ...]:
        return tuple(leaf.name for leaf in self.comparisons[0].leaves) if self.comparisons else ()

    @property
    def differing(self) -> tuple[LeafDifference, ...]:
        """The leaves that differed in some run, in forward order."""
        by_name: dict[str, list[tuple[int, LeafComparison]]] = {}
        for run, c in enumerate(self.comparisons, start=2):
            for leaf in c.leaves:
                if not leaf.ok:
                    by_name.setdefault(leaf.name, []).append((run, leaf))
        order = {name: i for i, name in enumerate(self.leaf_names)}
        result = []
        for name, found in sorted(by_name.items(), key=lambda kv: order.get(kv[0], len(order))):
            worst = max(found, key=lambda rl: (-1.0 if math.isnan(rl[1].max_abs) else rl[1].max_abs,
                                               rl[1].mismatched))[1]
            result.append(LeafDifference(name, tuple(run for run, _ in found), worst))
        return tuple(result)

    @property
    def first_difference(self) -> Optional[str]:
        """The first differing leaf in forward order (outputs, endpoints, then variables)."""
        diffs = self.differing
        return diffs[0].name if diffs else None

    @property
    def first_differing_endpoint(self) -> Optional[str]:
        """The first endpoint, in the endpoints dict's order, that differs (None without endpoints)."""
        prefix = self.endpoint_prefix
        if prefix is None:
            return None
        for diff in self.differing:
            if diff.name == prefix:
                return diff.name
            if diff.name.startswith(prefix + "/"):
                return diff.name[len(prefix) + 1:]
        return None

    @property
    def max_abs(self) -> float:
        values = [c.max_abs for c in self.comparisons if not math.isnan(c.max_abs)]
        return max(values) if values else math.nan

    # -- text ----------------------------------------------------------------

    def verdict(self) -> str:
        n = len(self.leaf_names)
        if not self.reproducible:
            return (f"Verdict: NOT REPRODUCIBLE ({self.runs} runs; {len(self.differing)} of {n} "
                    f"leaves differ; max abs diff {_fmt_err(self.max_abs)})")
        if self.causes:
            return (f"Verdict: AT RISK: {self.runs} runs agreed bit for bit on {n} leaves, "
                    f"but {len(self.causes)} cause(s) of non-determinism were found")
        return f"Verdict: REPRODUCIBLE ({self.runs} runs agree bit for bit on {n} leaves)"

    def table(self, max_rows: int = 20) -> str:
        diffs = self.differing
        if not diffs:
            return ""
        header = ("leaf", "runs differing", "mismatched elements", "max abs diff")
        rows = [(d.name, ", ".join(map(str, d.runs)), _fmt_count(d.worst), _fmt_err(d.max_abs))
                for d in diffs[:max_rows]]
        widths = [max(len(r[i]) for r in (header, *rows)) for i in range(4)]
        line = lambda r: "  ".join(f"{r[i]:{'<' if i < 2 else '>'}{widths[i]}}" for i in range(4)).rstrip()  # noqa: E731
        text = [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]
        if len(diffs) > max_rows:
            text.append(f"... and {len(diffs) - max_rows} more differing leaves")
        return "\n".join(text)

    def __str__(self) -> str:
        parts = [f"Determinism audit of {self.name}", self.verdict()]
        table = self.table()
        if table:
            parts.append(table)
        endpoint = self.first_differing_endpoint
        if endpoint is not None:
            parts.append(f"First differing endpoint (forward order): {endpoint}")
        elif self.endpoint_prefix is not None and not self.reproducible:
            parts.append("No endpoint differs: non-determinism enters after the endpoints.")
        if self.causes:
            parts.append("Causes found:")
            parts.extend("  - " + str(c).replace("\n", "\n  ") for c in self.causes)
        elif not self.reproducible:
            parts.append("Causes found: none of the known causes was detected; look at the first "
                         "differing leaf (threads, uninitialised memory, Python-side state, "
                         "GPU ops outside the known list).")
        parts.extend(f"note: {n}" for n in self.notes)
        first = next((c for c in self.comparisons if not c.ok), None)
        if first is not None:
            parts += ["", f"Details ({first.name}):", first.format(max_failures=5)]
        return "\n".join(parts)

    def raise_for_failure(self) -> "DeterminismReport":
        """Raise AssertionError with the report text unless it passed; return self."""
        if not self.passed:
            raise AssertionError(str(self))
        return self

    # -- JSON and HTML -------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "runs": self.runs,
            "reproducible": self.reproducible,
            "passed": self.passed,
            "verdict": self.verdict(),
            "seconds": self.seconds,
            "max_abs": self.max_abs,
            "first_difference": self.first_difference,
            "endpoint_prefix": self.endpoint_prefix,
            "first_differing_endpoint": self.first_differing_endpoint,
            "differing": [d.to_dict() for d in self.differing],
            "causes": [c.to_dict() for c in self.causes],
            "notes": list(self.notes),
            "meta": dict(self.meta),
            "comparisons": [c.to_dict() for c in self.comparisons],
        }

    def to_json(self, path: Union[str, os.PathLike, None] = None, *, indent: Optional[int] = 2) -> str:
        """Strict JSON (non-finite floats as "nan"/"inf" strings); written to ``path`` when given."""
        text = json.dumps(_json_safe(self.to_dict()), indent=indent, allow_nan=False)
        if path is not None:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        return text

    def to_html(self, path: Union[str, os.PathLike]) -> str:
        """Write a self-contained HTML page (plots need matplotlib); return its path."""
        verdict_class = "ok" if self.passed else "bad"
        body = [f"<h1>Determinism audit of <code>{_e(self.name)}</code></h1>",
                f'<p class="verdict {verdict_class}">{_e(self.verdict())}</p>']
        meta = "".join(f"<tr><th>{_e(k)}</th><td><code>{_e(v)}</code></td></tr>" for k, v in self.meta.items())
        if meta:
            body.append(f"<table>{meta}</table>")
        endpoint = self.first_differing_endpoint
        if endpoint is not None:
            body.append(f"<p>First differing endpoint: <code>{_e(endpoint)}</code></p>")
        if self.causes:
            rows = "".join(
                f"<tr><td>{_e(c.kind)}</td><td><code>{_e(c.subject)}</code></td><td>{_e(c.message)}</td>"
                f"<td><code>{_e(c.location)}</code></td><td>{_e(c.hint)}</td></tr>" for c in self.causes)
            body.append("<h2>Causes found</h2><table><tr><th>kind</th><th>subject</th><th>what</th>"
                        f"<th>where</th><th>fix</th></tr>{rows}</table>")
        if self.notes:
            body.append("<ul>" + "".join(f"<li>{_e(n)}</li>" for n in self.notes) + "</ul>")
        for c in self.comparisons:
            status = "passed" if c.ok else "failed"
            body.append(f"<h2>{_e(c.name)} {_status_cell(status)}</h2><p>{_e(c.summary())}</p>")
            if not c.ok and len(c.leaves) >= 2:
                step = StepResult.from_comparisons(c.name.replace(" ", "_"), c.name, c)
                body.append(f'<img alt="{_e(c.name)}" src="data:image/png;base64,{_error_plot_png(step)}">')
            if c.failures:
                body.append(_leaf_rows(c.failures))
        document = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                    "<title>equivtool determinism audit</title>"
                    f"<style>{_CSS}</style></head><body>{''.join(body)}</body></html>\n")
        path = os.fspath(path)
        with open(path, "w", encoding="utf-8") as f:
            f.write(document)
        return path


# ---------------------------------------------------------------------------
# Source locations
# ---------------------------------------------------------------------------


def _library_dirs() -> tuple[str, ...]:
    dirs = []
    for name in ("tensorflow", "tf_keras", "keras", "tf_slim", "equivtool", "absl", "numpy",
                 "_pytest", "pluggy", "google", "wrapt"):
        module = sys.modules.get(name)
        for path in getattr(module, "__path__", None) or ():
            dirs.append(os.path.realpath(path) + os.sep)
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.append(os.path.realpath(path) + os.sep)
    return tuple(dirs)


def _graph_op_location(op) -> str:
    """The innermost user frame of a graph op's creation stack, or ""."""
    try:
        frames = list(op.traceback)
    except Exception:  # noqa: BLE001 - a location is a nicety
        return ""
    library = _library_dirs()
    for frame in reversed(frames):
        filename = frame.filename
        if "__autograph_generated_file" in filename or filename.startswith("<frozen"):
            continue
        if not os.path.realpath(filename).startswith(library):
            return f"{filename}:{frame.lineno} in {frame.name}"
    return ""


def _object_location(fn: Callable) -> str:
    fn = getattr(fn, "python_function", fn)
    fn = inspect.unwrap(fn) if callable(fn) else fn
    code = getattr(fn, "__code__", None)
    if code is None:
        return getattr(fn, "__qualname__", type(fn).__name__)
    return f"{code.co_filename}:{code.co_firstlineno} in {code.co_name}"


def _fn_name(fn: Callable) -> str:
    inner = getattr(fn, "python_function", fn)
    if isinstance(inner, functools.partial):
        inner = inner.func
    return getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or type(inner).__name__


# ---------------------------------------------------------------------------
# What fn captures
# ---------------------------------------------------------------------------


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


def _captured(fn: Callable) -> list[tuple[str, Any]]:
    """(label, object) pairs that ``fn`` can reach directly: see the module docstring."""
    found: list[tuple[str, Any]] = []
    seen_fns: set[int] = set()

    def from_function(f: Any, label: str) -> None:
        if id(f) in seen_fns:
            return
        seen_fns.add(id(f))
        if hasattr(f, "python_function"):  # tf.function
            from_function(f.python_function, label)
            return
        if isinstance(f, functools.partial):
            from_function(f.func, label)
            for i, arg in enumerate(f.args):
                found.append((f"{label} argument {i}", arg))
            for key, arg in (f.keywords or {}).items():
                found.append((f"{label} argument {key}", arg))
            return
        if isinstance(f, types.MethodType):
            found.append((f"{label}.__self__", f.__self__))
            from_function(f.__func__, label)
            return
        f = inspect.unwrap(f)
        code = getattr(f, "__code__", None)
        if code is None:
            if callable(f) and not isinstance(f, type):  # a callable object
                found.append((f"{label} (callable object)", f))
                call = getattr(type(f), "__call__", None)
                if call is not None and hasattr(call, "__code__"):
                    from_function(call, label)
            return
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            found.append((name, value))
            if isinstance(value, types.FunctionType) or hasattr(value, "python_function"):
                from_function(value, name)
        module_globals = getattr(f, "__globals__", {})
        for name in sorted(_code_names(code)):
            if name in module_globals:
                value = module_globals[name]
                if isinstance(value, (types.ModuleType, type)):
                    continue
                found.append((name, value))
                if isinstance(value, types.FunctionType) or hasattr(value, "python_function"):
                    from_function(value, name)
        for i, default in enumerate(getattr(f, "__defaults__", None) or ()):
            found.append((f"default {i}", default))

    from_function(fn, _fn_name(fn))

    # One level into containers and plain objects.
    expanded: list[tuple[str, Any]] = []
    for label, obj in found:
        expanded.append((label, obj))
        for sub_label, sub in _children(label, obj):
            expanded.append((sub_label, sub))
            for sub2_label, sub2 in _children(sub_label, sub):
                expanded.append((sub2_label, sub2))
    return expanded


_MAX_CHILDREN = 200


def _children(label: str, obj: Any) -> list[tuple[str, Any]]:
    if isinstance(obj, (str, bytes, np.ndarray, types.ModuleType, type, tf.Tensor)):
        return []
    if isinstance(obj, Mapping):
        return [(f"{label}[{k!r}]", v) for k, v in list(obj.items())[:_MAX_CHILDREN]]
    if isinstance(obj, (list, tuple)):
        return [(f"{label}[{i}]", v) for i, v in enumerate(obj[:_MAX_CHILDREN])]
    if isinstance(obj, (tf.Module, tf.Variable, tf.data.Dataset, tf.data.Iterator, tf.Graph,
                        _session_lib.BaseSession)) or _is_trackable(obj):
        return []  # their variables are read through .variables, or the session's graph
    attributes = getattr(obj, "__dict__", None)
    if not isinstance(attributes, dict) or isinstance(obj, (types.FunctionType, types.MethodType)):
        return []
    return [(f"{label}.{k}", v) for k, v in list(attributes.items())[:_MAX_CHILDREN]
            if not k.startswith("__")]


def _is_trackable(obj: Any) -> bool:
    return isinstance(obj, tf.__internal__.tracking.Trackable)


def _is_variable(obj: Any) -> bool:
    # ``v.assign_add(...)`` returns an _UnreadVariable: a view, not a variable to restore.
    return isinstance(obj, tf.Variable) and type(obj).__name__ != "_UnreadVariable"


def _variables_of(obj: Any) -> list:
    if isinstance(obj, tf.Variable):
        return [obj] if _is_variable(obj) else []
    if isinstance(obj, tf.Module) or _is_trackable(obj):
        try:
            value = getattr(obj, "variables", None)
            if callable(value):
                value = value()
        except Exception:  # noqa: BLE001 - an object that cannot list its variables has none for us
            return []
        if isinstance(value, (list, tuple)):
            return [v for v in value if _is_variable(v)]
    return []


def _is_session(obj: Any) -> bool:
    return isinstance(obj, _session_lib.BaseSession)


# ---------------------------------------------------------------------------
# Variables: reading, writing, naming
# ---------------------------------------------------------------------------


class _VariableStore:
    """The variables being restored: eager ones directly, graph ones through their session."""

    def __init__(self, session=None):
        self.session = session
        self.variables: list = []
        self._ids: set[int] = set()

    def add(self, v) -> bool:
        if id(v) in self._ids:
            return False
        self._ids.add(id(v))
        self.variables.append(v)
        return True

    @staticmethod
    def in_graph(v) -> bool:
        """A TF1 graph variable (RefVariables have no ``_in_graph_mode``: always graph)."""
        return bool(getattr(v, "_in_graph_mode", True))

    def _session_for(self, v):
        session = self.session or tf.compat.v1.get_default_session()
        if session is None or session.graph is not v.graph:
            raise ValueError(
                f"audit_determinism: variable {v.name!r} lives in a TF1 graph, and no session for that "
                "graph was given. Pass session=<the tf.compat.v1.Session that fn runs>.")
        return session

    def read(self) -> list[np.ndarray]:
        values: list = [None] * len(self.variables)
        graph_items = [(i, v) for i, v in enumerate(self.variables) if self.in_graph(v)]
        for i, v in enumerate(self.variables):
            if not self.in_graph(v):
                values[i] = np.array(v.numpy(), copy=True)
        if graph_items:
            session = self._session_for(graph_items[0][1])
            fetched = session.run([v for _, v in graph_items])
            for (i, _), value in zip(graph_items, fetched):
                values[i] = np.array(value, copy=True)
        return values

    def write(self, values: Sequence[np.ndarray]) -> None:
        for v, value in zip(self.variables, values):
            if self.in_graph(v):
                # Variable.load, without its deprecation warning: feed the initializer.
                session = self._session_for(v)
                session.run(v.initializer, {v.initializer.inputs[1]: value})
            else:
                v.assign(value)

    def names(self) -> list[str]:
        counts: dict[str, int] = {}
        names = []
        for v in self.variables:
            name = v.name[:-2] if v.name.endswith(":0") else v.name
            counts[name] = counts.get(name, 0) + 1
            names.append(name if counts[name] == 1 else f"{name} ({counts[name]})")
        return names


def _flatten_variables(variables: Any) -> list:
    """Variables from a variable, a list/tuple/set, a dict (values), a tf.Module, Keras object..."""
    if variables is None:
        return []
    if isinstance(variables, tf.Variable):
        return [variables]
    if isinstance(variables, Mapping):
        return [v for value in variables.values() for v in _flatten_variables(value)]
    if isinstance(variables, (list, tuple, set, frozenset)):
        return [v for value in variables for v in _flatten_variables(value)]
    found = _variables_of(variables)
    if found or isinstance(variables, tf.Module) or _is_trackable(variables):
        return found
    raise TypeError(
        f"audit_determinism: variables must be tf.Variables, a list or dict of them, or objects with "
        f"a .variables attribute (tf.Module, Keras layer, model or optimizer); got {type(variables).__name__}.")


# ---------------------------------------------------------------------------
# Seeds
# ---------------------------------------------------------------------------


class _RandomState:
    """The random state at the start of the audit, to start every run from and to restore."""

    def __init__(self) -> None:
        ctx = _context.context()
        self.tf_seed = ctx._seed
        rng = getattr(ctx, "_rng", None)
        self.tf_rng_state = rng.getstate() if rng is not None else None
        self.np_state = np.random.get_state()
        self.py_state = random.getstate()

    def start_run(self, seed: Optional[int]) -> None:
        if seed is None:
            self.restore()
        else:
            tf.random.set_seed(seed)  # also clears the kernel cache
            np.random.set_state(self.np_state)
            random.setstate(self.py_state)

    def restore(self) -> None:
        _context.set_global_seed(self.tf_seed)  # also clears the kernel cache
        rng = getattr(_context.context(), "_rng", None)
        if rng is not None and self.tf_rng_state is not None:
            rng.setstate(self.tf_rng_state)
        np.random.set_state(self.np_state)
        random.setstate(self.py_state)


# ---------------------------------------------------------------------------
# Ops seen
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _OpSeen:
    op_type: str
    attrs: Mapping[str, Any]
    location: str
    where: str  # "eager", "graph", "tf.function <name>", "session graph"


def _attr_value(value: Any) -> Any:
    """An op attribute as a Python value (AttrValue protos decoded; None stays None)."""
    if hasattr(value, "WhichOneof"):
        which = value.WhichOneof("value")
        if which == "s":
            return value.s.decode("utf-8", "replace")
        if which in ("i", "b", "f"):
            return getattr(value, which)
        if which == "func":
            return value.func.name
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


_WANTED_ATTRS = ("seed", "seed2", "deterministic", "sloppy", "reshuffle_each_iteration")


def _wanted_attrs(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    return {k: _attr_value(v) for k, v in pairs if k in _WANTED_ATTRS}


def _function_names_in_attrs(attr_map) -> list[str]:
    names = []
    for value in attr_map.values():
        which = value.WhichOneof("value")
        if which == "func":
            names.append(value.func.name)
        elif which == "list":
            names.extend(f.name for f in value.list.func)
    return names


class _OpRecorder:
    """Collects the ops a run executes eagerly or creates in graphs (an op callback)."""

    def __init__(self) -> None:
        self.ops: list[_OpSeen] = []
        self._keys: set = set()
        self.functions_done: set[str] = set()
        self._is_function: dict[str, bool] = {}
        self.library: dict[str, Any] = {}  # FunctionDefs found in graph libraries

    def add(self, seen: _OpSeen) -> None:
        key = (seen.op_type, tuple(sorted(seen.attrs.items())), seen.location, seen.where)
        if key not in self._keys:
            self._keys.add(key)
            self.ops.append(seen)

    # -- the callback --------------------------------------------------------

    def callback(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        op_type = op_type.decode("utf-8") if isinstance(op_type, bytes) else str(op_type)
        if op_type in _INTERESTING_OPS:
            if graph is None:
                pairs = zip(attrs[0::2], attrs[1::2]) if attrs else ()
                self.add(_OpSeen(op_type, _wanted_attrs(pairs), user_frame_location(2), "eager"))
            else:
                op = outputs[0].op if outputs else None
                if op is None and op_name is not None:
                    try:
                        op = graph.get_operation_by_name(op_name)
                    except (KeyError, ValueError):
                        op = None
                if op is not None:
                    self.add(_OpSeen(op_type, _wanted_attrs(op.node_def.attr.items()),
                                     _graph_op_location(op) or user_frame_location(2), "graph"))
        elif graph is None and self._function_call(op_type):
            self.scan_function(op_type, f"tf.function {op_type} called at {user_frame_location(2)}")
        return None

    def _function_call(self, op_type: str) -> bool:
        known = self._is_function.get(op_type)
        if known is None:
            try:
                known = bool(_context.context().has_function(op_type))
            except Exception:  # noqa: BLE001
                known = False
            self._is_function[op_type] = known
        return known

    # -- graphs and function libraries ----------------------------------------

    def _function_def(self, name: str):
        fdef = self.library.get(name)
        if fdef is not None:
            return fdef
        try:
            return _context.context().get_function_def(name)
        except Exception:  # noqa: BLE001 - not registered in this context
            return None

    def scan_function(self, name: str, where: str) -> None:
        if name in self.functions_done:
            return
        self.functions_done.add(name)
        fdef = self._function_def(name)
        if fdef is None:
            return
        for node in fdef.node_def:
            if node.op in _INTERESTING_OPS:
                self.add(_OpSeen(node.op, _wanted_attrs(node.attr.items()), where, f"function {name}"))
            nested = _function_names_in_attrs(node.attr)
            if node.op in self.library or self._function_call(node.op):
                nested.append(node.op)
            for inner in nested:
                self.scan_function(inner, where)

    def scan_graph(self, graph, where: str, name: Optional[str] = None) -> None:
        """Every op of ``graph`` (with source lines) and the functions it calls."""
        if name is not None:
            if name in self.functions_done:
                return
            self.functions_done.add(name)
        try:
            library = graph.as_graph_def().library.function
        except Exception:  # noqa: BLE001
            library = ()
        for fdef in library:
            self.library.setdefault(fdef.signature.name, fdef)
        for op in graph.get_operations():
            if op.type in _INTERESTING_OPS:
                self.add(_OpSeen(op.type, _wanted_attrs(op.node_def.attr.items()),
                                 _graph_op_location(op), where))
            nested = _function_names_in_attrs(op.node_def.attr)
            if op.type in self.library:
                nested.append(op.type)
            if nested:
                location = _graph_op_location(op)
                for inner in nested:
                    self.scan_function(inner, f"{location} (inside {inner})" if location else inner)


# ---------------------------------------------------------------------------
# From what was seen to causes
# ---------------------------------------------------------------------------


def _is_unseeded(attrs: Mapping[str, Any]) -> bool:
    return not attrs.get("seed") and not attrs.get("seed2")


def _op_causes(ops: Sequence[_OpSeen], *, gpu: bool, op_determinism: bool) -> list[Cause]:
    causes = []
    for seen in ops:
        t = seen.op_type
        if t in STATEFUL_RANDOM_OPS and t not in _SEED_AS_INPUT:
            if _is_unseeded(seen.attrs):
                causes.append(Cause(
                    "unseeded_random_op", t,
                    f"random op {t} has no op seed and no global seed was set: it draws new numbers "
                    "on every run", seen.location or seen.where,
                    "pass seed= to the op, or call tf.random.set_seed(...) (tf.compat.v1.set_random_seed "
                    "in a TF1 graph) before building the step"))
            elif seen.where == "session graph":
                causes.append(Cause(
                    "random_op_state_in_session", t,
                    f"random op {t} in the graph of a session that fn reuses: the session keeps its "
                    "random state, so each session.run draws the next numbers", seen.location or seen.where,
                    "audit a fn that builds a fresh tf.Graph and Session on every call (as equivtool's TF1 "
                    "runner does), or run the graph with training=False / stateless random ops"))
        if t in _PARALLEL_DATASET_OPS:
            if seen.attrs.get("deterministic") == "false" or seen.attrs.get("sloppy") is True:
                method = _PARALLEL_DATASET_OPS[t]
                causes.append(Cause(
                    "nondeterministic_dataset", t,
                    f"tf.data {method}(num_parallel_calls=..., deterministic=False) hands out elements "
                    "in completion order", seen.location or seen.where,
                    f"pass deterministic=True to {method}() (or leave it unset, and keep "
                    "tf.data.Options.deterministic True)"))
        if gpu and not op_determinism and t in GPU_NONDETERMINISTIC_OPS:
            causes.append(Cause(
                "gpu_nondeterministic_op", t,
                f"{t} has a non-deterministic GPU kernel and op determinism is disabled",
                seen.location or seen.where, GPU_NONDETERMINISTIC_OPS[t]))
    return causes


def _dataset_graph_nodes(dataset) -> list:
    from tensorflow.python.data.ops import options as options_lib

    serialized = dataset._as_serialized_graph(external_state_policy=options_lib.ExternalStatePolicy.IGNORE)
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(serialized.numpy() if hasattr(serialized, "numpy") else serialized)
    return list(graph.node)


def _dataset_causes(label: str, dataset, found_in: str, *, via_iterator: bool) -> list[Cause]:
    causes = []
    nodes = _dataset_graph_nodes(dataset)
    options_deterministic = dataset.options().deterministic
    where = f"dataset {label!r} captured by {found_in}"
    for node in nodes:
        attrs = _wanted_attrs(node.attr.items())
        if node.op in _PARALLEL_DATASET_OPS:
            method = _PARALLEL_DATASET_OPS[node.op]
            det = attrs.get("deterministic")
            if det == "false" or attrs.get("sloppy") is True:
                causes.append(Cause(
                    "nondeterministic_dataset", f"{label}: {method}",
                    f"tf.data {method}(num_parallel_calls=..., deterministic=False) in {label!r} hands out "
                    "elements in completion order", where,
                    f"pass deterministic=True to {method}() (or leave it unset)"))
            elif det == "default" and options_deterministic is False:
                causes.append(Cause(
                    "nondeterministic_dataset", f"{label}: {method}",
                    f"tf.data.Options.deterministic is False on {label!r}, so its parallel {method}() "
                    "hands out elements in completion order", where,
                    "leave tf.data.Options.deterministic (experimental_deterministic) at True"))
        if node.op in _SHUFFLE_DATASET_OPS and attrs.get("reshuffle_each_iteration") is True and not via_iterator:
            causes.append(Cause(
                "reshuffling_dataset", f"{label}: shuffle",
                f"{label!r} shuffles with reshuffle_each_iteration=True: every run iterates it afresh "
                "and sees a new order", where,
                "pass reshuffle_each_iteration=False (and a seed) to shuffle(), or audit one fixed batch"))
    if via_iterator:
        causes.append(Cause(
            "dataset_iterator", label,
            f"fn draws from iterator {label!r}, which advances on every run, so each run sees other "
            "elements", f"captured by {found_in}",
            "audit a step that takes a fixed batch (e.g. next(iterator) once, outside fn)"))
    return causes


def _dedupe(causes: Sequence[Cause]) -> tuple[Cause, ...]:
    merged: dict[tuple, Cause] = {}
    for c in causes:
        key = (c.kind, c.subject, c.location)
        if key in merged:
            merged[key] = dataclasses.replace(merged[key], count=merged[key].count + c.count)
        else:
            merged[key] = c
    return tuple(merged.values())


# ---------------------------------------------------------------------------
# Comparing runs
# ---------------------------------------------------------------------------


def _bitwise(comparison: Comparison, expected, actual) -> Comparison:
    """Fail leaves that compare equal but differ in bits (signed zeros, NaN payloads)."""
    e_flat, a_flat = flatten_tensors(expected), flatten_tensors(actual)
    if not (len(e_flat) == len(a_flat) == len(comparison.leaves)):
        return comparison
    leaves = []
    for leaf, e, a in zip(comparison.leaves, e_flat, a_flat):
        if leaf.ok and e is not None and a is not None:
            e, a = np.asarray(e), np.asarray(a)
            if e.dtype == a.dtype and e.shape == a.shape and e.dtype.kind in "fc" and e.size:
                eb = np.ascontiguousarray(e).view(np.uint8).reshape(e.shape + (-1,))
                ab = np.ascontiguousarray(a).view(np.uint8).reshape(a.shape + (-1,))
                differ = (eb != ab).any(axis=-1)
                count = int(np.count_nonzero(differ))
                if count:
                    first = tuple(int(i) for i in np.unravel_index(int(np.argmax(differ.reshape(-1))), e.shape))
                    leaf = dataclasses.replace(
                        leaf, ok=False, mismatched=count, fraction=count / e.size, first_mismatch=first,
                        first_expected=repr(e[first].item()), first_actual=repr(a[first].item()),
                        note="equal values with different bits (signed zeros or NaN payloads)")
        leaves.append(leaf)
    return dataclasses.replace(comparison, leaves=tuple(leaves))


# ---------------------------------------------------------------------------
# The audit
# ---------------------------------------------------------------------------


def _gpu_visible() -> bool:
    try:
        return bool(tf.config.list_physical_devices("GPU"))
    except Exception:  # noqa: BLE001
        return False


def _check_runs(runs: Any) -> int:
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"audit_determinism: runs must be an int >= 2 (run 1 is the reference), got {runs!r}.")
    return runs


def _collect_variables(store: _VariableStore, variables: Any, captured, concrete, session) -> str:
    """Fill ``store`` with the given variables, or the ones fn reaches; return a note saying which."""
    if variables is not None:
        for v in _flatten_variables(variables):
            store.add(v)
        return f"{len(store.variables)} variable(s) given"
    for _, obj in captured:
        for v in _variables_of(obj):
            store.add(v)
    found = [f"{len(store.variables)} captured by fn"]
    if concrete is not None:
        n = sum(store.add(v) for v in concrete.graph.variables)
        found.append(f"{n} more in its tf.function graph")
    if session is not None:
        with session.graph.as_default():
            graph_variables = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
        n = sum(store.add(v) for v in graph_variables)
        found.append(f"{n} more in its session's graph")
    return "variables found: " + ", ".join(found)


def _captured_dataset_causes(captured, datasets, found_in: str) -> list[Cause]:
    """Causes in the datasets and iterators fn captures, and in ``datasets``."""
    items: list[tuple[str, Any]] = [(label, obj) for label, obj in captured
                                    if isinstance(obj, (tf.data.Dataset, tf.data.Iterator))]
    if isinstance(datasets, Mapping):
        items += list(datasets.items())
    elif datasets is not None:
        items += [(f"datasets[{i}]", d) for i, d in enumerate(datasets)]
    causes: list[Cause] = []
    seen: set[int] = set()
    for label, obj in items:
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, tf.data.Dataset):
            causes += _dataset_causes(label, obj, found_in, via_iterator=False)
        elif getattr(obj, "_dataset", None) is not None:
            causes += _dataset_causes(label, obj._dataset, found_in, via_iterator=True)
        else:
            causes.append(Cause("dataset_iterator", label,
                                f"fn draws from iterator {label!r}, which advances on every run",
                                f"captured by {found_in}", "audit a step that takes a fixed batch"))
    return causes


def audit_determinism(
    fn: Callable[[], Any],
    *,
    runs: int = 3,
    variables: Any = None,
    endpoints: Union[str, Callable[[], Mapping], None] = None,
    seed: Optional[int] = None,
    datasets: Union[Mapping[str, Any], Sequence[Any], None] = None,
    session: Any = None,
    gpu_available: Optional[bool] = None,
    op_determinism: Optional[bool] = None,
) -> DeterminismReport:
    """Run ``fn`` ``runs`` times from the same state and report what differs, bitwise.

    Args:
      fn: a zero-argument callable performing the step (eager code, a
        ``tf.function``, or code calling ``session.run``) and returning a
        nested structure (dicts in forward order, lists, tuples) of tensors or
        arrays, or None.
      runs: how many times to run (>= 2); runs 2.. are compared with run 1.
      variables: the state to restore between runs (see the module
        docstring); None finds it from what ``fn`` captures.
      endpoints: a key of the dict ``fn`` returns whose value is the forward
        pass's endpoints dict, or a zero-argument callable returning such a
        dict after each run; the report then names the first endpoint that
        differs.
      seed: None starts every run from the random state found at the start;
        an int calls ``tf.random.set_seed(seed)`` before every run.
      datasets: extra ``tf.data`` datasets or iterators to inspect (a dict
        label -> dataset, or a list), besides those ``fn`` captures.
      session: the ``tf.compat.v1.Session`` whose graph variables to restore
        (default: a session ``fn`` captures, then the default session).
      gpu_available, op_determinism: override what the audit reads from
        TensorFlow (for tests, or to ask "what if this ran on a GPU?").

    Returns a :class:`DeterminismReport`. The variables and random state end
    as they started, also when ``fn`` raises (the exception propagates).
    """
    if not callable(fn):
        raise TypeError(f"audit_determinism: fn must be a zero-argument callable, got {type(fn).__name__}.")
    runs = _check_runs(runs)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"audit_determinism: seed must be None or an int, got {seed!r}.")
    if endpoints is not None and not isinstance(endpoints, str) and not callable(endpoints):
        raise TypeError(
            "audit_determinism: endpoints must be the key of the dict fn returns that holds the endpoints "
            "dict (e.g. 'end_points'), or a zero-argument callable returning that dict after each run; "
            f"got {type(endpoints).__name__}. A dict of tensors cannot be re-evaluated per run.")
    if not _context.executing_eagerly():
        raise RuntimeError("audit_determinism must be called eagerly (not inside a tf.Graph or tf.function); "
                           "to audit a TF1 graph, pass a fn that calls session.run.")

    started = time.perf_counter()
    notes: list[str] = []
    recorder = _OpRecorder()
    random_state = _RandomState()
    store_created: list[tuple[Any, np.ndarray]] = []  # (weakref, initial value)
    recording = [True]

    def creator(next_creator, **kwargs):
        v = next_creator(**kwargs)
        if recording[0] and _context.executing_eagerly():
            try:
                store_created.append((weakref.ref(v), np.array(v.numpy(), copy=True)))
            except Exception:  # noqa: BLE001 - e.g. a variable without a value yet
                pass
        return v

    # -- what fn captures ------------------------------------------------------
    captured = _captured(fn)
    found_in = _object_location(fn)
    sessions = [obj for _, obj in captured if _is_session(obj)]
    if session is None and sessions:
        session = sessions[0]

    store = _VariableStore(session)
    concrete = None
    snapshot: list = []
    created_live: list[tuple[Any, np.ndarray]] = []
    captures: list[dict] = []
    endpoint_prefix: Optional[str] = None
    callback_on = False

    try:
        with tf.variable_creator_scope(creator):
            random_state.start_run(seed)
            if hasattr(fn, "get_concrete_function"):
                try:
                    concrete = fn.get_concrete_function()
                    recorder.scan_graph(concrete.graph, f"tf.function {_fn_name(fn)}",
                                        name=concrete.function_def.signature.name)
                except Exception as exc:  # noqa: BLE001 - then it is simply run
                    notes.append(f"could not trace {_fn_name(fn)} without running it ({type(exc).__name__}: "
                                 f"{exc}); its graph was inspected only as it ran")
            # -- the variables --------------------------------------------------
            notes.append(_collect_variables(store, variables, captured, concrete, session))
            snapshot = store.read()

            # -- run 1, recording ops and created variables ---------------------
            for run in range(1, runs + 1):
                if run > 1:
                    store.write(snapshot)
                    for ref, initial in created_live:
                        ref().assign(initial)
                random_state.start_run(seed)
                if run == 1:
                    _op_callbacks.add_op_callback(recorder.callback)
                    callback_on = True
                try:
                    result = fn()
                    if callable(endpoints):
                        endpoint_values = endpoints()
                finally:
                    if callback_on:
                        _op_callbacks.remove_op_callback(recorder.callback)
                        callback_on = False
                capture = {"outputs": to_numpy(result)}
                if isinstance(endpoints, str):
                    if not isinstance(capture["outputs"], Mapping) or endpoints not in capture["outputs"]:
                        got = (f"a dict with keys {list(capture['outputs'])}" if isinstance(capture["outputs"], Mapping)
                               else type(result).__name__)
                        raise ValueError(
                            f"audit_determinism: endpoints={endpoints!r} names a key of the dict fn returns, "
                            f"but fn returned {got}.")
                    endpoint_prefix = f"outputs/{endpoints}"
                elif callable(endpoints):
                    capture["endpoints"] = to_numpy(endpoint_values)
                    endpoint_prefix = "endpoints"
                del result
                if run == 1:
                    recording[0] = False
                    if store_created:
                        gc.collect()
                        for ref, initial in store_created:
                            v = ref()
                            if v is not None and id(v) not in store._ids:
                                created_live.append((ref, initial))
                        if created_live:
                            notes.append(f"{len(created_live)} variable(s) created during run 1 were reset to "
                                         "their initial values before each later run and at the end")
                names = store.names() + [ref().name.rsplit(":", 1)[0] + " (created in run 1)"
                                         for ref, _ in created_live]
                values = store.read() + [np.array(ref().numpy(), copy=True) for ref, _ in created_live]
                capture["variables"] = dict(zip(names, values))
                captures.append(capture)
    finally:
        if callback_on:
            _op_callbacks.remove_op_callback(recorder.callback)
        try:
            if snapshot:
                store.write(snapshot)
            # created_live is only known after run 1: if fn raised before, reset all it created
            for ref, initial in created_live or store_created:
                v = ref()
                if v is not None:
                    v.assign(initial)
        finally:
            random_state.restore()

    # -- inspection ------------------------------------------------------------
    if session is not None:
        recorder.scan_graph(session.graph, "session graph")
    gpu = _gpu_visible() if gpu_available is None else bool(gpu_available)
    determinism = _tf_config.is_op_determinism_enabled() if op_determinism is None else bool(op_determinism)
    causes = _op_causes(recorder.ops, gpu=gpu, op_determinism=determinism)

    causes += _captured_dataset_causes(captured, datasets, found_in)

    comparisons = []
    reference = captures[0]
    for run, capture in enumerate(captures[1:], start=2):
        c = compare(reference, capture, Tolerance.exact(), name="", check_dtype=True)
        c = dataclasses.replace(_bitwise(c, reference, capture), name=f"run {run} vs run 1")
        comparisons.append(c)

    meta = {
        "fn": _fn_name(fn),
        "runs": runs,
        "seed": "start state" if seed is None else seed,
        "tensorflow": tf.__version__,
        "gpu": gpu,
        "op_determinism": determinism,
    }
    return DeterminismReport(
        name=_fn_name(fn), runs=runs, comparisons=tuple(comparisons), causes=_dedupe(causes),
        endpoint_prefix=endpoint_prefix, notes=tuple(notes), meta=meta,
        seconds=time.perf_counter() - started)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _resolve_target(target: str) -> Callable[[], Any]:
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"audit target must be MODULE:FN (e.g. mypkg.steps:train_step), got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} of audit target {target!r}: {exc}") from exc
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {module_name!r} has no attribute {attribute!r} (audit target {target!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"audit target {target!r} is a {type(obj).__name__}, not a zero-argument callable")
    return obj


def audit_main(target: str, runs: int, json_path=None, html_path=None) -> int:
    """``equivtool audit MODULE:FN --runs N``: print the report; 0 if it passed, 1 if not.

    ``MODULE:FN`` names a zero-argument callable (a plain function, a
    ``tf.function``, or any attribute path ``MODULE:obj.method``) that performs
    the step and returns its tensors. The state to restore is found as
    :func:`audit_determinism` finds it (what FN captures, its tf.function
    graph, a captured session); FN may say more with attributes:

    ``FN.audit_variables``
        the variables (or a zero-argument callable returning them);
    ``FN.audit_endpoints``
        the ``endpoints`` argument (a key of FN's returned dict, or a callable).

    A bad target (unknown module or attribute, not callable) raises
    ``ValueError`` with a one-line message (the CLI exits with code 2).
    """
    fn = _resolve_target(target)
    try:
        runs = _check_runs(runs)
    except ValueError as exc:
        raise ValueError(str(exc).replace("audit_determinism: runs", "--runs")) from None
    variables = getattr(fn, "audit_variables", None)
    if callable(variables) and not isinstance(variables, tf.Variable) and not _variables_of(variables):
        variables = variables()
    endpoints = getattr(fn, "audit_endpoints", None)
    report = audit_determinism(fn, runs=runs, variables=variables, endpoints=endpoints)
    print(report)
    write_reports(report, json_path, html_path)
    return 0 if report.passed else 1
