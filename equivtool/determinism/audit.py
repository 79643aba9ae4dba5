"""The audit loop: prepare, run ``fn`` once per run from the same state, restore, compare bitwise."""

from __future__ import annotations

import dataclasses
import gc
import time
import weakref
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from equivtool.comparison import Comparison, Tolerance, compare
from equivtool.determinism import _tf
from equivtool.determinism._capture import (_captured, _flatten_variables, _fn_name, _is_session,
                                            _object_location, _RandomState, _variables_of, _VariableStore)
from equivtool.determinism._causes import _captured_dataset_causes, _dedupe, _op_causes, _OpRecorder
from equivtool.determinism._report import DeterminismReport
from equivtool._base.tree import flatten_tensors, sparse_paths, to_numpy

__all__ = ["audit_determinism"]


def _gpu_visible() -> bool:
    try:
        return bool(tf.config.list_physical_devices("GPU"))
    except Exception:  # noqa: BLE001
        return False


def _check_runs(runs: Any) -> int:
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"audit_determinism: runs must be an int >= 2 (run 1 is the reference), got {runs!r}.")
    return runs


def _check_arguments(fn, runs, seed, endpoints, datasets, session) -> int:
    """Every argument checked before any work starts; returns ``runs``."""
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
    _check_datasets(datasets)
    if session is not None and not _is_session(session):
        raise TypeError(
            "audit_determinism: session must be None or the tf.compat.v1.Session that fn runs, "
            f"got {type(session).__name__}.")
    if not _tf.executing_eagerly():
        raise RuntimeError("audit_determinism must be called eagerly (not inside a tf.Graph or tf.function); "
                           "to audit a TF1 graph, pass a fn that calls session.run.")
    return runs


def _check_datasets(datasets) -> None:
    expected = ("audit_determinism: datasets must be None, a dict label -> tf.data.Dataset/Iterator, "
                "or a list of them")
    if datasets is None:
        return
    if isinstance(datasets, Mapping):
        items = list(datasets.items())
    elif isinstance(datasets, (list, tuple)):
        items = [(f"datasets[{i}]", d) for i, d in enumerate(datasets)]
    else:
        raise TypeError(f"{expected}; got {type(datasets).__name__}.")
    for label, d in items:
        if not isinstance(d, (tf.data.Dataset, tf.data.Iterator, tf.compat.v1.data.Iterator)):
            raise TypeError(f"{expected}; {label} is a {type(d).__name__}.")


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


