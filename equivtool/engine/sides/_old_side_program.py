# The TF1 side of check_equivalence, run in another interpreter: a real
# TensorFlow 1.x (1.15 on Python 3.6/3.7), where the old code ran as written
# (tf.contrib included), not through tf.compat.v1 inside TensorFlow 2.
#
# Self-contained on purpose: Python 3.6 syntax, the TensorFlow 1.x API and
# NumPy only, no equivtool import, no pickle (tests/test_old_side_program.py
# checks its tf. names against TensorFlow 1.15's API list and its syntax
# against Python 3.6). equivtool.engine.sides.old_python starts it as
#
#   python _old_side_program.py FOLDER
#
# and speaks to it over its stdin/stdout: one JSON object per line each way,
# arrays as .npz files in FOLDER (written by one side, read and deleted by the
# other; the parent removes FOLDER on every exit). Anything the user's code
# prints goes to stderr, so the answers on stdout stay one JSON line each.
#
# Requests ({"op": ..., ...}) and what they answer besides {"ok": true}:
#   hello                      versions: python, tensorflow, machine, executable, contrib, cpu_build,
#                              eager (whether v2 behaviour is on: refused)
#   open handle fn path inputs structure seed mode tool graph_rewrites loss [kernel_floor] [kinks]
#                              a new graph and session; fn (and loss, when given:
#                              "module:function") imported; kernel_floor: every pass and
#                              training built there has rounding injected at every op
#                              (perturb_ops), and forward/train_build answer kernel_floor
#                              (what was perturbed and skipped); kinks: every pass with
#                              gradients also builds them routed at its kinks (see route)
#   forward handle training gradients
#                              one more forward pass (the first creates the variables):
#                              variables [{name, op, shape, dtype, trainable}], outputs
#                              (the structure), loops, flags, kinks [{name, type, shape,
#                              dtype, attrs, unroutable}] (with kinks and gradients)
#   route_train handle train steps file kinks
#                              steps of the training with its kinks routed by file's values
#                              (kinks: [step, kink index] per value), each in a new session:
#                              file, names (loss/S, kink/S/I, variables/S/NAME)
#   route handle pass file     the pass's gradients routed at its kinks by the values in
#                              file (kink i's input as the other side computed it, "k<i>"),
#                              beside the gradients as computed and each kink's input here,
#                              in a new session (first draws): file, names
#   run handle pass fetch      values of the pass's outputs/regularization/loss/gradients
#                              in an .npz: file, names
#   read handle                the variables' values: file, names, same, order (see
#                              "the values both ends hold": only changed values are in file)
#   assign handle file names same order
#                              set variables by name (file: the values sent, same: the
#                              ones referred to; order: every name)
#   copy handle source         every variable of source's under the same name, in
#   train_build handle optimizer training
#                              a pass of its own, its default loss and
#                              optimizer().minimize ("module:function"): train, optimizer, loops
#   train_step handle train    one step in a new session: loss (before the step)
#   global_state handle        every global variable by op name (slots too): file, names,
#                              same, order
#   load_global_state handle file names same order
#   save handle path / restore handle path
#                              a tf.train.Saver checkpoint of the variables: path
#   describe handle pass       the pass's ops for localization (the ancestors of its outputs
#                              and of its UPDATE_OPS, in creation order): ops [{name, type,
#                              inputs, outputs [{dtype, shape}], fetchable, loop, frame}],
#                              outputs (tensor names), updates (op names), random
#   fetch handle pass names    the values of the named tensors (the inputs fed; a new session
#                              with the current variables where the pass draws random numbers):
#                              file, names
#   restore_training handle train path
#                              every variable of a train_build's graph (slots and beta
#                              powers too) restored from a TF1 checkpoint: slots, non_slot
#   resume_step handle train   one train_step, then the variables, the optimizer's slots
#                              and beta powers (partitions stitched): loss, file, names
#   forget                     drop the values both ends hold (the caller lost its copy)
#   close handle / quit
# An error answers {"ok": false, "error": {type, message, frame, traceback}}.
#
# Random numbers: the TF1 half of equivtool's DeterministicRandomTestTool
# (equivtool/seeding), for TensorFlow 1.x: inside a pass, every stateful random
# op asks random_seed.get_seed for its seeds, and gets (seed, operation seed)
# from the tool: in "constant" mode always operation seed 0 (the graph seed set
# to it as each op is seeded), in "num_random_ops" mode the count of ops seeded
# so far. The same arithmetic, so the same numbers, as the in-process TF1 side.
import importlib
import json
import os
import platform
import sys
import traceback

import numpy as np
import tensorflow as tf

PROTOCOL = 2  # 2: values both ends hold cross as references

# Grappler passes that can change a float result (equivtool._platform.graph_rewrites.NUMERIC_PASSES),
# switched off where this TensorFlow has them under graph_rewrites="as_written"
NUMERIC_PASSES = ("remapping", "arithmetic_optimization", "constant_folding", "layout_optimizer",
                  "auto_mixed_precision", "auto_mixed_precision_onednn_bfloat16", "auto_mixed_precision_mkl",
                  "auto_mixed_precision_cpu", "implementation_selector")

_STATEFUL_RANDOM_OPS = frozenset([
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "RandomCrop"])
_ZERO_PAIR_OPERATION_SEED = 2 ** 31 - 1  # TensorFlow's substitute for the seed pair (0, 0)
_LIBRARY = ("/tensorflow/", "/tensorflow_core/", "/numpy/", "/site-packages/", "_old_side_program.py")


class ProtocolError(Exception):
    """A request this program cannot serve (a bug on the calling side)."""


# -- the random tool's TF1 half -----------------------------------------------

class RandomTool(object):
    """Seeds every stateful random op created inside scope() (see the header)."""

    def __init__(self, seed, mode):
        if mode not in ("constant", "num_random_ops"):
            raise ProtocolError("mode: expected 'constant' or 'num_random_ops', got %r" % (mode,))
        self.seed = int(seed)
        self.constant = mode == "constant"
        self.operation_seed = 0
        self.observed = set()
        self.count = 0
        self.module = importlib.import_module("tensorflow.python.framework.random_seed")

    def _set_graph_seed(self, value, saved):
        graph = tf.get_default_graph()
        if id(graph) not in saved:
            saved[id(graph)] = (graph, graph.seed)
        tf.set_random_seed(value)

    def next_seeds(self, saved):
        op_seed = self.operation_seed
        if self.constant:
            self._set_graph_seed(op_seed, saved)
        else:
            if op_seed in self.observed:
                raise ValueError("num_random_ops: operation seed %d handed out twice" % op_seed)
            self.observed.add(op_seed)
            self.operation_seed = op_seed + 1
        self.count += 1
        if self.seed == 0 and op_seed == 0:
            op_seed = _ZERO_PAIR_OPERATION_SEED
        return (self.seed, op_seed)

    def run(self, fn):
        """fn() with get_seed answered by this tool; get_seed and every graph seed put back."""
        original = self.module.get_seed
        saved = {}

        def get_seed(op_seed=None):
            return self.next_seeds(saved)

        try:
            self._set_graph_seed(self.seed, saved)
            self.module.get_seed = get_seed
            return fn()
        finally:
            self.module.get_seed = original
            for graph, seed in saved.values():
                graph.seed = seed


