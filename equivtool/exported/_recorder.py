# equivtool golden-record writer: runs a TF1 SavedModel or a frozen graph and
# writes its inputs and outputs (and optionally every named intermediate) to a
# golden record that `equivtool compare RECORD.npz NEW` replays later.
#
# This file is self-contained on purpose: `equivtool record-script > record.py`
# prints it, to be run in an old environment (TensorFlow 1.15, Python 3.6+)
# where equivtool is not installed. It uses TensorFlow's v1 API through
# `tf.compat.v1` and NumPy only (tests/test_exported_recorder.py checks every
# `tf.` name against TensorFlow 1.15's public API list), and never pickle.
#
#   python record.py MODEL OUT.npz [--signature S] [--tags T]
#       [--graph-inputs NAME=TENSOR,...] [--graph-outputs NAME=TENSOR,...]
#       [--inputs FILE.npz] [--input-shapes NAME:D,D,...] [--val-range NAME:LO,HI]
#       [--seed N] [--batches N] [--intermediates] [--graph-rewrites as_written|tensorflow_default]
#
# In TensorFlow 1.x, tf.contrib's ops (Resampler, ...) are registered only once
# tf.contrib is imported, so it is imported before a model is loaded there.
#
# Record format (version 1): one .npz file holding
#   "__record__"            uint8, UTF-8 JSON: format, version, writer, model,
#                           inputs/outputs (name, dtype, shape, tensor), batches,
#                           provenance, nodes (the intermediates' tensor names,
#                           op names and types, in the graph's topological order)
#   "batch<b>/input/<i>"    the i-th input of batch b (the order of "inputs")
#   "batch<b>/output/<i>"   the i-th output of batch b
#   "node/<k>"              the k-th intermediate, batch 0 (with --intermediates)
#   "__graph__"             uint8, the serialized GraphDef (with --intermediates)
import argparse
import importlib
import json
import os
import pkgutil
import platform
import sys
import tempfile
import zipfile

import numpy as np

FORMAT = "equivtool.golden-record"
VERSION = 1
EQUIVTOOL_VERSION = "0.1.0"
DEFAULT_RANGE = (0.0, 1.0)
WINDOW_BYTES = 64 << 20  # intermediates fetched per session.run (static size)

# ops whose outputs are not computed from the inputs (or not worth recording)
SKIPPED_TYPES = frozenset([
    "Const", "Placeholder", "PlaceholderWithDefault", "VarHandleOp", "VariableV2", "Variable",
    "ReadVariableOp", "NoOp", "AssignVariableOp", "VarIsInitializedOp", "Assign", "Shape", "ShapeN",
    "Size", "Rank", "RestoreV2", "SaveV2", "MergeV2Checkpoints",
])
FIRST_OUTPUT_ONLY = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
# Grappler passes that can change a float result (equivtool._platform.graph_rewrites.NUMERIC_PASSES),
# switched off where this TensorFlow has them
NUMERIC_PASSES = ("remapping", "arithmetic_optimization", "constant_folding", "layout_optimizer",
                  "auto_mixed_precision", "auto_mixed_precision_onednn_bfloat16", "auto_mixed_precision_mkl",
                  "auto_mixed_precision_cpu", "implementation_selector")


class RecordError(ValueError):
    """A bad argument, model or input: one line, exit code 2."""


class UnregisteredOpError(RecordError):
    """The model uses an op this TensorFlow has not registered (yet: see register_contrib_ops)."""


# -- inputs ----------------------------------------------------------------

def input_shape(spec, shapes):
    """The shape to generate for an input spec {"name", "dtype", "shape"} and the
    names of its unknown dimensions that were set to 1."""
    name = spec["name"]
    if name in shapes:
        return tuple(shapes[name]), False
    if spec["shape"] is None:
        return None, True
    shape = tuple(1 if d is None or d < 0 else int(d) for d in spec["shape"])
    return shape, any(d is None or d < 0 for d in spec["shape"])


