"""``compare_models(old, new, **options)``: two exported models, the same inputs, every output compared.

The options are checked before anything is loaded; the sides are loaded (ops
checked first), their signatures matched (by name, by ``map_inputs`` /
``map_outputs``, or by order when shapes and dtypes agree, with a note), the
inputs made or read and checked against both signatures, and each batch's
outputs compared with :func:`equivtool.comparison.compare`: a step per batch in
an :class:`~equivtool.report.EquivalenceReport`, with the same three-state
verdicts as ``check_equivalence``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile
import time
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from equivtool._base.cli_tolerances import tolerance_spec
from equivtool.comparison import compare
from equivtool.exported import _recorder
from equivtool.exported._load import load_side
from equivtool.exported._sides import ModelLoadError, Side, load_op_libraries
from equivtool.report import EquivalenceReport, StepResult

_MAX_SEED = 2 ** 32 - 1
_MAX_ELEMENTS = 1 << 28


# --------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------

def _pairs(value, argument: str, sep: str = "=") -> dict:
    """``"A=B,C=D"``, a list of such strings, or a mapping -> dict."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    items = [value] if isinstance(value, str) else list(value)
    result = {}
    for text in items:
        for item in (p.strip() for p in str(text).split(",")):
            if not item:
                continue
            name, found, target = item.partition(sep)
            if not found or not name.strip() or not target.strip():
                raise ModelLoadError(f"{argument}: expected NAME{sep}VALUE,..., got {item!r}")
            result[name.strip()] = target.strip()
    return result