# -- structures ---------------------------------------------------------------

def components(node):
    """[(key, tensor)] of a sparse or ragged tensor, in the order and under the names
    equivtool's in-process TF1 side compares them (equivtool._base.tree.composite_parts:
    indices, values, dense_shape; flat_values, row_splits_0 outermost first), or None
    for anything else: such an output crosses as its components, a dict of them. An
    IndexedSlices crosses as values, indices and dense_shape (where known), which
    equivtool holds as its SlicesArrays (equivtool._base.slices)."""
    name = type(node).__name__
    if name == "IndexedSlices" and hasattr(node, "indices") and hasattr(node, "values"):
        shape = [("dense_shape", node.dense_shape)] if node.dense_shape is not None else []
        return [("values", node.values), ("indices", node.indices)] + shape
    if name == "SparseTensor" and all(hasattr(node, f) for f in ("indices", "values", "dense_shape")):
        return [("indices", node.indices), ("values", node.values), ("dense_shape", node.dense_shape)]
    if name == "RaggedTensor" and hasattr(node, "nested_row_splits"):
        return [("flat_values", node.flat_values)] + [
            ("row_splits_%d" % i, split) for i, split in enumerate(node.nested_row_splits)]
    return None


def flatten(node):
    """Leaves in insertion order, as equivtool's flatten_tensors (a sparse or ragged
    tensor: its components, see components())."""
    parts = components(node)
    if parts is not None:
        return [tensor for _, tensor in parts]
    if isinstance(node, dict):
        return [leaf for value in node.values() for leaf in flatten(value)]
    if isinstance(node, (list, tuple)):
        return [leaf for value in node for leaf in flatten(value)]
    return [node]


def describe(node):
    """The structure as JSON: {"dict": [[key, sub], ...]}, {"list"|"tuple": [...]}, or "leaf"
    (a sparse or ragged tensor: a dict of its components, see components())."""
    if isinstance(node, dict):
        for key in node:
            if not isinstance(key, str):
                raise TypeError("tf1_fn: outputs: a dict key must be a str to cross interpreters, got %r" % (key,))
        return {"dict": [[key, describe(value)] for key, value in node.items()]}
    if isinstance(node, list):
        return {"list": [describe(value) for value in node]}
    if isinstance(node, tuple):
        return {"tuple": [describe(value) for value in node]}
    parts = components(node)
    if parts is not None:
        kind = "slices" if type(node).__name__ == "IndexedSlices" else "dict"
        return {kind: [[key, "leaf"] for key, _ in parts]}
    return "leaf"


def assemble(node, tensors):
    """A composite like node (see components()) made of tensors, its components in order."""
    name = type(node).__name__
    if name == "IndexedSlices":
        return tf.IndexedSlices(tensors[0], tensors[1], tensors[2] if len(tensors) > 2 else None)
    if name == "SparseTensor":
        return tf.SparseTensor(tensors[0], tensors[1], tensors[2])
    return tf.RaggedTensor.from_nested_row_splits(tensors[0], tensors[1:], validate=False)


def pack(structure, leaves):
    """The inverse of flatten() (a composite rebuilt from its components)."""
    iterator = iter(leaves)

    def build(node):
        parts = components(node)
        if parts is not None:
            return assemble(node, [next(iterator) for _ in parts])
        if isinstance(node, dict):
            return dict((key, build(value)) for key, value in node.items())
        if isinstance(node, (list, tuple)):
            return type(node)(build(value) for value in node)
        return next(iterator)
    return build(structure)


def rebuild(description, leaves):
    """The inverse of describe() on a list of leaves."""
    iterator = iter(leaves)

    def build(node):
        if node == "leaf":
            return next(iterator)
        if "dict" in node:
            return dict((key, build(value)) for key, value in node["dict"])
        if "list" in node:
            return [build(value) for value in node["list"]]
        return tuple(build(value) for value in node["tuple"])
    return build(description)


def save_arrays(folder, name, arrays):
    """arrays (a list) as FOLDER/name.npz under keys a0, a1, ...; returns the file name."""
    path = os.path.join(folder, name + ".npz")
    np.savez(path, **dict(("a%d" % i, np.asarray(value)) for i, value in enumerate(arrays)))
    return name + ".npz"


def load_arrays(folder, name):
    path = os.path.join(folder, name)
    with np.load(path, allow_pickle=False) as data:
        values = [data["a%d" % i] for i in range(len(data.files))]
    os.unlink(path)
    return values


# -- the values both ends hold --------------------------------------------------

# equivtool.engine.sides._old_known.KnownValues written again for this program:
# per request kind (read, global_state, assign, load_global_state), the values
# the last request of that kind carried, by variable (its name without ":0").
# A read or a global state sends only the values whose bits differ from what
# both ends hold under the same name, the others as "same": {name: [kind, key]};
# an assign or a load_global_state may refer to them so too. A kind's values are
# replaced only once its request succeeded, so both ends hold the same.
def value_key(name):
    return name[:-2] if name.endswith(":0") else name


def same_bits(a, b):
    if a.dtype != b.dtype or a.shape != b.shape or a.dtype.kind == "O":
        return False
    a, b = np.ascontiguousarray(a).reshape(-1).view(np.uint8), np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    return bool(np.array_equal(a[:256], b[:256]) and np.array_equal(a, b))  # a changed value: seen early


class Known(object):
    def __init__(self):
        self.kinds = {}

    def answer(self, folder, kind, names, values):
        """An answer carrying names' values: file and names (those sent), same, order."""
        sent_names, sent, same = [], [], {}
        for name, value in zip(names, values):
            found = self.find(name, value)
            if found is not None:
                same[name] = found
            else:
                sent_names.append(name)
                sent.append(value)
        self.keep(kind, names, values)
        return {"file": save_arrays(folder, kind, sent) if sent else None, "names": sent_names,
                "same": same, "order": list(names)}

    def find(self, name, value):
        key = value_key(name)
        for kind, kept in self.kinds.items():
            if key in kept and same_bits(kept[key], value):
                return [kind, key]
        return None

    def received(self, folder, request):
        """(names, values) of a request carrying values: its file's and the ones it refers to."""
        by_name = dict(zip(request["names"], load_arrays(folder, request["file"]) if request.get("file") else []))
        for name, (kind, key) in (request.get("same") or {}).items():
            if key not in self.kinds.get(kind, {}):
                raise ProtocolError("%s: refers to a value kept as %s/%s, which this end does not hold"
                                    % (request.get("op"), kind, key))
            by_name[name] = self.kinds[kind][key]
        names = request.get("order") or request["names"]
        return names, [by_name[name] for name in names]

    def keep(self, kind, names, values):
        self.kinds[kind] = dict((value_key(name), np.asarray(value)) for name, value in zip(names, values))