def generate_inputs(specs, shapes=None, ranges=None, seed=0, batches=1):
    """Seeded random inputs matching each spec's dtype and shape: floats uniform in
    [lo, hi), integers uniform in [lo, hi] (both ends included), bools 0/1.

    Returns (batches: a list of {name: array}, notes: a list of str).
    """
    shapes, ranges = dict(shapes or {}), dict(ranges or {})
    rng = np.random.RandomState(seed)
    notes, result = [], []
    for b in range(batches):
        batch = {}
        for spec in specs:
            name, dtype = spec["name"], np.dtype(spec["dtype"]) if spec["dtype"] != "string" else None
            shape, defaulted = input_shape(spec, shapes)
            if shape is None:
                raise RecordError("input %r has an unknown rank; give its shape with --input-shapes %s:D,D,..."
                                  % (name, name))
            if defaulted and b == 0:
                notes.append("input %r: unknown dimensions set to 1, shape %s (give --input-shapes %s:D,D,...)"
                             % (name, shape, name))
            lo, hi = ranges.get(name, DEFAULT_RANGE)
            if dtype is None or dtype.kind not in "fiub":
                raise RecordError("input %r: cannot generate values of dtype %s; give inputs with --inputs FILE.npz"
                                  % (name, spec["dtype"]))
            if dtype.kind == "b" and name in ranges:
                raise RecordError("--val-range %s:%s,%s: a bool input takes no range" % (name, lo, hi))
            if dtype.kind == "f" and max(abs(lo), abs(hi)) > float(np.finfo(dtype).max):
                raise RecordError("--val-range %s:%s,%s: %s holds at most %g in magnitude"
                                  % (name, lo, hi, dtype, float(np.finfo(dtype).max)))
            if dtype.kind == "f":  # HI excluded, also where rounding to dtype would reach it
                value = rng.uniform(lo, hi, size=shape).astype(dtype)
                value = np.minimum(value, np.nextafter(dtype.type(hi), dtype.type(lo)))
            elif dtype.kind == "b":
                value = rng.randint(0, 2, size=shape).astype(dtype)
            else:
                info = np.iinfo(dtype)
                low, high = int(np.ceil(lo)), int(np.floor(hi))
                if low > high or low < info.min or high > info.max:
                    raise RecordError("--val-range %s:%s,%s holds no %s value" % (name, lo, hi, dtype))
                value = rng.randint(low, high + 1, size=shape, dtype=np.int64).astype(dtype)
            batch[name] = value
        result.append(batch)
    return result, notes


# -- the record file -------------------------------------------------------

def _json_bytes(meta):
    return np.frombuffer(json.dumps(meta, sort_keys=True).encode("utf-8"), dtype=np.uint8)


def _creation_mode():
    """The permission bits a new file gets under this process's umask (0644 under
    the usual 022), as a report written with open() has: mkstemp's are 0600."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # no /proc: read it by setting it, and put it back at once
    os.umask(mask)
    return 0o666 & ~mask


def write_record(path, meta, batches, output_batches, nodes=(), node_values=(), graph_def=None,
                 temp_prefix=".equivtool-"):
    """Write a golden record atomically (a temporary file named ``temp_prefix...``
    in the destination's folder, then a rename; a symlink at the destination is
    replaced, never written through), with the permission bits a new file gets
    under the umask. ``meta`` must hold "inputs" and "outputs" (lists of specs).
    ``node_values`` may be any iterable, a generator too: each value is written
    as it comes and not kept, so the intermediates need not fit in memory
    together. The file is what ``np.savez`` writes (one ``.npy`` per key in a zip).
    Returns the header written."""
    meta = dict(meta)
    meta.update(format=FORMAT, version=VERSION, batches=len(batches),
                nodes=[dict(n) for n in nodes], graph=graph_def is not None)
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix, suffix=".npz", dir=folder)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a record is shared as a report is
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            os.fchmod(f.fileno(), _creation_mode())
            _write_array(archive, "__record__", _json_bytes(meta))
            for b, (inputs, outputs) in enumerate(zip(batches, output_batches)):
                for i, spec in enumerate(meta["inputs"]):
                    _write_array(archive, "batch%d/input/%d" % (b, i), inputs[spec["name"]])
                for i, spec in enumerate(meta["outputs"]):
                    _write_array(archive, "batch%d/output/%d" % (b, i), outputs[spec["name"]])
            count = 0
            for value in node_values:  # (enumerate's cached tuple would hold the last value)
                _write_array(archive, "node/%d" % count, value)
                count += 1
                del value  # not held while the next one is computed
            if count != len(meta["nodes"]):
                raise RecordError("%d intermediate values for %d intermediates" % (count, len(meta["nodes"])))
            if graph_def is not None:
                _write_array(archive, "__graph__", np.frombuffer(graph_def, dtype=np.uint8))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return meta


def _umask():
    """The process's umask (read by setting it, then putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _one_line(exc):
    """An error's message on one line, at most 300 characters."""
    return " ".join(str(exc).split())[:300]


def _write_array(archive, key, value):
    value = np.asarray(value)
    if value.dtype.kind == "O":
        raise RecordError("%s: object arrays cannot be stored without pickle" % key)
    with archive.open(key + ".npy", "w", force_zip64=True) as f:
        np.lib.format.write_array(f, value, allow_pickle=False)


