"""Sides loaded from artifacts: each runs a feed of NumPy inputs and returns NumPy outputs.

One small class per kind of artifact, one interface (:class:`Side`):

* ``inputs`` / ``outputs``: the signature's tensors (:class:`TensorInfo`: name,
  dtype, shape with ``None`` for unknown dimensions);
* ``run(feed) -> {output name: ndarray}``, the feed checked against the inputs
  first;
* ``capabilities``: what the side can do, ``None`` when it can, else the reason
  it cannot (an artifact holds a forward pass: no training, no gradients);
* ``graph_view()``: a graph whose every tensor can be fetched, for
  ``--localize``.

Every side runs a graph as written: TF1 SavedModels and frozen graphs in a
``tf.compat.v1.Session`` whose Grappler passes that can change a float result
are off (``graph_rewrites="as_written"``, :mod:`equivtool._platform.graph_rewrites`), TF2
SavedModels and tf-keras files as their signature's concrete function, called
with the same passes off through the thread's function-call options; so a
verdict does not depend on the CPU. For ``--localize`` a concrete function's
bodies are inlined into one graph that reads the loaded variables (no copy of
the weights), run the same way; each view's nodes are computed in one run that
writes them to disk (:mod:`equivtool.exported._dump`). Before anything is
loaded, the graph's op names are read against TensorFlow's op registry:
unregistered ops are reported with their likely origin instead of TensorFlow's
error deep in loading.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from equivtool.engine import sides as engine_sides
from equivtool.exported import _dump, _recorder
from equivtool.exported._errors import ModelLoadError
from equivtool.exported._errors import short as _short

KINDS = ("tf1-saved-model", "tf2-saved-model", "frozen-graph", "keras", "record")
_KERAS_SUFFIXES = (".h5", ".hdf5", ".keras")
_NOT_TRAINABLE = ("an exported model holds a forward pass only (no training, variables, gradients or "
                  "checkpoints to compare)")


@dataclass(frozen=True)
class TensorInfo:
    """One signature input or output: ``dtype`` a NumPy dtype name (or "string"),
    ``shape`` a tuple with ``None`` for unknown dimensions (``None`` for unknown rank)."""

    name: str
    dtype: str
    shape: Optional[tuple]
    tensor: str = ""

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "(" + ", ".join("?" if d is None else str(d) for d in self.shape) + ")"
        return f"{self.name}: {self.dtype} {dims}"

    def as_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype,
                "shape": None if self.shape is None else list(self.shape), "tensor": self.tensor}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TensorInfo":
        shape = d.get("shape")
        shape = None if shape is None else tuple(None if x is None or x < 0 else int(x) for x in shape)
        return cls(str(d["name"]), str(d["dtype"]), shape, str(d.get("tensor", "")))

    def accepts(self, value: np.ndarray) -> Optional[str]:
        """Why this input rejects ``value`` (None when it accepts it)."""
        dtype = "string" if value.dtype.kind in "SUO" else value.dtype.name
        if dtype != self.dtype:
            return f"dtype {dtype}, the signature takes {self.dtype}"
        if self.shape is not None and (len(self.shape) != value.ndim or any(
                d is not None and d != v for d, v in zip(self.shape, value.shape))):
            return f"shape {value.shape}, the signature takes {str(self)[len(self.name) + 2:]}"
        return None


@dataclass(frozen=True)
class GraphView:
    """A graph whose tensors can be fetched: its output tensors by name, its input
    tensors by name, and ``fetch(tensors) -> values`` with the first batch fed."""

    graph: Any
    inputs: Mapping[str, Any]
    outputs: Mapping[str, Any]
    fetch: Callable[[list], list]
    recorded: Optional[frozenset] = None  # a record: the tensor names it holds
    # dump(tensors, folder) -> read(tensor) -> ndarray: computes every tensor in one run,
    # writing each value under folder as it is computed (memory stays that of one run);
    # None: fetch reads one tensor at a time already (a record)
    dump: Optional[Callable[[list, str], Callable[[Any], np.ndarray]]] = None
    # measure(tensors) -> [bytes or None]: each tensor's size in one run that keeps no
    # value (for the disk check when static shapes are not fully known); None: not offered
    measure: Optional[Callable[[list], list]] = None

    def dumped(self, tensors: list, folder: str, budget_bytes: int) -> Callable[[Any], np.ndarray]:
        """``read(tensor) -> value`` for each of ``tensors``, the first batch fed: from one
        run's dump when the view has one, else fetched one at a time."""
        if self.dump is None or not tensors:
            return lambda tensor: self.fetch([tensor])[0]
        return self.dump(tensors, folder, budget_bytes)