# -- the graph ------------------------------------------------------------------

# The graph walks below are equivtool's (equivtool._base.graph.ancestors,
# equivtool.engine.sides.tf1_graph_reading.loop_random_ops) written again, for TF 1.x
# and without equivtool: this program imports nothing of it.
def ancestors(ops):
    seen, stack = set(), list(ops)
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def loop_random_ops(ops):
    """{loop: [random ops]} for the v1 while-loop frames among ops whose body draws random numbers."""
    loops = {}
    frames = set(op.get_attr("frame_name") for op in ops if op.type == "Enter")
    for frame in frames:
        frame = frame.decode() if isinstance(frame, bytes) else frame
        prefix = frame.rsplit("/", 1)[0] + "/"
        found = ["%s (%s)" % (op.name, op.type) for op in ops
                 if op.type in _STATEFUL_RANDOM_OPS and op.name.startswith(prefix)]
        if found:
            loops[prefix.rstrip("/")] = found
    return loops


def depends_on(value, loops):
    if value is None or not loops:
        return False
    targets = set(loops) | set(entry.split(" (", 1)[0] for found in loops.values() for entry in found)
    start = value.values if isinstance(value, tf.IndexedSlices) else value
    return any(op.name in targets for op in ancestors([getattr(start, "op", start)]))


def primary_output(outputs):
    """The output the default loss is built from (equivtool's rule: a dict's last
    entry, a sequence's first, until a tensor is reached)."""
    while True:
        if isinstance(outputs, dict):
            if not outputs:
                raise ValueError("the default loss needs an output: the model returned an empty dict")
            outputs = outputs[list(outputs)[-1]]
        elif isinstance(outputs, (list, tuple)):
            if not outputs:
                raise ValueError("the default loss needs an output: the model returned an empty sequence")
            outputs = outputs[0]
        else:
            return outputs


def default_loss(outputs, regularization):
    loss = tf.reduce_mean(tf.square(tf.cast(primary_output(outputs), tf.float32)))
    return loss + tf.cast(regularization, tf.float32)


def import_function(spec, path):
    for folder in reversed(path):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    module_name, _, name = spec.partition(":")
    module = importlib.import_module(module_name)
    function = module
    for part in name.split("."):
        function = getattr(function, part)
    return function


