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
import shutil
import tempfile
import time
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from equivtool._base import scratch
from equivtool._base.errors import short
from equivtool.comparison.tolerance import tolerance_spec
from equivtool.comparison import compare, unmatched_keys
from equivtool.engine import signals as _signals
from equivtool.exported import _recorder, _weights
from equivtool.exported._load import load_side
from equivtool.exported._sides import ModelLoadError, Side, load_op_libraries
from equivtool.coverage import Coverage, output_levels
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
    :func:`equivtool.comparison.tolerance.tolerance_spec`); a bad value is a
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
        raise ModelLoadError(f"--inputs: cannot read {path!r} as .npz (no pickle): {short(exc, None)}") \
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

def _same_file(a: str, b: str) -> bool:
    """``a`` and ``b`` name one file or folder (through symlinks, hard links, ``..``)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_options(seed, batches, save_outputs, overwrite, sides) -> None:
    """The options that need no model, checked before any is loaded; ``sides``:
    ``(("OLD", old), ("NEW", new))`` as given (paths or sides)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ModelLoadError(f"--seed: expected an integer from 0 to {_MAX_SEED}, got {seed!r}")
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ModelLoadError(f"--batches: expected a positive integer, got {batches!r}")
    if not isinstance(overwrite, bool):
        raise ModelLoadError(f"--overwrite: expected True or False, got {overwrite!r}")
    if save_outputs is not None:
        save_outputs = os.fspath(save_outputs)
        folder = os.path.dirname(os.path.abspath(save_outputs))
        if not save_outputs.endswith(".npz"):
            raise ModelLoadError(f"--save-outputs: expected a FILE.npz path, got {save_outputs!r}")
        if not os.path.isdir(folder):
            raise ModelLoadError(f"--save-outputs: folder {folder!r} does not exist")
        for which, side in sides:
            path = side.path if isinstance(side, Side) else side
            if isinstance(path, (str, os.PathLike)) and os.fspath(path) and _same_file(save_outputs,
                                                                                         os.fspath(path)):
                raise ModelLoadError(f"--save-outputs: {save_outputs!r} is {which} of this run; the record "
                                     "would replace an input; write it to another path")
        if os.path.isdir(save_outputs):
            raise ModelLoadError(f"--save-outputs: {save_outputs!r} is a folder; expected a FILE.npz path")
        if os.path.lexists(save_outputs) and not overwrite:
            raise ModelLoadError(f"--save-outputs: {save_outputs!r} exists; pass --overwrite (overwrite=True) "
                                 "to replace it")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ModelLoadError(f"--save-outputs: folder {folder!r} is not writable; choose another FILE.npz")


def _check_inputs_option(inputs, data_loader, input_shapes, val_range) -> None:
    """``inputs`` of a form compare_models reads, and at most one source of inputs."""
    if inputs is not None:
        is_batches = (isinstance(inputs, (list, tuple)) and inputs
                      and all(isinstance(feed, Mapping) for feed in inputs))
        if not (isinstance(inputs, (str, os.PathLike, Mapping)) or is_batches):
            got = (f"an empty {type(inputs).__name__}" if isinstance(inputs, (list, tuple)) and not inputs
                   else type(inputs).__name__)
            raise ModelLoadError(f"--inputs: expected an .npz path, a mapping input name -> array, or a "
                                 f"non-empty list of such mappings (one per batch); got {got}")
    given = [flag for flag, value in (("--inputs", inputs), ("--data-loader", data_loader)) if value is not None]
    generated = [flag for flag, value in (("--input-shapes", input_shapes), ("--val-range", val_range)) if value]
    if len(given) > 1 or (given and generated):
        raise ModelLoadError(f"{' and '.join(given + generated)} conflict: give the inputs with --inputs "
                             "FILE.npz, or --data-loader FILE.py:FN, or generate them (--input-shapes, "
                             "--val-range), not several")


def _check_generated(old: Side, shapes: Mapping, ranges: Mapping) -> None:
    """Generated inputs that fit in memory, with ranges their dtypes hold, checked
    before anything is allocated (a static shape may ask for tens of GiB)."""
    from equivtool._base.inputs import InputError, check_range
    for spec in old.inputs:
        shape, _ = _recorder.input_shape(spec.as_dict(), shapes)
        if shape is None or spec.dtype == "string":
            continue
        count, itemsize = int(np.prod(shape, dtype=object)), np.dtype(spec.dtype).itemsize
        if count > _MAX_ELEMENTS:
            raise ModelLoadError(
                f"input {spec.name!r}: shape {tuple(shape)} is {count} values ({count * itemsize / 2**30:.1f} GiB "
                f"of {spec.dtype}); generated inputs hold at most {_MAX_ELEMENTS} values each: give a smaller "
                f"shape with --input-shapes {spec.name}:D,D,... or the arrays with --inputs FILE.npz")
        if spec.name in ranges:
            try:
                check_range(np.dtype(spec.dtype), *ranges[spec.name], f"--val-range {spec.name}")
            except InputError as exc:
                raise ModelLoadError(str(exc)) from None