class Side(engine_sides.Side):
    """The interface every loaded side offers (see the module docstring), on the
    engine's side protocol: it can run a forward pass and give every node's
    output; it refuses training, variables, gradients and checkpoints."""

    KIND = "exported model"
    CAPABILITIES = frozenset({engine_sides.FORWARD, engine_sides.INTERMEDIATES})
    REFUSALS = {c: _NOT_TRAINABLE for c in (engine_sides.VARIABLES, engine_sides.GRADIENTS,
                                            engine_sides.TRAINING, engine_sides.CHECKPOINTS)}

    kind: str = ""
    path: str = ""
    inputs: tuple = ()
    outputs: tuple = ()
    meta: Mapping[str, Any] = {}
    notes: tuple = ()

    @property
    def capabilities(self) -> Mapping[str, Optional[str]]:
        """Capability -> None when this side can, else the reason it cannot."""
        found = {c: self.refuses(c) for c in engine_sides.CAPABILITIES}
        found[engine_sides.INTERMEDIATES] = found[engine_sides.INTERMEDIATES] or self._intermediates_reason()
        return found

    def _intermediates_reason(self) -> Optional[str]:
        return None

    def run(self, feed: Mapping[str, np.ndarray]) -> dict:
        raise NotImplementedError

    def graph_view(self, feed: Mapping[str, np.ndarray]) -> GraphView:
        raise NotImplementedError

    def close(self) -> None:
        pass

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has released what the side runs (it cannot run again)."""
        return False

    def describe(self) -> dict:
        return {"path": self.path, "kind": self.kind, **{k: v for k, v in self.meta.items() if k != "path"},
                "inputs": [str(t) for t in self.inputs], "outputs": [str(t) for t in self.outputs]}

    def check_feed(self, feed: Mapping[str, np.ndarray], argument: str = "inputs") -> None:
        names = [t.name for t in self.inputs]
        missing = [n for n in names if n not in feed]
        extra = [n for n in feed if n not in names]
        if missing or extra:
            raise ModelLoadError(f"{argument}: {self.path} takes inputs {', '.join(names)}; "
                                 + (f"missing {', '.join(missing)}" if missing else "")
                                 + ("; " if missing and extra else "")
                                 + (f"unknown {', '.join(extra)}" if extra else ""))
        for spec in self.inputs:
            problem = spec.accepts(np.asarray(feed[spec.name]))
            if problem:
                raise ModelLoadError(f"{argument}: input {spec.name!r} of {self.path}: {problem}")

    def __enter__(self) -> "Side":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------
# graph sides
# --------------------------------------------------------------------------

def session_config(graph_rewrites: str = "as_written"):
    """The sessions' options: under "as_written" every Grappler pass that can change a
    float result is off (:mod:`equivtool._platform.graph_rewrites`): the graph runs as written."""
    from equivtool._platform import graph_rewrites as _graph_rewrites
    return _graph_rewrites.rewrite_config(graph_rewrites)


class GraphSide(Side):
    """A graph in a session, with the signature's input and output tensors."""

    def __init__(self, kind, path, graph, session, inputs, outputs, meta, notes=()):
        self.kind, self.path, self.graph, self.session = kind, path, graph, session
        self.input_tensors, self.output_tensors = dict(inputs), dict(outputs)
        self.inputs = tuple(TensorInfo.from_dict(_recorder.tensor_spec(k, t)) for k, t in inputs.items())
        self.outputs = tuple(TensorInfo.from_dict(_recorder.tensor_spec(k, t)) for k, t in outputs.items())
        self.meta, self.notes = dict(meta), tuple(notes)

    def _feed_dict(self, feed):
        self.check_feed(feed)
        return {self.input_tensors[k]: np.asarray(v) for k, v in feed.items()}

    def run(self, feed: Mapping[str, np.ndarray]) -> dict:
        import tensorflow as tf
        feed_dict = self._feed_dict(feed)
        try:
            return self.session.run(dict(self.output_tensors), feed_dict=feed_dict)
        except (tf.errors.OpError, ValueError) as exc:
            raise ModelLoadError(f"{self.path}: running the model failed: {_short(exc)}") from None

    def graph_view(self, feed: Mapping[str, np.ndarray]) -> GraphView:
        feed_dict = self._feed_dict(feed)

        def fetch(tensors):
            return self.session.run(tensors, feed_dict=feed_dict)

        def dump(tensors, folder, budget_bytes):
            return _dump.session_dump(self.session, self.graph, feed_dict, tensors, folder, budget_bytes, fetch)

        def measure(tensors):
            return _dump.session_sizes(self.session, feed_dict, tensors)

        return GraphView(self.graph, self.input_tensors, self.output_tensors, fetch, dump=dump, measure=measure)

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    @property
    def closed(self) -> bool:
        return self.session is None