class Side(object):
    """One graph and session: the user's function, built once per pass."""

    def __init__(self, folder, request, tools):
        self.folder = folder
        self.fn = import_function(request["fn"], request.get("path") or [])
        self.loss = default_loss
        if request.get("loss"):  # the user's loss_fn(outputs, regularization_loss), also imported there
            self.loss = import_function(request["loss"], request.get("path") or [])
        key = request.get("tool") or request["handle"]
        if key not in tools:
            tools[key] = RandomTool(request["seed"], request["mode"])
        self.tool = tools[key]
        self.graph = tf.Graph()
        values = load_arrays(folder, request["inputs"])
        self.inputs = values
        with self.graph.as_default():
            leaves = [tf.placeholder(tf.as_dtype(value.dtype), value.shape, name="equivtool_input_%d" % i)
                      for i, value in enumerate(values)]
        self.placeholders = leaves
        self.structured = rebuild(request["structure"], leaves)
        config = tf.ConfigProto()
        rewrites = config.graph_options.rewrite_options
        for name in NUMERIC_PASSES if request.get("graph_rewrites", "as_written") == "as_written" else ():
            if name in rewrites.DESCRIPTOR.fields_by_name:
                setattr(rewrites, name, 2)  # RewriterConfig.OFF
        self.config = config
        self.session = tf.Session(graph=self.graph, config=config)
        self.path = request.get("path") or []
        self.trainings = []
        self.routed_trainings = []  # per training, with kinks: (kinks, the routed train op)
        self.optimizers = []  # per training: the optimizer instance (restore_training reads its slots)
        self.passes = []
        self.initialized = False
        self.variables = []
        self.draws_random = {}  # pass -> whether it draws random numbers (fetch)
        self.kernel_floor = bool(request.get("kernel_floor"))
        self.kinks = bool(request.get("kinks"))
        self.known = Known()  # the values both ends hold (handle() gives every side the program's one)

    def forward(self, training, gradients, perturb=True):
        ops_before = len(self.graph.get_operations())

        def build():
            with self.graph.as_default():
                updates_before = len(self.graph.get_collection(tf.GraphKeys.UPDATE_OPS))
                ops_before = len(self.graph.get_operations())
                reuse = tf.AUTO_REUSE if self.passes else None
                with tf.variable_scope(tf.get_variable_scope(), reuse=reuse):
                    outputs = self.fn(self.structured, training)
                regularization_list = tf.losses.get_regularization_losses()
                regularization = tf.add_n(regularization_list) if regularization_list else tf.constant(0.0)
                loss, grads, kinks, routed = None, {}, [], {}
                if gradients:
                    loss = self.loss(outputs, regularization)
                    trainable = self.graph.get_collection(tf.GraphKeys.TRAINABLE_VARIABLES)
                    for variable, grad in zip(trainable, tf.gradients(loss, trainable)):
                        if grad is not None:
                            grads[variable.name] = grad
                    if self.kinks:
                        kinks = [(op, unroutable(op)) for op in kink_ops(self.graph.get_operations()[ops_before:], loss)]
                        try:
                            kinks, routed = routed_gradients(loss, [v for v in trainable if v.name in grads], kinks)
                        except Exception as exc:  # (the step's own gradients stand; no kink is routed)
                            why = "routing its gradient failed: %s: %s" % (type(exc).__name__, str(exc).split("\n")[0])
                            kinks, routed = [(op, None, why) for op, _ in kinks], {}
                updates = self.graph.get_collection(tf.GraphKeys.UPDATE_OPS)[updates_before:]
                loops = loop_random_ops(self.graph.get_operations()[ops_before:])
                return outputs, regularization, loss, grads, updates, loops, kinks, routed

        before = self.tool.count
        outputs, regularization, loss, grads, updates, loops, kinks, routed = self.tool.run(build)
        structure = describe(outputs)
        self.passes.append({"outputs": outputs, "regularization": regularization, "loss": loss,
                            "gradients": grads, "updates": updates, "kinks": kinks, "routed": routed})
        kernel = self.perturb_pass(ops_before, len(self.passes) - 1) if self.kernel_floor and perturb else None
        with self.graph.as_default():
            self.variables = list(tf.global_variables())
            trainable = set(v.name for v in tf.trainable_variables())
        leaves = flatten(outputs) + [regularization]
        return {"pass": len(self.passes) - 1, "outputs": structure,
                "variables": [{"name": v.name, "op": v.op.name, "shape": v.shape.as_list(),
                               "dtype": v.dtype.base_dtype.name, "trainable": v.name in trainable}
                              for v in self.variables],
                "gradients": list(grads), "sparse": [k for k, g in grads.items()
                                                      if isinstance(g, tf.IndexedSlices)],
                "loops": loops, "leaf_flags": [depends_on(t, loops) for t in leaves],
                "loss_flag": depends_on(loss, loops),
                "gradient_flags": dict((k, depends_on(g, loops)) for k, g in grads.items()),
                "random_ops": self.tool.count - before, "kernel_floor": kernel,
                "kinks": [describe_kink(op, why) for op, _, why in kinks]}

    def perturb_pass(self, ops_before, index, training=None):
        """Rounding injected at every op built since ops_before (perturb_ops); the pass's
        (and the training's) fetched tensors replaced by their perturbed values."""
        with self.graph.as_default():
            moved, counts = perturb_ops(self.graph.get_operations()[ops_before:])
        built = self.passes[index]

        def swap(tensor):
            if isinstance(tensor, tf.IndexedSlices):
                return tf.IndexedSlices(moved.get(tensor.values, tensor.values), tensor.indices, tensor.dense_shape)
            return moved.get(tensor, tensor)
        built["outputs"] = pack(built["outputs"], [swap(t) for t in flatten(built["outputs"])])
        for key in ("regularization", "loss"):
            built[key] = swap(built[key]) if built[key] is not None else None
        built["gradients"] = dict((k, swap(g)) for k, g in built["gradients"].items())
        built["routed"] = dict((k, swap(g)) for k, g in built["routed"].items())
        if training is not None:
            loss, train_op = self.trainings[training]
            self.trainings[training] = (swap(loss), train_op)
        return counts

    def initialize(self):
        if not self.initialized:
            with self.graph.as_default():
                self.session.run(tf.global_variables_initializer())
            self.initialized = True

    def feed(self):
        return dict(zip(self.placeholders, self.inputs))

    def run(self, index, fetch, with_updates):
        self.initialize()
        built = self.passes[index]
        names, fetches = [], []
        if "outputs" in fetch:
            for i, tensor in enumerate(flatten(built["outputs"])):
                names.append("outputs/%d" % i)
                fetches.append(tensor)
        if "regularization" in fetch:
            names.append("regularization")
            fetches.append(built["regularization"])
        if "loss" in fetch and built["loss"] is not None:
            names.append("loss")
            fetches.append(built["loss"])
        if "gradients" in fetch:
            for key, grad in built["gradients"].items():
                names.append("gradients/" + key)
                fetches.append(grad)
        updates = built["updates"] if with_updates else []
        values, _ = self.session.run((fetches, updates), feed_dict=self.feed())
        arrays = []
        for value in values:
            arrays.append(dense_value(value))
        return {"file": save_arrays(self.folder, "run", arrays), "names": names}

    def read(self):
        self.initialize()
        values = self.session.run(self.variables)
        return self.known.answer(self.folder, "read", [v.name for v in self.variables], values)

    def load(self, pairs):
        """Set (variable, value) pairs by feeding their initializers (no new op in the graph)."""
        pairs = list(pairs)
        if pairs:
            self.session.run([v.initializer for v, _ in pairs],
                             feed_dict=dict((v.initializer.inputs[1], value) for v, value in pairs))

    def assign(self, names, values):
        by_name = dict(zip(names, values))
        wanted = [(v, by_name[v.name]) for v in self.variables if v.name in by_name]
        unknown = sorted(set(by_name) - set(v.name for v in self.variables))
        if unknown:
            raise ProtocolError("assign: no variable named %s" % ", ".join(unknown[:5]))
        if not self.initialized:
            rest = [v for v in self.variables if v.name not in by_name]
            if rest:
                with self.graph.as_default():
                    self.session.run(tf.variables_initializer(rest))
        self.load(wanted)
        self.initialized = True

    def copy_from(self, other):
        other.initialize()
        source = dict((v.name, v) for v in other.variables)
        mine = [v for v in self.variables if v.name in source]
        values = other.session.run([source[v.name] for v in mine])
        self.assign([v.name for v in mine], values)

    def build_training(self, optimizer, training):
        """A forward pass of its own, its default loss and make_optimizer().minimize over the
        trainable variables after the pass's UPDATE_OPS; the optimizer's variables initialised."""
        make = import_function(optimizer, self.path)
        ops_before = len(self.graph.get_operations())
        info = self.forward(training, False, perturb=False)  # perturbed below, gradients and update included
        self.initialize()
        built = self.passes[-1]
        with self.graph.as_default():
            known = set(tf.global_variables())
            loss = self.loss(built["outputs"], built["regularization"])
            instance = make()
            with tf.control_dependencies(built["updates"]):
                train_op = instance.minimize(loss, var_list=tf.trainable_variables())
            routed = ([], None)
            if self.kinks:  # the same step with its kinks routed (route_train): the optimizer's own slots
                routed = self.routed_training(instance, loss, built["updates"], ops_before)
            self.session.run(tf.variables_initializer([v for v in tf.global_variables() if v not in known]))
        self.trainings.append((loss, train_op))
        self.routed_trainings.append(routed)
        self.optimizers.append(instance)
        kernel = None
        if self.kernel_floor:
            kernel = self.perturb_pass(ops_before, len(self.passes) - 1, training=len(self.trainings) - 1)
        return {"train": len(self.trainings) - 1, "optimizer": type(instance).__name__, "loops": info["loops"],
                "loss_flag": depends_on(loss, info["loops"]), "kernel_floor": kernel,
                "kinks": [describe_kink(op, why) for op, _, why in routed[0]]}

    def routed_training(self, instance, loss, updates, ops_before):
        """([(kink op, placeholder or None, why not routable)], a train op applying the
        optimizer's update to the gradients routed at those kinks): routed_gradients, with
        the optimizer's own compute_gradients and apply_gradients (its slots shared with
        the step's own train op). Nothing is routed where building it fails."""
        kinks = [(op, unroutable(op)) for op in kink_ops(self.graph.get_operations()[ops_before:], loss)]
        trainable = tf.trainable_variables()
        try:
            found, pairs = routed_gradients(loss, trainable, kinks,
                                            lambda: instance.compute_gradients(loss, var_list=trainable))
            with tf.control_dependencies(updates):
                return found, instance.apply_gradients(pairs)
        except Exception as exc:
            why = "routing its gradient failed: %s: %s" % (type(exc).__name__, str(exc).split("\n")[0])
            return [(op, None, why) for op, _ in kinks], None

    def route_train(self, index, steps, values):
        """steps optimizer steps with the training's kinks routed by values ({(step, kink
        index): the other side's input to it at that step}), each in a new session as
        train_step: per step the loss before it, each kink's input here and then every
        variable's value (as read answers them)."""
        self.initialize()
        loss, _ = self.trainings[index]
        kinks, train_op = self.routed_trainings[index]
        if train_op is None:
            raise ProtocolError("route_train: training %d has no routed train op" % index)
        names, arrays = [], []
        for step in range(steps):
            self.renew_session()
            feed = self.feed()
            for i, (op, stand_in, _) in enumerate(kinks):
                if stand_in is not None:
                    if (step, i) not in values:
                        raise ProtocolError("route_train: no value for kink %d (%s) at step %d" % (i, op.name, step))
                    feed[stand_in] = values[(step, i)]
            value, inputs, _ = self.session.run((loss, [op.inputs[0] for op, _, _ in kinks], train_op), feed_dict=feed)
            names.append("loss/%d" % step)
            arrays.append(value)
            for i, found in enumerate(inputs):
                names.append("kink/%d/%d" % (step, i))
                arrays.append(found)
            for variable, found in zip(self.variables, self.session.run(self.variables)):
                names.append("variables/%d/%s" % (step, variable.name))
                arrays.append(found)
        return {"file": save_arrays(self.folder, "route_train", arrays), "names": names}

    def renew_session(self):
        """Every global variable's value moved into a new session, so that every stateful
        random op starts again at its first draw (as an eager TF2 call does)."""
        with self.graph.as_default():
            everything = tf.global_variables()
        values = self.session.run(everything)
        self.session.close()
        self.session = tf.Session(graph=self.graph, config=self.config)
        self.load(zip(everything, values))

    def train_step(self, index):
        """One optimizer step in a new session; the loss before it."""
        self.initialize()
        self.renew_session()
        loss, train_op = self.trainings[index]
        value, _ = self.session.run((loss, train_op), feed_dict=self.feed())
        return {"loss": float(value)}

    def global_state(self):
        """Every global variable (the model's, the optimizer's slots and counters) by op name."""
        self.initialize()
        with self.graph.as_default():
            everything = tf.global_variables()
        return self.known.answer(self.folder, "global_state", [v.op.name for v in everything],
                                 self.session.run(everything))

    def load_global_state(self, names, values):
        by_name = dict(zip(names, values))
        with self.graph.as_default():
            wanted = [(v, by_name[v.op.name]) for v in tf.global_variables() if v.op.name in by_name]
        self.load(wanted)
        self.initialized = True

    def saver(self):
        if getattr(self, "_saver", None) is None:
            with self.graph.as_default():
                self._saver = tf.train.Saver(var_list=self.variables)
        return self._saver

    def save(self, prefix):
        """The variables written with tf.train.Saver (a name-based checkpoint): its path."""
        self.initialize()
        with self.graph.as_default():
            return {"path": self.saver().save(self.session, prefix)}

    def restore(self, path):
        with self.graph.as_default():
            self.saver().restore(self.session, path)
        self.initialized = True
        return {}

    def restore_training(self, index, path):
        """Every global variable of the graph (the model's, the training's optimizer's slots
        and its own, such as Adam's beta powers) restored from the TF1 checkpoint at path;
        a ValueError names what the checkpoint lacks. Keeps what resume_step fetches."""
        optimizer = self.optimizers[index]
        with self.graph.as_default():
            everything = tf.global_variables()
            stored = tf.train.load_checkpoint(path).get_variable_to_shape_map()
            absent = sorted(set(stored_name(v) for v in everything) - set(stored))
            if absent:
                raise ValueError("checkpoint: %r lacks %s, which the TF1 training graph (%s) has: was it "
                                 "written by this model and optimizer?" % (path, absent, type(optimizer).__name__))
            tf.train.Saver(var_list=everything).restore(self.session, path)
            self.initialized = True
            trainable = tf.trainable_variables()
            slots = [(v, optimizer.get_slot(v, name)) for name in optimizer.get_slot_names() for v in trainable]
            slots = [(v, slot) for v, slot in slots if slot is not None]
            non_slot = [v for v in optimizer.variables() if v.op.name in ("beta1_power", "beta2_power")]
        self.resumed = (slots, non_slot)
        return {"slots": len(slots), "non_slot": [v.op.name for v in non_slot]}

    def resume_step(self, index):
        """One train_step, then the values resume compares: "variables/NAME",
        "slots/NAME/SLOT" (SLOT: the slot variable's last name part, e.g. Adam_1) and
        "optimizer/OP", a partitioned variable's parts stitched under its full name."""
        loss = self.train_step(index)["loss"]
        slots, non_slot = self.resumed
        model, slot_values, non_slot_values = self.session.run(
            (self.variables, [slot for _, slot in slots], non_slot))
        names, arrays = [], []
        for name, value in stitched(self.variables, model):
            names.append("variables/" + name)
            arrays.append(value)
        by_suffix = {}
        for (variable, slot), value in zip(slots, slot_values):
            by_suffix.setdefault(slot.op.name.rsplit("/", 1)[-1], []).append((variable, value))
        for suffix, pairs in by_suffix.items():
            for name, value in stitched([v for v, _ in pairs], [x for _, x in pairs]):
                names.append("slots/%s/%s" % (name.split(":")[0], suffix))
                arrays.append(value)
        for variable, value in zip(non_slot, non_slot_values):
            names.append("optimizer/" + variable.op.name)
            arrays.append(np.float32(value))
        return {"loss": loss, "file": save_arrays(self.folder, "resume", arrays), "names": names}

    def close(self):
        self.session.close()

    # -- localization: the pass's ops described, and fetched by name -----------------

    def _pass_roots(self, index):
        built = self.passes[index]
        tensors = [t for t in flatten(built["outputs"]) if hasattr(t, "op")]
        return tensors, [getattr(u, "op", u) for u in built["updates"]]

    def describe(self, index):
        """The ops a localization compares: every op the pass's outputs and its UPDATE_OPS
        (the moving averages batch norm updates) are computed from, in creation order."""
        tensors, updates = self._pass_roots(index)
        wanted = set()
        stack = [t.op for t in tensors] + updates
        while stack:  # inputs only, as equivtool's localization walks a graph
            op = stack.pop()
            if op not in wanted:
                wanted.add(op)
                stack.extend(t.op for t in op.inputs)
        ops, passive = [], not_compared(self.graph, wanted)
        for op in self.graph.get_operations():
            if op not in wanted:
                continue
            # fetching an assignment would write; the others are values, not results (see not_compared)
            assigns = op.type.startswith("Assign") or op.type.startswith("Scatter") or op in passive
            ops.append({
                "name": op.name, "type": op.type, "inputs": [t.name for t in op.inputs],
                "outputs": [{"dtype": t.dtype.base_dtype.name,
                             "shape": None if t.shape.ndims is None else t.shape.as_list()} for t in op.outputs],
                "fetchable": [not assigns and self.graph.is_fetchable(t) for t in op.outputs],
                "loop": op._get_control_flow_context() is not None,
                "frame": op_frame(op)})
        return {"ops": ops, "outputs": [t.name for t in tensors], "updates": [op.name for op in updates],
                "random": any(op.type in _STATEFUL_RANDOM_OPS for op in wanted)}

    def fetch(self, index, names):
        """The named tensors' values with the inputs fed. Where the pass draws random
        numbers (dropout in training mode) each fetch runs in a new session holding the
        current variable values, so every fetch sees the first draws, as the step's own
        run did; the step's session is left as it is."""
        self.initialize()
        tensors = [self.graph.get_tensor_by_name(name) for name in names]
        found = self.draws_random.get(index)
        if found is None:
            tensors_, updates = self._pass_roots(index)
            found = self.draws_random[index] = any(
                op.type in _STATEFUL_RANDOM_OPS for op in ancestors([t.op for t in tensors_] + updates))
        values = self.session.run(tensors, feed_dict=self.feed()) if not found else self.first_draws(tensors, self.feed())
        return {"file": save_arrays(self.folder, "fetch", values), "names": list(names)}

    def first_draws(self, tensors, feed):
        """tensors' values in a new session holding the current variable values, so that
        every random op gives its first draw; the step's session is left as it is."""
        with self.graph.as_default():
            everything = tf.global_variables()
        current = self.session.run(everything)
        session = tf.Session(graph=self.graph, config=self.config)
        try:
            session.run([v.initializer for v in everything],
                        feed_dict=dict((v.initializer.inputs[1], value) for v, value in zip(everything, current)))
            return session.run(tensors, feed_dict=feed)
        finally:
            session.close()

    def route(self, index, values):
        """The pass's gradients routed at its kinks by values ({kink index: the other
        side's input to it}; see routed_gradients), the same gradients as computed, and
        each kink's input here (after any rounding injected before it), in a new session
        (every random op at its first draw, as in the step's own run; no UPDATE_OPS)."""
        self.initialize()
        built = self.passes[index]
        feed = self.feed()
        for i, (op, stand_in, _) in enumerate(built["kinks"]):
            if stand_in is not None:
                if i not in values:
                    raise ProtocolError("route: no value for kink %d (%s)" % (i, op.name))
                feed[stand_in] = values[i]
        names, tensors = [], []
        for prefix, found in (("routed/", built["routed"]), ("gradients/", built["gradients"])):
            for key, grad in found.items():
                names.append(prefix + key)
                tensors.append(grad)
        for i, (op, _, _) in enumerate(built["kinks"]):
            names.append("kink/%d" % i)
            tensors.append(op.inputs[0])
        arrays = [dense_value(value) for value in self.first_draws(tensors, feed)]
        return {"file": save_arrays(self.folder, "route", arrays), "names": names}


