"""A golden record as a side: the inputs, outputs and intermediates another run wrote.

The format (version 1) is written by :mod:`equivtool.exported._recorder` (the
same code ``equivtool record-script`` prints for an old environment) and is
documented there: one ``.npz`` (read with ``allow_pickle=False``) holding a
JSON header and plain arrays. A record of another format version, or one
written by a newer equivtool, is refused with a one-line error.
"""

from __future__ import annotations

import json
import os
from typing import Mapping, Optional

import numpy as np

from equivtool._base.errors import short
from equivtool.exported import _recorder
from equivtool.exported._sides import GraphView, ModelLoadError, Side, TensorInfo, check_registered_ops


def recorder_source() -> str:
    """The recorder's source: what ``equivtool record-script`` prints and ``--old-python`` runs."""
    with open(_recorder.__file__.replace(".pyc", ".py"), encoding="utf-8") as f:
        return f.read()


def _version_tuple(text: str) -> tuple:
    parts = []
    for part in str(text).split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def read_header(path: str) -> tuple[dict, np.lib.npyio.NpzFile]:
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - not a zip, truncated ...
        raise ModelLoadError(f"{path}: not a readable .npz golden record: {short(exc, None)}") from None
    try:
        if "__record__" not in data.files:
            raise ModelLoadError(f"{path}: an .npz without '__record__': not an equivtool golden record "
                                 "(write one with --save-outputs or equivtool record-script)")
        try:
            meta = json.loads(bytes(data["__record__"]).decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"{path}: the record's header is not JSON: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a corrupt zip member (BadZipFile, zlib.error, EOFError ...)
            raise ModelLoadError(f"{path}: the record's header cannot be read (a corrupt or truncated .npz): "
                                 f"{type(exc).__name__}: {short(exc, None)}") from None
        if not isinstance(meta, dict):
            raise ModelLoadError(f"{path}: the record's header is JSON {type(meta).__name__}, expected an object")
        if meta.get("format") != _recorder.FORMAT:
            raise ModelLoadError(f"{path}: format {meta.get('format')!r}, expected {_recorder.FORMAT!r}")
        if meta.get("version") != _recorder.VERSION:
            raise ModelLoadError(f"{path}: record format version {meta.get('version')!r}; this equivtool reads "
                                 f"version {_recorder.VERSION} (re-record it with this equivtool's record-script)")
        _check_header_types(path, meta)
        writer = (meta.get("writer") or {}).get("equivtool", "0")
        from equivtool import __version__
        if _version_tuple(writer) > _version_tuple(__version__):
            raise ModelLoadError(f"{path}: written by equivtool {writer}, newer than this equivtool "
                                 f"{__version__}; upgrade equivtool to read it")
    except BaseException:
        data.close()
        raise
    return meta, data


def _check_header_types(path: str, meta: dict) -> None:
    """Each header field of the type the format gives it (a hand-edited or
    foreign header fails here with one line, not deep in the replay)."""
    def refuse(field, expected, value):
        raise ModelLoadError(f"{path}: the record's header field {field!r} is {json.dumps(value)[:80]}, "
                             f"expected {expected} (a corrupt or hand-edited record; write it again)")

    batches = meta.get("batches")
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        refuse("batches", "a positive integer", batches)
    for field in ("inputs", "outputs"):
        specs = meta.get(field)
        if not isinstance(specs, list) or (field == "inputs" and not specs):
            refuse(field, "a list of tensor specs" + (" (at least one)" if field == "inputs" else ""), specs)
        for spec in specs:
            shape = spec.get("shape") if isinstance(spec, dict) else None
            if not (isinstance(spec, dict) and isinstance(spec.get("name"), str) and spec["name"]
                    and isinstance(spec.get("dtype"), str) and isinstance(spec.get("tensor", ""), str)
                    and (shape is None or (isinstance(shape, list) and all(
                        d is None or (isinstance(d, int) and not isinstance(d, bool)) for d in shape)))):
                refuse(field, 'specs {"name": str, "dtype": str, "shape": [int or null, ...] or null, '
                              '"tensor": str}', spec)
        names = [spec["name"] for spec in specs]
        if len(set(names)) != len(names):
            refuse(field, "specs with distinct names", names)
    for field, kind, name in (("nodes", list, "a list"), ("notes", list, "a list"),
                              ("model", dict, "an object"), ("writer", dict, "an object"),
                              ("provenance", str, "a string")):
        if meta.get(field) is not None and not isinstance(meta[field], kind):
            refuse(field, name, meta[field])
    if not all(isinstance(node, dict) and isinstance(node.get("tensor"), str) for node in meta.get("nodes") or ()):
        refuse("nodes", 'a list of {"tensor": str, ...}', meta["nodes"])


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shape, dtype and values, NaN equal to NaN (a batch's inputs may hold NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


class RecordSide(Side):
    """A golden record: ``run(feed)`` returns the outputs recorded for the batch
    whose inputs equal ``feed``; localization uses the intermediates it holds."""

    kind = "record"

    def __init__(self, path: str):
        self.path = os.fspath(path)
        meta, data = read_header(self.path)
        self._data = data
        try:
            self.inputs = tuple(TensorInfo.from_dict(d) for d in meta["inputs"])
            self.outputs = tuple(TensorInfo.from_dict(d) for d in meta["outputs"])
            self.batches = []
            for b in range(int(meta["batches"])):
                inputs = {t.name: data[f"batch{b}/input/{i}"] for i, t in enumerate(self.inputs)}
                outputs = {t.name: data[f"batch{b}/output/{i}"] for i, t in enumerate(self.outputs)}
                self.batches.append((inputs, outputs))
        except KeyError as exc:
            data.close()
            raise ModelLoadError(f"{self.path}: an incomplete or corrupt golden record: missing {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a corrupt member: BadZipFile, zlib.error, EOFError, ValueError
            data.close()
            raise ModelLoadError(f"{self.path}: a corrupt golden record (a member cannot be read): "
                                 f"{type(exc).__name__}: {short(exc, None)}") from None
        self.nodes = tuple(meta.get("nodes") or ())
        self.header = meta
        model = dict(meta.get("model") or {})
        writer = dict(meta.get("writer") or {})
        self.meta = {"recorded_from": model.get("path", ""), "recorded_kind": model.get("kind", ""),
                     "signature": model.get("signature", ""), "tags": model.get("tags", []),
                     "tensorflow_version": model.get("tensorflow_version", ""),
                     "recorded_with": f"{writer.get('tool', '?')} (TensorFlow {writer.get('tensorflow', '?')}, "
                                      f"equivtool {writer.get('equivtool', '?')})",
                     "provenance": meta.get("provenance", "")}
        self.notes = tuple(meta.get("notes") or ())

    def _intermediates_reason(self) -> Optional[str]:
        if not self.nodes or not self.header.get("graph"):
            return "the record holds no intermediates (record it with --localize or --intermediates)"
        unnamed = [t.name for t in self.inputs + self.outputs if not t.tensor]
        if unnamed:
            return (f"the record does not name the graph tensors of {', '.join(unnamed)} (written by an older "
                    "equivtool from a TF2 model); record it again with --save-outputs --localize")
        return None

    def input_provenance(self) -> str:
        """Where the inputs this record replays came from, for the report."""
        return f"the inputs of golden record {self.path} ({self.meta.get('provenance')})"

    def input_batches(self) -> list:
        return [dict(inputs) for inputs, _ in self.batches]

    def _batch(self, feed: Mapping[str, np.ndarray]) -> int:
        self.check_feed(feed)
        for b, (inputs, _) in enumerate(self.batches):
            if all(_same(feed[k], v) for k, v in inputs.items()):
                return b
        raise ModelLoadError(f"{self.path}: the record holds no batch with these inputs; a record replays only "
                             "the inputs it was written with")

    def run(self, feed: Mapping[str, np.ndarray]) -> dict:
        _, outputs = self.batches[self._batch(feed)]
        return {k: np.asarray(v) for k, v in outputs.items()}

    def graph_view(self, feed: Mapping[str, np.ndarray]) -> GraphView:
        reason = self._intermediates_reason()
        if reason:
            raise ModelLoadError(f"--localize: {self.path}: {reason}")
        if self._batch(feed) != 0:
            raise ModelLoadError(f"--localize: {self.path} holds intermediates of its first batch only")
        import tensorflow as tf
        graph_def = tf.compat.v1.GraphDef()
        graph_def.ParseFromString(bytes(self._data["__graph__"]))
        check_registered_ops(graph_def, self.path)
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.import_graph_def(graph_def, name="")
        values = {node["tensor"]: k for k, node in enumerate(self.nodes)}
        for spec in self.outputs:  # outputs are fetchable too
            values.setdefault(spec.tensor, ("output", spec.name))
        inputs = {t.name: graph.get_tensor_by_name(t.tensor) for t in self.inputs}
        outputs = {t.name: graph.get_tensor_by_name(t.tensor) for t in self.outputs}
        recorded_outputs = self.batches[0][1]

        def fetch(tensors):
            result = []
            for tensor in tensors:
                key = values[tensor.name]
                result.append(recorded_outputs[key[1]] if isinstance(key, tuple) else self._data[f"node/{key}"])
            return result

        return GraphView(graph, inputs, outputs, fetch, recorded=frozenset(values))

    def close(self) -> None:
        self._data.close()
        self._closed = True

    @property
    def closed(self) -> bool:
        return getattr(self, "_closed", False)