def _filter_names(names: Mapping[str, str], old: Side, new: Side, patterns: tuple) -> dict:
    """``names`` (OLD output -> NEW output) without the outputs ``--outputs`` leaves
    out; a pattern that matches no output of either side is an error."""
    if not patterns:
        return dict(names)
    from equivtool.engine.output_filter import kept
    every = [t.name for t in old.outputs] + [t.name for t in new.outputs]
    for pattern in patterns:
        if not any(kept(name, (pattern.lstrip("!"),)) for name in every):
            raise ModelLoadError(f"--outputs: pattern {pattern!r} matches no output; OLD has "
                                 f"{', '.join(t.name for t in old.outputs)}, NEW has "
                                 f"{', '.join(t.name for t in new.outputs)}")
    return {k: v for k, v in names.items() if kept(k, patterns)}




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
        return feeds, record.input_provenance(), [], False
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
    overwrite: bool = False,
    load_op_library: Sequence[str] = (),
    graph_rewrites: str = "as_written",
    old_python: Optional[Union[str, os.PathLike]] = None,
    meta: Optional[Mapping[str, Any]] = None,
    outputs: Any = None,
    strict_tolerances: bool = False,
    old_signature: Optional[str] = None,
    new_signature: Optional[str] = None,
    old_tags: Union[None, str, Sequence[str]] = None,
    new_tags: Union[None, str, Sequence[str]] = None,
    factory: Optional[Any] = None,
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

    ``save_outputs`` writes OLD's golden record there, atomically; an existing
    file is replaced only with ``overwrite=True``, and never when it is OLD or
    NEW itself. SIGTERM stops the run as Ctrl-C does (its temporary files are
    removed; then the process ends by SIGTERM, see :mod:`equivtool.engine.signals`).

    ``old_python``: the path of another Python interpreter (TensorFlow 1.15, as
    ``equivtool tf1-env`` makes) that runs OLD, a TF1 SavedModel or frozen
    graph, with the recorder ``equivtool record-script`` prints; its record (a
    temporary file, removed on every exit) is then compared with NEW, and the
    report names the TensorFlow and Python OLD ran under
    (:mod:`equivtool.exported._old_python`). Inputs are generated there with the
    same seed and rules, or read from ``inputs`` (one batch); ``data_loader``
    is refused.

    ``signature``/``tags`` apply to both sides unless ``old_signature`` /
    ``new_signature`` / ``old_tags`` / ``new_tags`` say otherwise. ``outputs``:
    patterns (as ``check_equivalence``'s: ``'logits'``, ``'end_points/*'``,
    ``'!aux*'`` excludes) of the outputs compared; a pattern matching no output
    is an error. ``strict_tolerances``: an ``atol``/``rtol`` key that names no
    compared output is an error (else a note in the report). Give inputs with
    at most one of ``inputs``, ``data_loader``, or generated ones
    (``input_shapes``/``val_range``).

    ``factory``: for a side that is a Keras 3 ``.weights.h5`` file (weights
    without the model), a zero-argument callable building the Keras 3 model
    the weights are loaded into (CLI: ``--factory MODULE:FUNCTION``; see
    :mod:`equivtool.exported._weights`).
    """
    arguments = dict(locals())
    with _signals.sigterm_unwinds():
        return _compare_models(**arguments)


def _compare_models(*, old, new, signature, tags, graph_inputs, graph_outputs, input_shapes, val_range, seed,
                    inputs, data_loader, batches, map_inputs, map_outputs, atol, rtol, localize, save_outputs,
                    overwrite, load_op_library, graph_rewrites, old_python, meta, outputs, strict_tolerances,
                    old_signature, new_signature, old_tags, new_tags, strict_intermediates,
                    factory) -> EquivalenceReport:
    started = time.perf_counter()
    _check_inputs_option(inputs, data_loader, input_shapes, val_range)
    _weights.check_factory(factory, old, new)
    try:
        from equivtool.engine.output_filter import check_patterns
        patterns = check_patterns(outputs)
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"--{exc}") from None
    if not isinstance(strict_tolerances, bool):
        raise ModelLoadError(f"--strict-tolerances: expected True or False, got {strict_tolerances!r}")
    for which, side in (("old", old), ("new", new)):
        if isinstance(side, Side) and side.closed:
            raise ModelLoadError(f"{which}: the {side.kind} side {side.path} is closed; load it again "
                                 "(equivtool.exported.load_side) or pass its path")
    shapes, ranges = parse_input_shapes(input_shapes), parse_val_ranges(val_range)
    tolerance = parse_tolerances(atol, rtol)
    in_map, out_map = _pairs(map_inputs, "--map-inputs"), _pairs(map_outputs, "--map-outputs")
    graph_in, graph_out = _pairs(graph_inputs, "--graph-inputs"), _pairs(graph_outputs, "--graph-outputs")
    _check_options(seed, batches, save_outputs, overwrite, (("OLD", old), ("NEW", new)))
    if not isinstance(strict_intermediates, bool) or (strict_intermediates and not localize):
        raise ModelLoadError(f"strict_intermediates: expected True (with localize=True) or False, got "
                             f"{strict_intermediates!r}" + ("" if localize else " without localize"))
    from equivtool._platform import graph_rewrites as _graph_rewrites
    try:
        _graph_rewrites.check_graph_rewrites(graph_rewrites, "--graph-rewrites")
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    if isinstance(load_op_library, (str, os.PathLike)):
        load_op_library = [load_op_library]
    same = [] if not all(isinstance(p, (str, os.PathLike)) for p in (old, new)) or \
        os.path.realpath(os.fspath(old)) != os.path.realpath(os.fspath(new)) else \
        [f"OLD and NEW are the same path ({os.path.realpath(os.fspath(old))}): the model is compared with "
         "itself, which proves only that it is deterministic"]
    interpreter = None
    if old_python is not None:
        interpreter = _check_old_python(old_python, old, data_loader)
    load_op_libraries([os.fspath(p) for p in load_op_library])
    owned = []
    with contextlib.ExitStack() as stack:
        if interpreter is not None:  # OLD is recorded there first, into a folder removed on every exit
            folder = _scratch_folder(stack, "old-python")
            old = _record_in_old_python(interpreter, os.fspath(old), folder,
                                        signature if old_signature is None else old_signature,
                                        tags if old_tags is None else old_tags, graph_in, graph_out,
                                        shapes, ranges, seed, inputs, batches, localize, graph_rewrites)
            owned.append(old)  # closed by _compare_sides, before the folder goes
            inputs = None
            meta = {"old_ran_under": old.ran_under(), **dict(meta or {})}
        return _compare_sides(old, new, owned, signature, tags, graph_in, graph_out, graph_rewrites, shapes,
                              ranges, tolerance, in_map, out_map, seed, inputs, data_loader, batches, localize,
                              save_outputs, meta, started, patterns=patterns, strict_tolerances=strict_tolerances,
                              signatures=((old_signature, old_tags), (new_signature, new_tags)), same=same,
                              strict_intermediates=strict_intermediates, factory=factory)


def _check_old_python(old_python, old, data_loader):
    """The probed old interpreter, after checking what it is to run (before any work)."""
    from equivtool.exported import _old_python
    from equivtool.exported._sides import detect_kind
    if isinstance(old, Side):
        raise ModelLoadError("--old-python: OLD must be a path (a TF1 SavedModel folder or a frozen graph .pb), "
                             f"not a loaded {type(old).__name__}")
    _old_python.check_old(detect_kind(os.fspath(old)), os.fspath(old))
    if data_loader is not None:
        raise ModelLoadError("--data-loader: not with --old-python (the loader runs here); give --inputs "
                             "FILE.npz or generated inputs")
    return _old_python.probe_old_python(os.fspath(old_python))


def _record_in_old_python(interpreter, old: str, folder: str, signature, tags, graph_in, graph_out, shapes,
                          ranges, seed, inputs, batches, localize, graph_rewrites):
    from equivtool.exported import _old_python
    tags = tuple(t for t in tags.split(",") if t) if isinstance(tags, str) else tuple(tags)
    out = os.path.join(folder, "old.npz")
    command = _old_python.recorder_command(
        interpreter.path, _old_python.script_path(folder), os.path.abspath(old), out, signature=signature,
        tags=tags, graph_inputs=graph_in, graph_outputs=graph_out, input_shapes=shapes, val_range=ranges,
        seed=seed, batches=batches, inputs_file=_old_python.inputs_file(inputs, folder), intermediates=localize,
        graph_rewrites=graph_rewrites)
    _old_python.run_recorder(command, old)
    return _old_python.OldInterpreterSide(out, old, interpreter)


def _compare_sides(old, new, owned, signature, tags, graph_in, graph_out, graph_rewrites, shapes, ranges,
                   tolerance, in_map, out_map, seed, inputs, data_loader, batches, localize, save_outputs, meta,
                   started, *, patterns, strict_tolerances, signatures, same,
                   strict_intermediates, factory=None) -> EquivalenceReport:
    from equivtool._platform import graph_rewrites as _graph_rewrites
    try:
        sides = []
        for (which, side), (side_signature, side_tags) in zip((("old", old), ("new", new)), signatures):
            if _weights.is_weights_file(side):  # weights only: loaded into the factory's model
                side = _weights.load_weights_side(side, factory, graph_rewrites)
                owned.append(side)
            elif not isinstance(side, Side):
                try:
                    side = load_side(side, signature=signature if side_signature is None else side_signature,
                                     tags=tags if side_tags is None else side_tags, graph_inputs=graph_in,
                                     graph_outputs=graph_out, graph_rewrites=graph_rewrites)
                except ModelLoadError as exc:  # name the option that chose this side's signature or tags
                    text = str(exc)
                    for option, own in (("signature", side_signature), ("tags", side_tags)):
                        if own is not None and text.startswith(f"--{option}:"):
                            text = f"--{which}-{option}:" + text[len(option) + 3:]
                    raise ModelLoadError(text) from None
                owned.append(side)
            sides.append(side)
        old_side, new_side = sides
        report = _compare(old_side, new_side, shapes, ranges, tolerance, in_map, out_map, seed, inputs,
                          data_loader, batches, localize, save_outputs,
                          {"platform": _graph_rewrites.platform(graph_rewrites, True), **dict(meta or {})}, started,
                          release_old=any(side is old_side for side in owned), patterns=patterns,
                          strict_tolerances=strict_tolerances, extra_notes=same)
        if not strict_intermediates:
            return report
        from equivtool.localize.result import strict_intermediates as _strict
        return EquivalenceReport(tuple(_strict(s) for s in report.steps), report.meta, coverage=report.coverage)
    finally:
        with _signals.shielded():
            for side in owned:
                side.close()


def _compare(old: Side, new: Side, shapes, ranges, tolerance, in_map, out_map, seed, inputs, data_loader,
             batches, localize, save_outputs, extra_meta, started, release_old=False, patterns=(),
             strict_tolerances=False, extra_notes=()) -> EquivalenceReport:
    """The comparison; ``release_old``: OLD was loaded here, and ``--localize`` may
    close it once its node values are written (one model in memory at a time)."""
    input_names, notes = match_names(old.inputs, new.inputs, in_map, "input", "--map-inputs", strict=True)
    output_names, out_notes = match_names(old.outputs, new.outputs, out_map, "output", "--map-outputs",
                                          strict=False)
    notes = list(extra_notes) + notes + out_notes
    output_names = _filter_names(output_names, old, new, patterns)
    renamed = {v: k for k, v in output_names.items()}
    compared = {name for name in [t.name for t in old.outputs] + [renamed.get(t.name, t.name) for t in new.outputs]
                if not patterns or _kept_name(name, patterns)}
    unmatched = unmatched_keys(tolerance, sorted(compared))
    if unmatched and strict_tolerances:
        raise ModelLoadError(f"--strict-tolerances: --atol/--rtol key(s) {', '.join(unmatched)} match no "
                             f"compared output; the outputs are {', '.join(sorted(compared))}")
    if unmatched:
        notes.append(f"--atol/--rtol key(s) {', '.join(unmatched)} match no compared output, so their "
                     "tolerance applied to nothing (--strict-tolerances makes this an error)")
    if inputs is None and data_loader is None and not any(isinstance(s, _record_side()) for s in (old, new)):
        _check_generated(old, shapes, ranges)
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
    for b, (feed, new_feed) in enumerate(zip(feeds, new_feeds)):
        t0 = time.perf_counter()
        everything = old.run(feed)
        expected = {k: v for k, v in everything.items() if not patterns or _kept_name(k, patterns)}
        actual = {renamed.get(k, k): v for k, v in new.run(new_feed).items()}
        actual = {k: v for k, v in actual.items() if not patterns or _kept_name(k, patterns)}
        old_outputs.append(everything)  # a record holds every output, whatever was compared
        name = "outputs" if len(feeds) == 1 else f"outputs/batch{b}"
        title = "signature outputs" if len(feeds) == 1 else f"signature outputs, batch {b}"
        comparison = compare(expected, actual, tolerance)
        step = StepResult.from_comparisons(name, title, comparison, seconds=time.perf_counter() - t0,
                                           notes=notes if b == 0 else (),
                                           data={"proves": {"outputs": output_levels([comparison])}})
        steps.append(step)
    nodes, node_values, graph_def, graph_tensors = (), (), None, {}
    with contextlib.ExitStack() as stack:  # the nodes' values live in a folder until the record holds them
        if localize:
            from equivtool.exported._localize import localize_step
            folder = _scratch_folder(stack, "localize")
            steps[0], nodes, node_values, graph_def, graph_tensors = localize_step(
                steps[0], old, new, feeds[0], new_feeds[0], output_names, tolerance, folder,
                keep_old=save_outputs is not None, release_old=release_old)
        if save_outputs is not None:
            _save(save_outputs, old, feeds, old_outputs, nodes, node_values, graph_def, provenance, graph_tensors)
    report_meta = {
        "command": "compare", "old": old.describe(), "new": new.describe(), "inputs": provenance,
        "batches": len(feeds), "input_shapes": {k: list(np.shape(v)) for k, v in feeds[0].items()},
        "input_map": {k: v for k, v in input_names.items() if k != v},
        "output_map": {k: v for k, v in output_names.items() if k != v},
        "seconds": round(time.perf_counter() - started, 3), **_versions(), **extra_meta,
    }
    if save_outputs is not None:
        report_meta["saved_outputs"] = os.path.abspath(save_outputs)
    return EquivalenceReport(tuple(steps), report_meta, coverage=Coverage.from_steps(steps, owed=("outputs",)))


def _scratch_folder(stack: contextlib.ExitStack, kind: str) -> str:
    """A new folder of ``kind`` (node values, an old interpreter's record) under
    TMPDIR, removed when ``stack`` closes (on SIGTERM and Ctrl-C too); those left
    by killed runs are removed first."""
    temp = tempfile.gettempdir()
    scratch.remove_stale(temp, kind)
    folder = tempfile.mkdtemp(prefix=scratch.prefix(kind), dir=temp)
    stack.callback(_remove_shielded, folder)  # (a kill before this line: the next run removes it)
    return folder


def _remove_shielded(path: str) -> None:
    with _signals.shielded():  # a SIGTERM now waits until the folder is gone
        shutil.rmtree(path, ignore_errors=True)


def _kept_name(name: str, patterns: tuple) -> bool:
    from equivtool.engine.output_filter import kept
    return kept(name, patterns)


def _record_side():
    from equivtool.exported._record import RecordSide
    return RecordSide


def _versions() -> dict:
    import tensorflow as tf
    return {"tensorflow": tf.__version__, "numpy": np.__version__}


def _save(path, old: Side, feeds, outputs, nodes, node_values, graph_def, provenance, graph_tensors=None) -> None:
    """Write OLD's record; ``graph_tensors`` (``{"inputs"|"outputs": {name: tensor}}``)
    names the recorded graph's tensor of each signature tensor that OLD's signature
    leaves unnamed (a TF2 function's), so the record can be localized."""
    def spec(t, role):
        found = dict(t.as_dict())
        found["tensor"] = found["tensor"] or (graph_tensors or {}).get(role, {}).get(t.name, "")
        return found
    header = {"writer": _recorder.writer_info("equivtool compare --save-outputs"),
              "model": {"path": os.path.abspath(old.path), "kind": old.kind, **{k: v for k, v in old.meta.items()
                                                                                   if k != "path"}},
              "inputs": [spec(t, "inputs") for t in old.inputs],
              "outputs": [spec(t, "outputs") for t in old.outputs],
              "provenance": provenance, "notes": []}
    header["model"].pop("provenance", None)
    folder = os.path.dirname(os.path.abspath(path))
    scratch.remove_stale(folder, "record", hidden=True)  # partial records of killed runs
    try:
        _recorder.write_record(path, header, feeds, outputs, nodes, node_values, graph_def,
                               temp_prefix=scratch.prefix("record", hidden=True))
    except OSError as exc:  # a full disk, a folder made read-only during the run: nothing was replaced
        raise ModelLoadError(f"--save-outputs: cannot write {path!r}: {exc.strerror or exc}; "
                             "the existing file, if any, is unchanged") from None