def dense_value(value):
    """A fetched value as an array: a sparse gradient (tf.IndexedSlices) scattered."""
    if hasattr(value, "indices") and hasattr(value, "values"):
        dense = np.zeros(value.dense_shape, dtype=value.values.dtype)
        np.add.at(dense, value.indices, value.values)
        return dense
    return value


# -- kinks: a gradient routed as the other side's forward values route it ----------------

# The ops whose gradient is chosen by comparing forward values: ReLU's sign (and ReLU6's
# 6), max pooling's window maximum. Two correct sets of kernels can put an element on
# opposite sides there, and the gradient then differs by a whole incoming value
# (equivtool.engine.kinks says how the check uses routed gradients).
KINK_TYPES = ("Relu", "Relu6", "LeakyRelu", "MaxPool")


def kink_ops(ops, loss):
    """The ops among ops (creation order) of KINK_TYPES that the loss is computed from."""
    wanted = ancestors([loss.op])
    return [op for op in ops if op.type in KINK_TYPES and op in wanted]


def unroutable(op):
    """Why op's gradient cannot be routed (an empty string when it can)."""
    try:
        op.get_attr("_gradient_op_type")
        return "its gradient is overridden (gradient_override_map)"
    except ValueError:
        pass
    if op._get_control_flow_context() is not None:
        return "in a v1 control-flow context"
    if not op.inputs[0].shape.is_fully_defined():
        return "its input's shape is not static"
    if op.inputs[0].dtype.base_dtype.name not in _ULP_DTYPES:
        return "its dtype is not float32 or float64"
    return ""