# --------------------------------------------------------------------------
# unregistered ops
# --------------------------------------------------------------------------

def _origin(op: str) -> str:
    if op.startswith("Addons>"):
        return "TF Addons (pip install tensorflow-addons)"
    if ">" in op:
        return f"the custom-op library of namespace {op.split('>', 1)[0]!r}"
    return "tf.contrib (removed in TF2) or a custom-op library"


def check_registered_ops(graph_def, path: str) -> None:
    """Raise :class:`ModelLoadError` naming the ops of ``graph_def`` (and of its
    function library) that TensorFlow's op registry does not know."""
    from equivtool._platform import tf_internals as _tf_internals
    functions = {f.signature.name for f in graph_def.library.function}
    ops = {n.op for n in graph_def.node}
    for f in graph_def.library.function:
        ops.update(n.op for n in f.node_def)
    missing = sorted(op for op in ops - functions if _tf_internals.op_def_registry.get(op) is None)
    if missing:
        listed = "; ".join(f"{op} (likely from {_origin(op)})" for op in missing[:5])
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ModelLoadError(f"{path}: unregistered op(s) {listed}{more}; load their library with "
                             f"--load-op-library PATH.so (Python: load_op_libraries=[...])")


def load_op_libraries(paths: Sequence[str]) -> None:
    import tensorflow as tf
    for path in paths:
        if not os.path.isfile(path):
            raise ModelLoadError(f"--load-op-library: {path!r} is not a file; expected a compiled op library (.so)")
        try:
            tf.load_op_library(os.path.abspath(path))
        except Exception as exc:  # noqa: BLE001 - reported as one line
            raise ModelLoadError(f"--load-op-library: cannot load {path!r}: {_short(exc)}") from None


# --------------------------------------------------------------------------
# reading what a path is
# --------------------------------------------------------------------------

def _read_saved_model(path: str):
    from equivtool._platform import tf_internals as _tf_internals
    proto = _tf_internals.SavedModel()
    pb = os.path.join(path, "saved_model.pb")
    try:
        with open(pb, "rb") as f:
            proto.ParseFromString(f.read())
    except Exception as exc:  # noqa: BLE001 - DecodeError: truncated or corrupt
        raise ModelLoadError(f"{pb}: not a readable SavedModel protocol buffer: {_short(exc)}") from None
    if not proto.meta_graphs:
        raise ModelLoadError(f"{pb}: the SavedModel holds no MetaGraph")
    return proto


def _meta_graph(proto, path: str, tags: Sequence[str], signature: str):
    wanted = set(tags)
    for meta_graph in proto.meta_graphs:
        if set(meta_graph.meta_info_def.tags) == wanted:
            break
    else:
        have = "; ".join(",".join(m.meta_info_def.tags) or "(none)" for m in proto.meta_graphs)
        raise ModelLoadError(f"--tags: {path} has no MetaGraph tagged {','.join(tags)!r}; its tag sets: {have}")
    signatures = sorted(k for k in meta_graph.signature_def if not k.startswith("__"))
    if signature not in meta_graph.signature_def:
        raise ModelLoadError(f"--signature: {path} has no signature {signature!r}; "
                             f"its signatures: {', '.join(signatures) or '(none)'}")
    return meta_graph