def writer_info(tool):
    import tensorflow as tf
    return {"tool": tool, "equivtool": EQUIVTOOL_VERSION, "tensorflow": tf.__version__,
            "numpy": np.__version__, "python": platform.python_version(), "executable": sys.executable,
            "machine": platform.machine()}


def register_contrib_ops(tf, everything=False):
    """Import tf.contrib on TensorFlow 1.x, whose ops it registers (a SavedModel
    using them does not load otherwise: "Op type not registered 'Resampler'").
    Returns whether it was imported; TensorFlow 2.x has no tf.contrib.
    Some packages of tf.contrib load (and register their ops) only when first
    used; ``everything=True`` imports each of them too (slow: for a model
    that needs one)."""
    version = tf.__version__
    if not version.startswith("1."):
        return False
    try:
        contrib = importlib.import_module("tensorflow.contrib")
    except ImportError:
        return False
    if everything:
        for info in pkgutil.iter_modules(contrib.__path__):
            try:
                importlib.import_module("tensorflow.contrib." + info.name)
            except Exception:  # noqa: BLE001 - a package this build cannot load (tensorrt ...) registers nothing
                pass
    return True


# -- the graph -------------------------------------------------------------

def intermediates(graph, output_tensors):
    """The float outputs of the ops the outputs depend on, in creation order (a
    topological order), that a session can fetch: [(tensor, op)]."""
    wanted, stack = set(), [t.op for t in output_tensors]
    while stack:
        op = stack.pop()
        if op.name in wanted:
            continue
        wanted.add(op.name)
        stack.extend(t.op for t in op.inputs)
    found = []
    for op in graph.get_operations():
        if op.name not in wanted or op.type in SKIPPED_TYPES:
            continue
        context = getattr(op, "_get_control_flow_context", None)
        if context is not None and context() is not None:
            continue
        floats = [t for t in op.outputs if t.dtype.is_floating]
        if op.type in FIRST_OUTPUT_ONLY:
            floats = floats[:1]
        for tensor in floats:
            if graph.is_fetchable(tensor):
                found.append((tensor, op))
    return found


def static_size(tensor, batch=1):
    """A tensor's bytes from its static shape: an unknown first dimension counted
    as ``batch``, any other unknown dimension (or an unknown rank) as 1."""
    size = tensor.dtype.size
    for i, d in enumerate(tensor.shape.as_list() if tensor.shape.ndims is not None else [1]):
        size *= (batch if i == 0 else 1) if d is None else d
    return size


def windows(tensors, budget_bytes):
    """``tensors`` in consecutive slices of at most ``budget_bytes`` of static size
    (one tensor at least)."""
    start = 0
    while start < len(tensors):
        end, size = start, 0
        while end < len(tensors) and (end == start or size + static_size(tensors[end]) <= budget_bytes):
            size += static_size(tensors[end])
            end += 1
        yield tensors[start:end]
        start = end


def fetch_in_windows(session, tensors, feed, budget_bytes=WINDOW_BYTES):
    """Yield the values of ``tensors`` in order, fetching one window of at most
    ``budget_bytes`` of static size per ``session.run``, so that a record's
    intermediates are never all in memory at once."""
    for window in windows(tensors, budget_bytes):
        for value in session.run(window, feed_dict=feed):
            yield value


def tensor_spec(name, tensor):
    shape = None if tensor.shape.ndims is None else [d for d in tensor.shape.as_list()]
    dtype = "string" if tensor.dtype.name == "string" else np.dtype(tensor.dtype.as_numpy_dtype).name
    return {"name": name, "dtype": dtype, "shape": shape, "tensor": tensor.name}


def parse_pairs(text, argument):
    result = {}
    for item in [p for p in (text or "").split(",") if p.strip()]:
        if "=" not in item:
            raise RecordError("%s: expected NAME=TENSOR,..., got %r" % (argument, item))
        name, tensor = item.split("=", 1)
        result[name.strip()] = tensor.strip() if ":" in tensor else tensor.strip() + ":0"
    return result