class _Audit:
    """The state of one audit between its pieces: prepare, run once (per run), restore, report."""

    def __init__(self, fn: Callable[[], Any], runs: int, seed: Optional[int], endpoints) -> None:
        self.fn, self.runs, self.seed, self.endpoints = fn, runs, seed, endpoints
        self.started = time.perf_counter()
        self.notes: list[str] = []
        self.recorder = _OpRecorder()
        self.random_state = _RandomState()
        self.created: list[tuple[Any, np.ndarray]] = []  # (weakref, initial value) of variables fn created
        self.created_live: list[tuple[Any, np.ndarray]] = []  # those still alive after run 1
        self.recording = True
        self.captured = _captured(fn)
        self.found_in = _object_location(fn)
        self.session = None
        self.store: Optional[_VariableStore] = None
        self.concrete = None
        self.snapshot: list = []
        self.captures: list[dict] = []
        self.endpoint_prefix: Optional[str] = None
        self.callback_on = False
        self.sparse_outputs: dict[str, None] = {}  # leaves fn returned as tf.IndexedSlices (ordered set)

    def creator(self, next_creator, **kwargs):
        """A variable creator scope: remembers the initial value of every variable created eagerly in run 1."""
        v = next_creator(**kwargs)
        if self.recording and _tf.executing_eagerly():
            try:
                self.created.append((weakref.ref(v), np.array(v.numpy(), copy=True)))
            except Exception:  # noqa: BLE001 - e.g. a variable without a value yet
                pass
        return v

    # -- prepare ---------------------------------------------------------------

    def prepare(self, variables: Any, session: Any) -> None:
        """Find the session and variables, trace a tf.function without running it, read the start state."""
        sessions = [obj for _, obj in self.captured if _is_session(obj)]
        self.session = session if session is not None else (sessions[0] if sessions else None)
        self.store = _VariableStore(self.session)
        self.random_state.start_run(self.seed)
        fn = self.fn
        if hasattr(fn, "get_concrete_function"):
            try:
                self.concrete = fn.get_concrete_function()
                self.recorder.scan_graph(self.concrete.graph, f"tf.function {_fn_name(fn)}",
                                         name=self.concrete.function_def.signature.name)
            except Exception as exc:  # noqa: BLE001 - then it is simply run
                self.notes.append(f"could not trace {_fn_name(fn)} without running it ({type(exc).__name__}: "
                                  f"{exc}); its graph was inspected only as it ran")
        self.notes.append(_collect_variables(self.store, variables, self.captured, self.concrete, self.session))
        self.snapshot = self.store.read()

    # -- one run ---------------------------------------------------------------

    def run_once(self, run: int) -> None:
        """Reset the state (runs 2..), run fn, capture its outputs, endpoints and variables."""
        if run > 1:
            self.store.write(self.snapshot)
            for ref, initial in self.created_live:
                ref().assign(initial)
        self.random_state.start_run(self.seed)
        if run == 1:
            _tf.add_op_callback(self.recorder.callback)
            self.callback_on = True
        try:
            result = self.fn()
            endpoint_values = self.endpoints() if callable(self.endpoints) else None
        finally:
            self._callback_off()
        self._note_sparse("outputs", result)
        capture = {"outputs": to_numpy(result)}
        if isinstance(self.endpoints, str):
            self._check_endpoint_key(capture["outputs"], result)
            self.endpoint_prefix = f"outputs/{self.endpoints}"
        elif callable(self.endpoints):
            self._note_sparse("endpoints", endpoint_values)
            capture["endpoints"] = to_numpy(endpoint_values)
            self.endpoint_prefix = "endpoints"
        del result
        if run == 1:
            self._after_first_run()
        names = self.store.names() + [ref().name.rsplit(":", 1)[0] + " (created in run 1)"
                                      for ref, _ in self.created_live]
        values = self.store.read() + [np.array(ref().numpy(), copy=True) for ref, _ in self.created_live]
        capture["variables"] = dict(zip(names, values))
        self.captures.append(capture)

    def _note_sparse(self, prefix: str, structure: Any) -> None:
        for path in sparse_paths(structure):
            self.sparse_outputs["/".join((prefix, *path))] = None

    def _sparse_update_names(self) -> tuple[str, ...]:
        """The variable leaves that ops applying sparse gradients wrote (see _causes.SPARSE_UPDATE_OPS),
        each ``"variables/<name> by <op type>"``; a target outside the audited variables says so."""
        eager: list[tuple[Any, str]] = []  # (handle, leaf name): matched by identity
        graph: dict[tuple, str] = {}
        names = self.store.names()
        created = [(ref(), f"{ref().name.rsplit(':', 1)[0]} (created in run 1)")
                   for ref, _ in self.created_live if ref() is not None]
        for v, name in list(zip(self.store.variables, names)) + created:
            try:
                if self.store.in_graph(v):
                    graph[(v.graph, v.op.name)] = f"variables/{name}"
                else:
                    eager.append((v.handle, f"variables/{name}"))
            except (AttributeError, ValueError, RuntimeError):  # e.g. a distributed variable: no one handle
                continue
        found: dict[str, None] = {}
        for update in self.recorder.sparse_updates:
            target = update.target
            if isinstance(target, str):
                leaf = f"{target} (not among the audited variables)"
            elif isinstance(target, tuple):
                leaf = graph.get(target) or f"{target[1]} (not among the audited variables)"
            else:
                leaf = next((n for h, n in eager if h is target), "a variable not among the audited ones")
            found[f"{leaf} by {update.op_type}"] = None
        return tuple(found)

    def _callback_off(self) -> None:
        if self.callback_on:
            _tf.remove_op_callback(self.recorder.callback)
            self.callback_on = False

    def _check_endpoint_key(self, outputs: Any, result: Any) -> None:
        key = self.endpoints
        if not isinstance(outputs, Mapping) or key not in outputs:
            got = f"a dict with keys {list(outputs)}" if isinstance(outputs, Mapping) else type(result).__name__
            raise ValueError(f"audit_determinism: endpoints={key!r} names a key of the dict fn returns, "
                             f"but fn returned {got}.")

    def _after_first_run(self) -> None:
        """Stop recording created variables; keep those still alive to reset before each later run."""
        self.recording = False
        if not self.created:
            return
        gc.collect()
        for ref, initial in self.created:
            v = ref()
            if v is not None and not self.store.holds(v):
                self.created_live.append((ref, initial))
        if self.created_live:
            self.notes.append(f"{len(self.created_live)} variable(s) created during run 1 were reset to "
                              "their initial values before each later run and at the end")

    # -- restore ---------------------------------------------------------------

    def restore(self) -> None:
        """Put variables and random state back as they started; runs on every exit path."""
        self._callback_off()
        try:
            if self.snapshot:
                self.store.write(self.snapshot)
            # created_live is only known after run 1: if fn raised before, reset all it created
            for ref, initial in self.created_live or self.created:
                v = ref()
                if v is not None:
                    v.assign(initial)
        finally:
            self.random_state.restore()

    # -- report ----------------------------------------------------------------

    def report(self, datasets, gpu_available: Optional[bool], op_determinism: Optional[bool]) -> DeterminismReport:
        """Inspect what was seen, compare runs 2.. with run 1 bitwise, and build the report."""
        if self.session is not None:
            self.recorder.scan_graph(self.session.graph, "session graph")
        gpu = _gpu_visible() if gpu_available is None else bool(gpu_available)
        determinism = _tf.is_op_determinism_enabled() if op_determinism is None else bool(op_determinism)
        causes = _op_causes(self.recorder.ops, gpu=gpu, op_determinism=determinism)
        causes += _captured_dataset_causes(self.captured, datasets, self.found_in)
        reference = self.captures[0]
        comparisons = []
        for run, capture in enumerate(self.captures[1:], start=2):
            # bitwise: NaN and inf that match count as compared (the bits are checked next)
            c = compare(reference, capture, Tolerance(0.0, 0.0, allow_nonfinite=True), name="", check_dtype=True)
            comparisons.append(dataclasses.replace(_bitwise(c, reference, capture), name=f"run {run} vs run 1"))
        name = _fn_name(self.fn)
        meta = {"fn": name, "runs": self.runs, "seed": "start state" if self.seed is None else self.seed,
                "tensorflow": tf.__version__, "gpu": gpu, "op_determinism": determinism}
        return DeterminismReport(
            name=name, runs=self.runs, comparisons=tuple(comparisons), causes=_dedupe(causes),
            endpoint_prefix=self.endpoint_prefix, notes=tuple(self.notes), meta=meta,
            sparse_outputs=tuple(self.sparse_outputs), sparse_updates=self._sparse_update_names(),
            seconds=time.perf_counter() - self.started)


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
    runs = _check_arguments(fn, runs, seed, endpoints, datasets, session)
    audit = _Audit(fn, runs, seed, endpoints)
    try:
        with tf.variable_creator_scope(audit.creator):
            audit.prepare(variables, session)
            for run in range(1, runs + 1):
                audit.run_once(run)
    finally:
        audit.restore()
    return audit.report(datasets, gpu_available, op_determinism)