def detect_kind(path: str) -> str:
    """Which kind of artifact ``path`` is (see :data:`KINDS`)."""
    if not os.path.exists(path):
        raise ModelLoadError(f"{path!r} does not exist; expected a SavedModel folder, a frozen graph .pb, "
                             "a Keras .h5/.keras file (tf-keras or Keras 3) or a golden record .npz")
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "saved_model.pb")):
            raise ModelLoadError(f"{path!r} is a folder without saved_model.pb: not a SavedModel")
        proto = _read_saved_model(path)
        has_objects = any(len(m.object_graph_def.nodes) for m in proto.meta_graphs)
        return "tf2-saved-model" if has_objects else "tf1-saved-model"
    lower = path.lower()
    if lower.endswith(".npz"):
        return "record"
    if lower.endswith(".pb"):
        return "frozen-graph"
    if lower.endswith(_KERAS_SUFFIXES):
        return "keras"
    raise ModelLoadError(f"{path!r} is not a model or record: expected a SavedModel folder, a frozen graph .pb, "
                         "a Keras .h5/.keras file (tf-keras or Keras 3) or a golden record .npz")


# --------------------------------------------------------------------------
# loaders
# --------------------------------------------------------------------------

def load_tf1(path, kind, signature, tags, graph_inputs, graph_outputs, graph_rewrites) -> GraphSide:
    import tensorflow as tf
    if kind == "tf1-saved-model":
        meta_graph = _meta_graph(_read_saved_model(path), path, tags, signature)
        check_registered_ops(meta_graph.graph_def, path)
    else:
        graph_def = tf.compat.v1.GraphDef()
        try:
            with open(path, "rb") as f:
                graph_def.ParseFromString(f.read())
        except Exception as exc:  # noqa: BLE001 - DecodeError: truncated or corrupt
            raise ModelLoadError(f"{path}: not a readable GraphDef (truncated or corrupt .pb): {_short(exc)}") \
                from None
        check_registered_ops(graph_def, path)
        if not graph_inputs or not graph_outputs:
            raise ModelLoadError(f"{path}: a frozen graph needs --graph-inputs NAME=TENSOR,... and "
                                 "--graph-outputs NAME=TENSOR,... (Python: graph_inputs=, graph_outputs=)")
    try:
        graph, session, inputs, outputs, meta = _recorder.load_model(
            tf, path, signature, tags, graph_inputs, graph_outputs, session_config(graph_rewrites))
    except _recorder.RecordError as exc:
        raise ModelLoadError(str(exc)) from None
    except (tf.errors.OpError, ValueError, KeyError) as exc:
        raise ModelLoadError(f"{path}: cannot load: {_short(exc)}") from None
    return GraphSide(kind, path, graph, session, inputs, outputs, meta)


def _inlined_view(function, input_names, output_names, values, path, graph_rewrites) -> GraphView:
    """A concrete function with its function bodies inlined, as a graph whose every
    tensor can be fetched, reading the loaded variables where they are, fed
    ``values`` (the inputs as tensors, in ``input_names`` order).

    Grappler's function inlining (the step ``convert_variables_to_constants_v2``
    takes before freezing) gives one flat GraphDef whose captured variables are
    placeholders; it is imported into a ``tf.compat.v1.wrap_function`` graph with
    those placeholders mapped to the loaded variables' handles, so no copy of the
    weights is made (freezing held three: the constants' GraphDef, the imported
    graph and the session's kernels). ``fetch`` prunes the graph to the asked
    tensors and calls it with the thread's function-call options switched to the
    ``graph_rewrites`` passes; ``dump`` writes them all in one call
    (:func:`equivtool.exported._dump.function_dump`). Each view is made afresh: ``dump`` adds its writes
    to the view's graph.
    """
    import tensorflow as tf
    from equivtool._platform import graph_rewrites as _graph_rewrites
    from equivtool._platform import tf_internals as _tf_internals
    try:
        graph_def = _tf_internals.inline_graph_optimization(function, True, False)
    except Exception as exc:  # noqa: BLE001 - a function Grappler cannot inline
        raise ModelLoadError(f"{path}: cannot inline the signature into one graph: {_short(exc)}") from None
    captures = list(function.graph.captures)
    user_inputs = [t.name for t in function.inputs[:len(function.inputs) - len(captures)]]
    output_tensors = [t.name for t in function.outputs]

    def body():
        graph = tf.compat.v1.get_default_graph()
        input_map = {internal.name: graph.capture(external) for external, internal in captures}
        tf.compat.v1.import_graph_def(graph_def, input_map=input_map, name="")

    try:
        wrapped = tf.compat.v1.wrap_function(body, signature=[])
    except Exception as exc:  # noqa: BLE001 - an inlined graph that does not import
        raise ModelLoadError(f"{path}: cannot import the inlined signature: {_short(exc)}") from None
    del graph_def
    graph = wrapped.graph
    inputs = {n: graph.get_tensor_by_name(t) for n, t in zip(input_names, user_inputs)}
    outputs = {n: graph.get_tensor_by_name(t) for n, t in zip(output_names, output_tensors)}
    feeds = list(inputs.values())

    def fetch(tensors):
        pruned = wrapped.prune(feeds=feeds, fetches=list(tensors))
        with _graph_rewrites.function_rewrites(graph_rewrites):
            results = pruned(*values)
        return [r.numpy() for r in results]

    def dump(tensors, folder, budget_bytes):  # one run writes them all: no windows
        return _dump.function_dump(wrapped, feeds, values, tensors, folder, graph_rewrites)

    def measure(tensors):
        return _dump.function_sizes(wrapped, feeds, values, tensors, graph_rewrites)

    return GraphView(graph, inputs, outputs, fetch, dump=dump, measure=measure)