def signature_tensors(graph, name, info):
    """[(name, tensor)] of one signature output: a dense tensor is itself; a sparse
    one its indices, values and dense_shape ("NAME/indices" ...); a ragged one its
    flat values and row partitions ("NAME/flat_values", "NAME/row_splits_0" ...),
    the names the TF2 side gives the same components."""
    encoding = info.WhichOneof("encoding")
    if encoding == "name":
        return [(name, graph.get_tensor_by_name(info.name))]
    suffixes = ["indices", "values", "dense_shape"]
    if encoding == "coo_sparse":
        sparse = info.coo_sparse
        tensors = [sparse.indices_tensor_name, sparse.values_tensor_name, sparse.dense_shape_tensor_name]
        return [(name + "/" + s, graph.get_tensor_by_name(t)) for s, t in zip(suffixes, tensors)]
    if encoding == "composite_tensor":
        spec = info.composite_tensor.type_spec
        field = spec.DESCRIPTOR.fields_by_name["type_spec_class"]
        kind = field.enum_type.values_by_number[spec.type_spec_class].name
        components = [c.name for c in info.composite_tensor.components]
        if kind == "RAGGED_TENSOR_SPEC":
            suffixes = ["flat_values"] + ["row_splits_%d" % i for i in range(len(components) - 1)]
        elif kind != "SPARSE_TENSOR_SPEC":
            raise RecordError("signature output %r is a composite tensor (%s); equivtool compares dense, ragged "
                              "and sparse outputs" % (name, kind))
        return [(name + "/" + s, graph.get_tensor_by_name(t)) for s, t in zip(suffixes, components)]
    raise RecordError("signature output %r has no tensor (encoding %s)" % (name, encoding))


def load_model(tf, path, signature, tags, graph_inputs, graph_outputs, config):
    """(graph, session, {name: input tensor}, {name: output tensor}, model meta)."""
    graph = tf.compat.v1.Graph()
    session = tf.compat.v1.Session(graph=graph, config=config)
    meta = {"path": os.path.abspath(path), "signature": signature, "tags": list(tags)}
    with graph.as_default():
        if os.path.isdir(path):
            meta["kind"] = "tf1-saved-model"
            try:
                meta_graph = tf.compat.v1.saved_model.loader.load(session, list(tags), path)
            except (RuntimeError, IOError, ValueError, tf.errors.OpError) as exc:
                if "Op type not registered" in str(exc):
                    raise UnregisteredOpError("%s: %s" % (path, _one_line(exc)))
                raise RecordError("%s: cannot load the SavedModel with tags %s: %s"
                                  % (path, ",".join(tags), _one_line(exc)))
            meta["tensorflow_version"] = meta_graph.meta_info_def.tensorflow_version
            if signature not in meta_graph.signature_def:
                raise RecordError("--signature: %r is not in the SavedModel; it has %s"
                                  % (signature, ", ".join(sorted(meta_graph.signature_def)) or "none"))
            sig = meta_graph.signature_def[signature]
            inputs = dict((k, graph.get_tensor_by_name(v.name)) for k, v in sorted(sig.inputs.items()))
            outputs = dict(pair for k, v in sorted(sig.outputs.items()) for pair in signature_tensors(graph, k, v))
        else:
            meta["kind"] = "frozen-graph"
            graph_def = tf.compat.v1.GraphDef()
            try:
                with open(path, "rb") as f:
                    graph_def.ParseFromString(f.read())
            except Exception as exc:  # DecodeError: a truncated or corrupt file
                raise RecordError("%s: not a readable GraphDef (.pb): %s" % (path, exc))
            try:
                tf.compat.v1.import_graph_def(graph_def, name="")
            except (ValueError, tf.errors.OpError) as exc:
                if "Op type not registered" in str(exc):
                    raise UnregisteredOpError("%s: %s" % (path, _one_line(exc)))
                raise RecordError("%s: cannot import the graph: %s" % (path, _one_line(exc)))
            if not graph_inputs or not graph_outputs:
                raise RecordError("a frozen graph needs --graph-inputs NAME=TENSOR,... and --graph-outputs NAME=TENSOR,...")
            try:
                inputs = dict((k, graph.get_tensor_by_name(v)) for k, v in graph_inputs.items())
                outputs = dict((k, graph.get_tensor_by_name(v)) for k, v in graph_outputs.items())
            except (KeyError, ValueError) as exc:
                raise RecordError("--graph-inputs/--graph-outputs: %s" % " ".join(str(exc).split()))
    return graph, session, inputs, outputs, meta


def _parse_shapes(items):
    shapes = {}
    for item in items or ():
        name, _, dims = item.rpartition(":")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise RecordError("--input-shapes: expected NAME:D,D,..., got %r" % item)
    return shapes


def _parse_ranges(items):
    ranges = {}
    for item in items or ():
        name, _, bounds = item.rpartition(":")
        try:
            lo, hi = (float(x) for x in bounds.split(","))
        except ValueError:
            raise RecordError("--val-range: expected NAME:LO,HI, got %r" % item)
        ranges[name] = (lo, hi)
    return ranges