def _routed_kink_gradient(op, grad, stand_in):
    """op's gradient as if its input had been stand_in (the other side's): the same kernel
    TensorFlow's own gradient runs, fed the other side's forward values."""
    if op.type == "Relu":
        return tf.raw_ops.ReluGrad(gradients=grad, features=stand_in)
    if op.type == "Relu6":
        return tf.raw_ops.Relu6Grad(gradients=grad, features=stand_in)
    if op.type == "LeakyRelu":
        return tf.raw_ops.LeakyReluGrad(gradients=grad, features=stand_in, alpha=op.get_attr("alpha"))
    attrs = dict((name, op.get_attr(name)) for name in ("ksize", "strides", "padding", "data_format"))
    attrs = dict((k, v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items())
    output = tf.raw_ops.MaxPool(input=stand_in, **attrs)
    return tf.raw_ops.MaxPoolGrad(orig_input=stand_in, orig_output=output, grad=grad, **attrs)


def routed_gradients(loss, variables, kinks, build=None):
    """The loss's gradients with respect to variables once more, every routable kink's
    gradient taken at a placeholder standing in for its input (fed the other side's
    values by route): TensorFlow's gradient functions for KINK_TYPES are swapped in its
    registry while tf.gradients builds them, and put back on every exit path. Answers
    ([(op, placeholder or None, why not routable)], {variable name: routed gradient}); with
    build (a function building gradients, an optimizer's compute_gradients), what it returns."""
    found, by_name = [], {}
    for i, (op, why) in enumerate(kinks):
        stand_in = None
        if not why:
            stand_in = tf.placeholder(op.inputs[0].dtype.base_dtype, op.inputs[0].shape,
                                      name="equivtool_kink_%d" % i)
            by_name[op.name] = stand_in
        found.append((op, stand_in, why))
    registry = sys.modules[getattr(tf.Graph, "__module__")]._gradient_registry._registry  # (framework.ops)
    saved = dict((kind, registry[kind]) for kind in KINK_TYPES if kind in registry)

    def routed(op, grad):
        stand_in = by_name.get(op.name)
        if stand_in is None:
            return saved[op.type]["type"](op, grad)
        return _routed_kink_gradient(op, grad, stand_in)
    try:
        for kind, entry in saved.items():
            registry[kind] = dict(entry, type=routed)
        grads = tf.gradients(loss, variables) if build is None else build()
    finally:
        registry.update(saved)
    if build is not None:
        return found, grads
    return found, dict((v.name, g) for v, g in zip(variables, grads) if g is not None)


def describe_kink(op, why):
    attrs = {}
    if op.type == "MaxPool":
        attrs = dict((name, op.get_attr(name)) for name in ("ksize", "strides", "padding", "data_format"))
        attrs = dict((k, v.decode() if isinstance(v, bytes) else list(v) if isinstance(v, (list, tuple)) else v)
                     for k, v in attrs.items())
    elif op.type == "LeakyRelu":
        attrs = {"alpha": op.get_attr("alpha")}
    shape = op.inputs[0].shape
    return {"name": op.name, "type": op.type, "shape": None if shape.ndims is None else shape.as_list(),
            "dtype": op.inputs[0].dtype.base_dtype.name, "attrs": attrs, "unroutable": why}


# -- the kernel floor: rounding injected at every op ------------------------------

# Ops whose float outputs are exact in every TensorFlow version (they move, select or
# negate values; no kernel rounds there differently): not perturbed.
_EXACT_OPS = frozenset([
    "Identity", "IdentityN", "Snapshot", "StopGradient", "PreventGradient", "Reshape", "Squeeze", "ExpandDims",
    "Transpose", "ConcatV2", "Concat", "Slice", "StridedSlice", "Pack", "Unpack", "Split", "SplitV", "Gather",
    "GatherV2", "GatherNd", "Tile", "Pad", "PadV2", "MirrorPad", "Fill", "ZerosLike", "OnesLike", "Select",
    "SelectV2", "Relu", "Relu6", "ReluGrad", "Relu6Grad", "MaxPool", "MaxPoolV2", "Maximum", "Minimum", "Neg",
    "Abs", "BroadcastTo", "Reverse", "ReverseV2"])
# Ops that hold, read or write state, or feed values in: not computations.
_STATE_OPS = frozenset([
    "Const", "Placeholder", "PlaceholderWithDefault", "VariableV2", "Variable", "VarHandleOp",
    "ReadVariableOp", "VarIsInitializedOp", "IsVariableInitialized"])
_CONTROL_FLOW_OPS = frozenset([
    "Enter", "Exit", "Merge", "Switch", "NextIteration", "LoopCond", "RefEnter", "RefExit", "RefMerge",
    "RefSwitch", "While", "StatelessWhile", "If", "StatelessIf", "Case", "PartitionedCall",
    "StatefulPartitionedCall"])
_ULP_DTYPES = ("float32", "float64")  # the dtypes tf.math.nextafter has a kernel for


def ulp_step(tensor, index):
    """tensor moved one ULP towards +inf or -inf, element by element; zeros and
    non-finite values left as they are (as the noise floor's start perturbation).
    The direction is deterministic, with no random op (the random tool counts them):
    the element's own lowest mantissa bit, flipped for odd op indices."""
    dtype = tensor.dtype.base_dtype
    bits = tf.bitcast(tensor, tf.int64 if dtype == tf.float64 else tf.int32)
    low = tf.cast(tf.bitwise.bitwise_and(bits, tf.ones_like(bits)), dtype)  # 0 or 1
    if index % 2:
        low = 1 - low
    towards = (2 * low - 1) * np.inf  # +inf where 1, -inf where 0
    moved = tf.math.nextafter(tensor, towards)
    keep = tf.logical_or(tf.equal(tensor, tf.zeros_like(tensor)), tf.logical_not(tf.math.is_finite(tensor)))
    return tf.where(keep, tensor, moved)


def _skip_reason(op, state_reads):
    if op.type in _STATE_OPS or op in state_reads:
        return "state (variable, its read, constant or placeholder)"
    if op._get_control_flow_context() is not None or op.type in _CONTROL_FLOW_OPS:
        return "control flow (in a v1 while/cond context, or a v2 While/If or function call, body not entered)"
    if op.type in _STATEFUL_RANDOM_OPS:
        return "random draw (the same numbers in every version)"
    if op.type in _EXACT_OPS or (op.type == "Cast" and not op.inputs[0].dtype.is_floating):
        return "exact in every version (moves or selects values)"
    floats = [t for t in op.outputs if t.dtype.is_floating]
    if not floats:
        return None  # no floating-point output: not counted
    if all(t.dtype._is_ref_dtype for t in floats):
        return "ref-typed output (a variable's update)"
    if not any(t.dtype.base_dtype.name in _ULP_DTYPES for t in floats):
        return "no nextafter kernel for its dtype"
    return ""


def perturb_ops(ops):
    """Rounding injected at every op among ops (in creation order, in the default graph):
    every float32/float64 output of a compute op replaced, for all its consumers, by
    ulp_step of it (Operation._update_input). Answers (moved, counts): moved maps each
    perturbed tensor to its perturbed value (for the fetches); counts says how many ops
    and outputs were perturbed and how many ops were skipped, by reason."""
    ops = list(ops)
    state_reads = set()
    for op in ops:  # a variable's value read through Identity ops
        sources = [t.op for t in op.inputs]
        if op.type == "Identity" and sources and (sources[0].type in _STATE_OPS or sources[0] in state_reads):
            state_reads.add(op)
    moved, skipped, perturbed = {}, {}, 0
    for index, op in enumerate(ops):
        reason = _skip_reason(op, state_reads)
        if reason is None:
            continue
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        perturbed += 1
        for tensor in op.outputs:
            if tensor.dtype._is_ref_dtype or tensor.dtype.base_dtype.name not in _ULP_DTYPES:
                continue
            consumers = tensor.consumers()
            with tf.name_scope("equivtool_kernel_floor"):
                value = ulp_step(tensor, index)
            moved[tensor] = value
            for consumer in consumers:
                for position, source in enumerate(consumer.inputs):
                    if source is tensor:
                        consumer._update_input(position, value)
    return moved, {"perturbed_ops": perturbed, "perturbed_outputs": len(moved), "skipped": skipped}


def not_compared(graph, ops):
    """The ops among ops whose outputs are values rather than the pass's results, left
    uncompared: a variable's value read through Identity ops (the variable steps prove
    it, and a TF2 layer that creates its variables in the call runs initializer ops in
    its place), and a random draw's own arithmetic (what is computed from draws and
    constants alone; the draw itself is compared: TensorFlow 2 builds random_uniform over [0, 1)
    without TensorFlow 1.15's `* (maxval - minval) + minval`; the forward steps prove
    the draws the same)."""
    reads, draws, drawn = set(), set(), set()
    for op in graph.get_operations():  # creation order: an op's inputs come first
        if op not in ops:
            continue
        sources = [t.op for t in op.inputs]
        if op.type == "Identity" and sources and (
                sources[0].type in ("VariableV2", "VarHandleOp", "ReadVariableOp") or sources[0] in reads):
            reads.add(op)
        elif op.type in _STATEFUL_RANDOM_OPS:
            draws.add(op)  # compared: both versions draw the same raw numbers
        elif sources and all(source in draws or source in drawn or source.type == "Const" for source in sources):
            drawn.add(op)  # arithmetic on draws and constants only
    return reads | drawn


def op_frame(op):
    """[path, line, function] of the innermost frame of op's creation outside TensorFlow and
    this program (the user's line), or None."""
    for frame in reversed(list(op.traceback)):
        filename, lineno, name = frame[0], frame[1], frame[2]
        if not any(part in filename.replace(os.sep, "/") for part in _LIBRARY):
            return [filename, lineno, name]
    return None


def stored_name(variable):
    """The name a TF1 checkpoint stores variable under (a partition: its whole variable's)."""
    info = getattr(variable, "_save_slice_info", None)
    return info.full_name if info is not None else variable.op.name


def stitched(variables, values):
    """(name, value) per variable, a partitioned variable's parts put into one array under
    its full name (as a checkpoint stores it); other names keep their ":0"."""
    out, order = {}, []
    for variable, value in zip(variables, values):
        info = getattr(variable, "_save_slice_info", None)
        if info is None:
            out[variable.name] = value
            order.append(variable.name)
            continue
        if info.full_name not in out:
            out[info.full_name] = np.zeros(info.full_shape, value.dtype)
            order.append(info.full_name)
        out[info.full_name][tuple(slice(o, o + n) for o, n in zip(info.var_offset, info.var_shape))] = value
    return [(name, out[name]) for name in order]


# -- serving ----------------------------------------------------------------------

def user_frame(tb):
    """"path:line in function" of the innermost frame outside TensorFlow and this program."""
    for frame in reversed(traceback.extract_tb(tb)):
        if not any(part in frame.filename.replace(os.sep, "/") for part in _LIBRARY):
            return "%s:%d in %s" % (frame.filename, frame.lineno, frame.name)
    return None


def hello():
    contrib = False
    version = tf.__version__
    if version.startswith("1."):
        try:
            importlib.import_module("tensorflow.contrib")  # registers contrib's ops, as the recorder does
            contrib = True
        except ImportError:
            contrib = False
    return {"protocol": PROTOCOL, "python": platform.python_version(), "tensorflow": version,
            "machine": platform.machine(), "executable": sys.executable, "contrib": contrib,
            "cpu_build": not tf.test.is_built_with_cuda(), "eager": tf.executing_eagerly()}


def serve(folder, requests, answers):
    sides, tools, known = {}, {}, Known()
    try:
        for line in requests:
            if not line.strip():
                continue
            request = json.loads(line)
            op = request.get("op")
            if op == "quit":
                break
            try:
                answer = handle(folder, request, sides, tools, known)
                answer["ok"] = True
            except Exception as exc:  # noqa: BLE001 - every error goes back to the caller as JSON
                info = sys.exc_info()
                answer = {"ok": False, "error": {
                    "type": type(exc).__name__, "message": " ".join(str(exc).split()),
                    "frame": user_frame(info[2]),
                    "traceback": "".join(traceback.format_exception(*info))}}
            answers.write(json.dumps(answer) + "\n")
            answers.flush()
    finally:
        for side in sides.values():
            side.close()


def handle(folder, request, sides, tools, known=None):
    op = request.get("op")
    if op == "hello":
        return hello()
    if op == "forget" and known is not None:  # the values both ends hold: none now
        known.kinds = {}
        return {}
    if op == "open":
        if request["handle"] in sides:
            raise ProtocolError("open: handle %r is open already" % (request["handle"],))
        sides[request["handle"]] = Side(folder, request, tools)
        if known is not None:
            sides[request["handle"]].known = known  # one for every side: values are matched by name and bits
        return {}
    side = sides.get(request.get("handle"))
    if side is None:
        raise ProtocolError("%s: no open handle %r" % (op, request.get("handle")))
    if op == "forward":
        return side.forward(bool(request["training"]), bool(request.get("gradients")))
    if op == "run":
        return side.run(int(request["pass"]), request["fetch"], bool(request.get("update_ops")))
    if op == "read":
        return side.read()
    if op == "assign":
        names, values = side.known.received(folder, request)
        side.assign(names, values)
        side.known.keep("assign", names, values)
        return {}
    if op == "copy":
        source = sides.get(request.get("source"))
        if source is None:
            raise ProtocolError("copy: no open handle %r" % (request.get("source"),))
        side.copy_from(source)
        return {}
    if op == "train_build":
        return side.build_training(request["optimizer"], bool(request["training"]))
    if op == "train_step":
        return side.train_step(int(request["train"]))
    if op == "global_state":
        return side.global_state()
    if op == "load_global_state":
        names, values = side.known.received(folder, request)
        side.load_global_state(names, values)
        side.known.keep("load_global_state", names, values)
        return {}
    if op == "save":
        return side.save(request["path"])
    if op == "restore":
        return side.restore(request["path"])
    if op == "describe":
        return side.describe(int(request["pass"]))
    if op == "fetch":
        return side.fetch(int(request["pass"]), request["names"])
    if op == "route_train":
        values = load_arrays(folder, request["file"])
        return side.route_train(int(request["train"]), int(request["steps"]),
                                dict(zip([tuple(int(x) for x in key) for key in request["kinks"]], values)))
    if op == "route":
        values = load_arrays(folder, request["file"])
        return side.route(int(request["pass"]), dict(zip([int(i) for i in request["kinks"]], values)))
    if op == "restore_training":
        return side.restore_training(int(request["train"]), request["path"])
    if op == "resume_step":
        return side.resume_step(int(request["train"]))
    if op == "close":
        sides.pop(request["handle"]).close()
        return {}
    raise ProtocolError("unknown request %r" % (op,))


def main(argv):
    if len(argv) != 2 or not os.path.isdir(argv[1]):
        sys.stderr.write("usage: python _old_side_program.py FOLDER (an existing folder for arrays)\n")
        return 2
    answers = sys.stdout
    sys.stdout = sys.stderr  # the user's prints must not break the one-line answers
    serve(argv[1], sys.stdin, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