def _info(name: str, spec) -> TensorInfo:
    dtype = "string" if spec.dtype.name == "string" else np.dtype(spec.dtype.as_numpy_dtype).name
    shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
    return TensorInfo(name, dtype, shape)


def component_names(name: str, kind: str, count: int) -> list:
    """The names a composite output's component tensors are compared under: a
    ``tf.SparseTensor`` ``y`` is ``y/indices``, ``y/values``, ``y/dense_shape``;
    a ``tf.RaggedTensor`` is ``y/flat_values`` then ``y/row_splits_0`` ... (its
    row partitions, outermost first), the order ``tf.nest.flatten(...,
    expand_composites=True)`` gives; a dense tensor is ``y``."""
    if kind == "sparse":
        return [f"{name}/indices", f"{name}/values", f"{name}/dense_shape"]
    if kind == "ragged":
        return [f"{name}/flat_values"] + [f"{name}/row_splits_{i}" for i in range(count - 1)]
    return [name]


def _component_names(function, output_names) -> list:
    """One name per tensor of ``function.outputs`` (the flattened outputs: a ragged
    or sparse output is several tensors), as :func:`component_names` gives them."""
    import tensorflow as tf
    structured = function.structured_outputs
    if not isinstance(structured, Mapping):
        return list(output_names)
    names = []
    for name in output_names:
        value = structured[name]
        count = len(tf.nest.flatten(value, expand_composites=True))
        kind = ("sparse" if isinstance(value, (tf.SparseTensor, tf.SparseTensorSpec)) else
                "ragged" if isinstance(value, (tf.RaggedTensor, tf.RaggedTensorSpec)) else "dense")
        if kind == "dense" and count != 1:
            raise ModelLoadError(f"signature output {name!r} is a composite tensor of type "
                                 f"{type(value).__name__}; equivtool compares dense, ragged and sparse outputs")
        names += component_names(name, kind, count)
    return names


class FunctionSide(Side):
    """A TF2 concrete function: a SavedModel's signature, or a tf-keras model's forward pass.

    ``run`` calls it with this thread's function-call options switched to the
    ``graph_rewrites`` passes (:func:`equivtool._platform.graph_rewrites.function_rewrites`,
    restored on every exit path); ``graph_view`` inlines it into one graph for
    ``--localize`` (:func:`_inlined_view`: the variables are read, not copied).
    """

    def __init__(self, kind, path, function, input_names, output_names, meta, graph_rewrites, owner=None):
        self.kind, self.path, self.function, self.owner = kind, path, function, owner  # owner keeps it alive
        self.input_names, self.output_names = list(input_names), list(output_names)
        specs = function.structured_input_signature
        flat_specs = [specs[1][n] for n in self.input_names] if specs[1] else list(specs[0])
        self.inputs = tuple(_info(n, spec) for n, spec in zip(self.input_names, flat_specs))
        self.outputs = tuple(_info(n, t) for n, t in zip(_component_names(function, self.output_names),
                                                          function.outputs))
        self.meta, self.notes, self.graph_rewrites = dict(meta), (), graph_rewrites

    def run(self, feed: Mapping[str, np.ndarray]) -> dict:
        import tensorflow as tf
        from equivtool._platform import graph_rewrites as _graph_rewrites
        self.check_feed(feed)
        args = [tf.convert_to_tensor(np.asarray(feed[n])) for n in self.input_names]
        try:
            with _graph_rewrites.function_rewrites(self.graph_rewrites):
                if self.function.structured_input_signature[1]:
                    result = self.function(**dict(zip(self.input_names, args)))
                else:
                    result = self.function(*args)
        except (tf.errors.OpError, ValueError, TypeError) as exc:
            raise ModelLoadError(f"{self.path}: running the model failed: {_short(exc)}") from None
        values = [result[n] for n in self.output_names] if isinstance(result, Mapping) else tf.nest.flatten(result)
        # a ragged or sparse output is its component tensors (see _component_names)
        components = [c for v in values for c in tf.nest.flatten(v, expand_composites=True)]
        return {t.name: c.numpy() for t, c in zip(self.outputs, components)}

    def graph_view(self, feed: Mapping[str, np.ndarray]) -> GraphView:
        import tensorflow as tf
        self.check_feed(feed)
        values = [tf.convert_to_tensor(np.asarray(feed[n])) for n in self.input_names]
        return _inlined_view(self.function, self.input_names, [t.name for t in self.outputs], values, self.path,
                             self.graph_rewrites)

    def close(self) -> None:
        self.function = self.owner = None  # what holds the loaded variables

    @property
    def closed(self) -> bool:
        return self.function is None