def record(args):
    import tensorflow as tf
    contrib = register_contrib_ops(tf)
    config = tf.compat.v1.ConfigProto()
    rewrites = config.graph_options.rewrite_options
    for name in NUMERIC_PASSES if args.graph_rewrites == "as_written" else ():
        if name in rewrites.DESCRIPTOR.fields_by_name:  # run the graph as written, as equivtool's sessions do
            setattr(rewrites, name, 2)  # RewriterConfig.OFF
    load = (tf, args.model, args.signature, args.tags.split(","), parse_pairs(args.graph_inputs, "--graph-inputs"),
            parse_pairs(args.graph_outputs, "--graph-outputs"), config)
    try:
        graph, session, inputs, outputs, model = load_model(*load)
    except UnregisteredOpError:
        if not register_contrib_ops(tf, everything=True):
            raise
        graph, session, inputs, outputs, model = load_model(*load)  # the op may be in a package loaded now
    in_specs = [tensor_spec(k, t) for k, t in inputs.items()]
    out_specs = [tensor_spec(k, t) for k, t in outputs.items()]
    notes = []
    if args.inputs:
        with np.load(args.inputs, allow_pickle=False) as data:
            missing = [s["name"] for s in in_specs if s["name"] not in data.files]
            if missing:
                raise RecordError("--inputs: %s has no array for input(s) %s" % (args.inputs, ", ".join(missing)))
            batches = [dict((s["name"], data[s["name"]]) for s in in_specs)]
        provenance = "inputs from %s" % os.path.abspath(args.inputs)
    else:
        batches, notes = generate_inputs(in_specs, _parse_shapes(args.input_shapes),
                                         _parse_ranges(args.val_range), args.seed, args.batches)
        provenance = "seeded random inputs (seed %d)" % args.seed
    output_batches = []
    tapped = intermediates(graph, list(outputs.values())) if args.intermediates else []
    for batch in batches:
        feed = dict((inputs[k], v) for k, v in batch.items())
        try:
            output_batches.append(session.run(dict(outputs), feed_dict=feed))
        except (tf.errors.OpError, ValueError) as exc:
            raise RecordError("running the model failed: %s" % _one_line(exc))

    def node_values():  # the first batch's, fetched in windows as the record is written
        feed = dict((inputs[k], v) for k, v in batches[0].items())
        try:
            for value in fetch_in_windows(session, [t for t, _ in tapped], feed):
                yield value
        except (tf.errors.OpError, ValueError) as exc:
            raise RecordError("running the model for its intermediates failed: %s"
                              % _one_line(exc))

    nodes = [{"tensor": t.name, "op": op.name, "type": op.type} for t, op in tapped]
    graph_def = graph.as_graph_def().SerializeToString() if tapped else None
    writer = writer_info("equivtool record-script")
    writer.update(contrib=contrib, graph_rewrites=args.graph_rewrites)
    meta = {"writer": writer, "model": model, "inputs": in_specs,
            "outputs": out_specs, "provenance": provenance, "notes": notes}
    return write_record(args.out, meta, batches, output_batches, nodes, node_values(), graph_def)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Write an equivtool golden record of a TF1 SavedModel "
                                                 "or frozen graph.")
    parser.add_argument("model", help="a SavedModel folder or a frozen GraphDef .pb file")
    parser.add_argument("out", help="the record to write (.npz)")
    parser.add_argument("--signature", default="serving_default")
    parser.add_argument("--tags", default="serve")
    parser.add_argument("--graph-inputs", default=None, help="NAME=TENSOR,... (frozen graph)")
    parser.add_argument("--graph-outputs", default=None, help="NAME=TENSOR,... (frozen graph)")
    parser.add_argument("--inputs", default=None, help="an .npz file with one array per input name")
    parser.add_argument("--input-shapes", action="append", default=[], help="NAME:D,D,... (repeatable)")
    parser.add_argument("--val-range", action="append", default=[], help="NAME:LO,HI (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batches", type=int, default=1)
    parser.add_argument("--intermediates", action="store_true", help="also record every named intermediate")
    parser.add_argument("--graph-rewrites", choices=("as_written", "tensorflow_default"), default="as_written",
                        help="as_written (default): Grappler's numerics-changing passes off")
    args = parser.parse_args(argv)
    try:
        if args.batches < 1:
            raise RecordError("--batches: expected a positive integer, got %d" % args.batches)
        meta = record(args)
    except RecordError as exc:
        sys.stderr.write("record.py: error: %s\n" % exc)
        return 2
    sys.stdout.write("wrote %s: %d batch(es), %d output(s), %d intermediate(s)\n"
                     % (args.out, meta["batches"], len(meta["outputs"]), len(meta["nodes"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