def _named(value, argument: str, form: str, parse) -> dict:
    """``NAME:VALUE`` items (a string, a list of strings, or a mapping name -> parsed value)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): parse(v, str(k)) for k, v in value.items()}
    items = [value] if isinstance(value, str) else list(value)
    result = {}
    for item in items:
        name, found, rest = str(item).rpartition(":")
        if not found or not name:
            raise ModelLoadError(f"{argument}: expected {form}, got {item!r}")
        result[name] = parse(rest, name)
    return result


def parse_input_shapes(value) -> dict:
    def parse(dims, name):
        try:
            shape = tuple(int(d) for d in (dims.split(",") if isinstance(dims, str) else dims))
        except (TypeError, ValueError):
            shape = ()
        if not shape or any(d <= 0 for d in shape) or int(np.prod(shape)) > _MAX_ELEMENTS:
            raise ModelLoadError(f"--input-shapes: expected NAME:D,D,... with positive dimensions "
                                 f"(at most {_MAX_ELEMENTS} values), got {name}:{dims}")
        return shape
    return _named(value, "--input-shapes", "NAME:D,D,...", parse)


def parse_val_ranges(value) -> dict:
    def parse(bounds, name):
        try:
            lo, hi = (float(x) for x in (bounds.split(",") if isinstance(bounds, str) else bounds))
        except (TypeError, ValueError):
            lo = hi = float("nan")
        if not (np.isfinite(lo) and np.isfinite(hi) and lo <= hi):
            raise ModelLoadError(f"--val-range: expected NAME:LO,HI with finite LO <= HI, got {name}:{bounds}")
        return lo, hi
    return _named(value, "--val-range", "NAME:LO,HI", parse)


def parse_tolerances(atol, rtol) -> dict:
    """``--atol [OUT:]V`` / ``--rtol [OUT:]V`` -> a tolerance spec (see
    :func:`equivtool._base.cli_tolerances.tolerance_spec`); a bad value is a
    :class:`ModelLoadError` (exit 2)."""
    try:
        return tolerance_spec(atol, rtol)
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None


def _load_inputs_file(path: str) -> list:
    if not os.path.isfile(path):
        raise ModelLoadError(f"--inputs: {path!r} is not a file; expected an .npz with one array per input name")
    try:
        with np.load(path, allow_pickle=False) as data:
            return [{k: data[k] for k in data.files}]
    except Exception as exc:  # noqa: BLE001 - not an npz, object arrays ...
        raise ModelLoadError(f"--inputs: cannot read {path!r} as .npz (no pickle): {' '.join(str(exc).split())}") \
            from None


def _load_data_loader(spec: str, batches: int) -> list:
    path, found, name = spec.rpartition(":")
    if not found or not path.endswith(".py") or not name.isidentifier():
        raise ModelLoadError(f"--data-loader: expected FILE.py:FUNCTION, got {spec!r}")
    if not os.path.isfile(path):
        raise ModelLoadError(f"--data-loader: {path!r} is not a file")
    module_spec = importlib.util.spec_from_file_location("_equivtool_data_loader", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
        fn = getattr(module, name)
        result = []
        for batch in fn():
            if not isinstance(batch, Mapping):
                raise ModelLoadError(f"--data-loader: {spec} yielded {type(batch).__name__}; expected a dict "
                                     "input name -> array")
            result.append({str(k): np.asarray(v) for k, v in batch.items()})
            if len(result) >= batches:
                break
    except ModelLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: one line
        raise ModelLoadError(f"--data-loader: {spec} raised {type(exc).__name__}: {exc}") from None
    if not result:
        raise ModelLoadError(f"--data-loader: {spec} yielded no batch")
    return result


# --------------------------------------------------------------------------
# signatures
# --------------------------------------------------------------------------

def _agree(a, b) -> bool:
    if a.dtype != b.dtype:
        return False
    if a.shape is None or b.shape is None:
        return True
    return len(a.shape) == len(b.shape) and all(x is None or y is None or x == y for x, y in zip(a.shape, b.shape))


def match_names(old: Sequence, new: Sequence, mapping: Mapping[str, str], what: str, flag: str,
                strict: bool) -> tuple[dict, list]:
    """old name -> new name: ``mapping`` first, then equal names, then by order when
    the rest agree in count, dtypes and shapes (with a note)."""
    old_names, new_names = [t.name for t in old], [t.name for t in new]
    for k, v in mapping.items():
        if k not in old_names:
            raise ModelLoadError(f"{flag}: {k!r} is not an OLD {what}; OLD has {', '.join(old_names)}")
        if v not in new_names:
            raise ModelLoadError(f"{flag}: {v!r} is not a NEW {what}; NEW has {', '.join(new_names)}")
    result = dict(mapping)
    for name in old_names:
        if name not in result and name in new_names and name not in result.values():
            result[name] = name
    rest_old = [t for t in old if t.name not in result]
    rest_new = [t for t in new if t.name not in result.values()]
    notes = []
    if rest_old and len(rest_old) == len(rest_new) and all(_agree(a, b) for a, b in zip(rest_old, rest_new)):
        for a, b in zip(rest_old, rest_new):
            result[a.name] = b.name
        notes.append(f"{what}s matched by order (names differ, shapes and dtypes agree): "
                     + ", ".join(f"{a.name}={b.name}" for a, b in zip(rest_old, rest_new)))
    elif strict and (rest_old or rest_new):
        raise ModelLoadError(
            f"the signatures' {what}s differ: OLD has {', '.join(old_names)}, NEW has {', '.join(new_names)}; "
            f"map them with {flag} OLD=NEW,...")
    return result, notes


# --------------------------------------------------------------------------
# compare_models
# --------------------------------------------------------------------------

def _check_options(seed, batches, save_outputs) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ModelLoadError(f"--seed: expected an integer from 0 to {_MAX_SEED}, got {seed!r}")
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ModelLoadError(f"--batches: expected a positive integer, got {batches!r}")
    if save_outputs is not None:
        folder = os.path.dirname(os.path.abspath(save_outputs))
        if not str(save_outputs).endswith(".npz"):
            raise ModelLoadError(f"--save-outputs: expected a FILE.npz path, got {save_outputs!r}")
        if not os.path.isdir(folder):
            raise ModelLoadError(f"--save-outputs: folder {folder!r} does not exist")


def _make_inputs(old: Side, new: Side, inputs, data_loader, shapes, ranges, seed, batches):
    """(a list of feeds for OLD, the provenance text, notes)."""
    from equivtool.exported._record import RecordSide
    records = [s for s in (old, new) if isinstance(s, RecordSide)]
    if records:
        if inputs is not None or data_loader is not None:
            raise ModelLoadError(f"--inputs/--data-loader: {records[0].path} is a golden record; it replays "
                                 "the inputs it was written with")
        record = records[0]
        feeds = record.input_batches()
        if record is new:  # the record's names are NEW's; OLD's feeds are mapped back below
            return feeds, f"the inputs of golden record {record.path}", [], True
        return feeds, f"the inputs of golden record {record.path} ({record.meta.get('provenance')})", [], False
    if inputs is not None:
        feeds = [{k: np.asarray(v) for k, v in inputs.items()}] if isinstance(inputs, Mapping) else (
            _load_inputs_file(os.fspath(inputs)) if isinstance(inputs, (str, os.PathLike)) else
            [{k: np.asarray(v) for k, v in feed.items()} for feed in inputs])
        where = os.fspath(inputs) if isinstance(inputs, (str, os.PathLike)) else "the caller"
        return feeds, f"inputs from {where}", [], False
    if data_loader is not None:
        return _load_data_loader(data_loader, batches), f"batches from --data-loader {data_loader}", [], False
    unknown = [k for k in list(shapes) + list(ranges) if k not in {t.name for t in old.inputs}]
    if unknown:
        raise ModelLoadError(f"--input-shapes/--val-range: {', '.join(unknown)} is not an input of OLD; "
                             f"OLD's inputs: {', '.join(t.name for t in old.inputs)}")
    try:
        feeds, notes = _recorder.generate_inputs([t.as_dict() for t in old.inputs], shapes, ranges, seed, batches)
    except _recorder.RecordError as exc:
        raise ModelLoadError(str(exc)) from None
    return feeds, f"seeded random inputs (seed {seed}, NumPy RandomState)", notes, False


def compare_models(
    old: Union[str, os.PathLike, Side],
    new: Union[str, os.PathLike, Side],
    *,
    signature: str = "serving_default",
    tags: Union[str, Sequence[str]] = ("serve",),
    graph_inputs: Any = None,
    graph_outputs: Any = None,
    input_shapes: Any = None,
    val_range: Any = None,
    seed: int = 0,
    inputs: Any = None,
    data_loader: Optional[str] = None,
    batches: int = 1,
    map_inputs: Any = None,
    map_outputs: Any = None,
    atol: Any = None,
    rtol: Any = None,
    localize: bool = False,
    strict_intermediates: bool = False,
    save_outputs: Optional[str] = None,
    load_op_library: Sequence[str] = (),
    graph_rewrites: str = "as_written",
    meta: Optional[Mapping[str, Any]] = None,
) -> EquivalenceReport:
    """Compare two exported models (or golden records) output by output.

    ``old`` and ``new`` are paths (a SavedModel folder, TF1 or TF2; a frozen
    ``.pb``; a tf-keras ``.h5``/``.keras`` file; a golden record ``.npz``) or
    sides from :func:`load_side`. The options are those of ``equivtool compare``
    (``equivtool compare --help``), as keyword arguments; list-valued options
    take a mapping or ``"A=B,..."`` / ``"NAME:VALUE"`` strings. With
    ``localize=True`` an intermediate beyond tolerance under passing outputs is
    named in the verdict line ("EQUIVALENT at the outputs; an intermediate
    differs: ..."); ``strict_intermediates=True`` fails the step instead. Bad options and
    artifacts raise ``ValueError`` with one line before anything runs.
    """
    started = time.perf_counter()
    shapes, ranges = parse_input_shapes(input_shapes), parse_val_ranges(val_range)
    tolerance = parse_tolerances(atol, rtol)
    in_map, out_map = _pairs(map_inputs, "--map-inputs"), _pairs(map_outputs, "--map-outputs")
    graph_in, graph_out = _pairs(graph_inputs, "--graph-inputs"), _pairs(graph_outputs, "--graph-outputs")
    _check_options(seed, batches, save_outputs)
    if not isinstance(strict_intermediates, bool) or (strict_intermediates and not localize):
        raise ModelLoadError(f"strict_intermediates: expected True (with localize=True) or False, got "
                             f"{strict_intermediates!r}" + ("" if localize else " without localize"))
    from equivtool._platform import execution as _execution
    try:
        _execution.check_graph_rewrites(graph_rewrites, "--graph-rewrites")
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    if isinstance(load_op_library, (str, os.PathLike)):
        load_op_library = [load_op_library]
    load_op_libraries([os.fspath(p) for p in load_op_library])
    owned = []
    try:
        sides = []
        for which, side in (("OLD", old), ("NEW", new)):
            if not isinstance(side, Side):
                side = load_side(side, signature=signature, tags=tags, graph_inputs=graph_in,
                                 graph_outputs=graph_out, graph_rewrites=graph_rewrites)
                owned.append(side)
            sides.append(side)
        old_side, new_side = sides
        report = _compare(old_side, new_side, shapes, ranges, tolerance, in_map, out_map, seed, inputs,
                          data_loader, batches, localize, save_outputs,
                          {"platform": _execution.platform(graph_rewrites, True), **dict(meta or {})}, started,
                          release_old=any(side is old_side for side in owned))
        if not strict_intermediates:
            return report
        from equivtool.localize.result import strict_intermediates as _strict
        return EquivalenceReport(tuple(_strict(s) for s in report.steps), report.meta)
    finally:
        for side in owned:
            side.close()


def _compare(old: Side, new: Side, shapes, ranges, tolerance, in_map, out_map, seed, inputs, data_loader,
             batches, localize, save_outputs, extra_meta, started, release_old=False) -> EquivalenceReport:
    """The comparison; ``release_old``: OLD was loaded here, and ``--localize`` may
    close it once its node values are written (one model in memory at a time)."""
    input_names, notes = match_names(old.inputs, new.inputs, in_map, "input", "--map-inputs", strict=True)
    output_names, out_notes = match_names(old.outputs, new.outputs, out_map, "output", "--map-outputs",
                                          strict=False)
    notes += out_notes
    feeds, provenance, input_notes, feeds_are_new = _make_inputs(old, new, inputs, data_loader, shapes, ranges,
                                                                 seed, batches)
    notes += input_notes
    if feeds_are_new:
        back = {v: k for k, v in input_names.items()}
        feeds = [{back.get(k, k): v for k, v in feed.items()} for feed in feeds]
    new_feeds = [{input_names[k]: v for k, v in feed.items() if k in input_names} for feed in feeds]
    for feed, new_feed in zip(feeds, new_feeds):  # every batch fits both signatures before anything runs
        old.check_feed(feed, "OLD's inputs")
        new.check_feed(new_feed, "NEW's inputs")
    if localize and old.capabilities["intermediates"]:
        raise ModelLoadError(f"--localize: OLD {old.path}: {old.capabilities['intermediates']}")
    steps, old_outputs = [], []
    renamed = {v: k for k, v in output_names.items()}
    for b, (feed, new_feed) in enumerate(zip(feeds, new_feeds)):
        t0 = time.perf_counter()
        expected = old.run(feed)
        actual = {renamed.get(k, k): v for k, v in new.run(new_feed).items()}
        old_outputs.append(expected)
        name = "outputs" if len(feeds) == 1 else f"outputs/batch{b}"
        title = "signature outputs" if len(feeds) == 1 else f"signature outputs, batch {b}"
        step = StepResult.from_comparisons(name, title, compare(expected, actual, tolerance),
                                           seconds=time.perf_counter() - t0, notes=notes if b == 0 else ())
        steps.append(step)
    nodes, node_values, graph_def = (), (), None
    with contextlib.ExitStack() as stack:  # the nodes' values live in a folder until the record holds them
        if localize:
            from equivtool.exported._localize import localize_step
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="equivtool-localize-"))
            steps[0], nodes, node_values, graph_def = localize_step(
                steps[0], old, new, feeds[0], new_feeds[0], output_names, tolerance, folder,
                keep_old=save_outputs is not None, release_old=release_old)
        if save_outputs is not None:
            _save(save_outputs, old, feeds, old_outputs, nodes, node_values, graph_def, provenance)
    report_meta = {
        "command": "compare", "old": old.describe(), "new": new.describe(), "inputs": provenance,
        "batches": len(feeds), "input_shapes": {k: list(np.shape(v)) for k, v in feeds[0].items()},
        "input_map": {k: v for k, v in input_names.items() if k != v},
        "output_map": {k: v for k, v in output_names.items() if k != v},
        "seconds": round(time.perf_counter() - started, 3), **_versions(), **extra_meta,
    }
    if save_outputs is not None:
        report_meta["saved_outputs"] = os.path.abspath(save_outputs)
    return EquivalenceReport(tuple(steps), report_meta)


def _versions() -> dict:
    import tensorflow as tf
    return {"tensorflow": tf.__version__, "numpy": np.__version__}


def _save(path, old: Side, feeds, outputs, nodes, node_values, graph_def, provenance) -> None:
    header = {"writer": _recorder.writer_info("equivtool compare --save-outputs"),
              "model": {"path": os.path.abspath(old.path), "kind": old.kind, **{k: v for k, v in old.meta.items()
                                                                                   if k != "path"}},
              "inputs": [t.as_dict() for t in old.inputs], "outputs": [t.as_dict() for t in old.outputs],
              "provenance": provenance, "notes": []}
    header["model"].pop("provenance", None)
    _recorder.write_record(path, header, feeds, outputs, nodes, node_values, graph_def)