def load_tf2(path, signature, tags, graph_rewrites) -> FunctionSide:
    import tensorflow as tf
    meta_graph = _meta_graph(_read_saved_model(path), path, tags, signature)
    check_registered_ops(meta_graph.graph_def, path)
    try:
        loaded = tf.saved_model.load(path, tags=list(tags))
        function = loaded.signatures[signature]
    except Exception as exc:  # noqa: BLE001 - corrupt variables, missing assets ...
        raise ModelLoadError(f"{path}: cannot load the TF2 SavedModel: {_short(exc)}") from None
    input_names = sorted(function.structured_input_signature[1])
    output_names = sorted(function.structured_outputs)  # the order of function.outputs (flattened dict)
    meta = {"signature": signature, "tags": list(tags),
            "tensorflow_version": meta_graph.meta_info_def.tensorflow_version}
    return FunctionSide("tf2-saved-model", path, function, input_names, output_names, meta, graph_rewrites,
                        owner=loaded)


def keras_file_version(path) -> str | None:
    """The ``keras_version`` a Keras model file was saved with (a ``.keras`` zip's
    ``metadata.json``, an ``.h5`` file's root attribute), or None when it says none
    (or h5py, which reads ``.h5``, is not installed)."""
    import json
    import zipfile
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                version = json.loads(archive.read("metadata.json")).get("keras_version")
        else:
            import h5py
            with h5py.File(path, "r") as handle:
                version = handle.attrs.get("keras_version")
    except (ImportError, OSError, KeyError, ValueError):
        return None
    if isinstance(version, bytes):
        version = version.decode("utf-8", "replace")
    return str(version) if version else None


def load_keras(path, graph_rewrites) -> FunctionSide:
    """Load a Keras model file with the Keras that wrote it: Keras 3 for a file
    saved by ``keras`` 3.x, tf-keras otherwise (``tf.keras`` is tf-keras here)."""
    import tensorflow as tf
    version = keras_file_version(path)
    if version is not None and version.split(".")[0] == "3":
        import keras
        load, flavour = keras.models.load_model, "Keras 3"
    else:
        load, flavour = tf.keras.models.load_model, "tf-keras"
    try:
        model = load(path, compile=False)
    except Exception as exc:  # noqa: BLE001 - not a model file, unknown custom layers ...
        saved = f" (saved by Keras {version})" if version else ""
        raise ModelLoadError(f"{path}: cannot load the {flavour} model{saved}: {_short(exc)}") from None
    return keras_model_side(model, path, graph_rewrites)


def keras_model_side(model, path, graph_rewrites) -> FunctionSide:
    """A loaded Keras model (tf-keras or Keras 3) as a side: its inference forward pass."""
    import tensorflow as tf
    # Keras 3 models have no input_names; their inputs are named tensors.
    input_names = list(getattr(model, "input_names", None) or [t.name for t in model.inputs])
    output_names = list(model.output_names)
    specs = [tf.TensorSpec(t.shape, t.dtype, name=n) for n, t in zip(input_names, model.inputs)]

    def forward(*args):
        result = model(list(args) if len(args) > 1 else args[0], training=False)
        return tf.nest.flatten(result)

    function = tf.function(forward, input_signature=specs).get_concrete_function()
    return FunctionSide("keras", path, function, input_names, output_names, {}, graph_rewrites, owner=model)
