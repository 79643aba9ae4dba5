# The program benchmarks/bn_kernels_tf115.py runs in each interpreter: TensorFlow 1.15
# (the old interpreter) and TensorFlow 2.21 (here, through tf.compat.v1, graph mode).
#
# Why one program for both: the two runs must build the same graph the same way, so
# that a difference between them is the kernels', not the harness's. Each interpreter
# builds the net as the check builds its TF1 side there (1.15: the old side program's
# own Side and random tool; 2.21: equivtool's TF1Side and random tool), both with the
# random tool in "constant" mode and seed 42 (the check's pair), so the initial values
# and the dropout mask are the check's. Python 3.6 syntax, NumPy and TensorFlow only
# in the old interpreter (equivtool is imported in the 2.21 one only).
#
#   python _bn_program.py FOLDER net NET ZOO_DIR BATCH SIZE   the training pass with gradients, once;
#       FOLDER/net.npz: every batch norm's (and its gradient's) inputs and outputs,
#       the loss and the weight gradients; FOLDER/net.json: their names, per batch norm
#       its epsilon and the op names.
#       With FOLDER/routes.npz (see load_routes) each ReLU after a named batch norm passes
#       the gradient where the other interpreter's ReLU did, and each named max pool sends
#       it to the other interpreter's window maxima: the counterfactual in which both
#       route the gradient alike and differ only in the values they compute.
#   python _bn_program.py FOLDER ops               FOLDER/ops_in.npz (per layer x, scale,
#       offset, dy, and epsilon in ops_in.json): one fused batch norm (training mode) and
#       its gradient per layer, run alone on those identical inputs; FOLDER/ops_out.npz.
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SIDES = os.path.join(os.path.dirname(HERE), "equivtool", "engine", "sides")
OLD = sys.version_info < (3, 8)  # the TensorFlow 1.15 interpreter (Python 3.6 or 3.7)

if not OLD:
    sys.path.insert(0, os.path.dirname(HERE))
    import equivtool  # noqa: F401 (before TensorFlow: the environment fix)

import tensorflow as tf_module  # noqa: E402

tf = tf_module.compat.v1
sys.path.insert(0, SIDES)
import _old_side_program as osp  # noqa: E402 (its NUMERIC_PASSES, Side and random tool)

FORWARD_TYPES = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
GRADIENT_TYPES = ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3")


def config():
    """The check's session options under graph_rewrites="as_written"."""
    proto = tf.ConfigProto()
    rewrites = proto.graph_options.rewrite_options
    for name in osp.NUMERIC_PASSES:
        if name in rewrites.DESCRIPTOR.fields_by_name:
            setattr(rewrites, name, 2)  # RewriterConfig.OFF
    return proto


def save(folder, name, names, values, extra=None):
    np.savez(os.path.join(folder, name + ".npz"), **dict(("a%d" % i, np.asarray(v)) for i, v in enumerate(values)))
    description = {"names": list(names), "tensorflow": tf_module.__version__,
                   "python": "%d.%d.%d" % sys.version_info[:3]}
    description.update(extra or {})
    with open(os.path.join(folder, name + ".json"), "w") as f:
        json.dump(description, f)


def wanted(graph):
    """The tensors to fetch: every fused batch norm's inputs and outputs and its gradient's;
    every max pool's input and output."""
    names, layers = [], []
    for op in graph.get_operations():
        if op.type in FORWARD_TYPES and op.get_attr("is_training"):
            layers.append({"op": op.name, "kind": "forward", "epsilon": op.get_attr("epsilon"),
                           "inputs": [t.name for t in op.inputs[:3]], "outputs": [t.name for t in op.outputs[:3]]})
        elif op.type == "MaxPool":
            layers.append({"op": op.name, "kind": "pool", "inputs": [op.inputs[0].name],
                           "outputs": [op.outputs[0].name]})
        elif op.type in GRADIENT_TYPES:
            layers.append({"op": op.name, "kind": "gradient", "epsilon": op.get_attr("epsilon"),
                           "inputs": [t.name for t in op.inputs[:3]], "outputs": [t.name for t in op.outputs[:3]]})
        else:
            continue
        for name in layers[-1]["inputs"] + layers[-1]["outputs"]:
            if name not in names:
                names.append(name)
    return names, layers


ROUTES = {}  # op name -> the other interpreter's values that route its gradient (see load_routes)


def routed_relu_gradient(op, grad):
    """ReLU's gradient passed where the other interpreter's ReLU input (ROUTES, by the
    input's op name) is > 0; its own pattern where ROUTES has none."""
    from tensorflow.python.ops import gen_nn_ops
    found = ROUTES.get(op.inputs[0].op.name)
    return gen_nn_ops.relu_grad(grad, op.outputs[0] if found is None else tf.constant(found[0]))


def routed_max_pool_gradient(op, grad):
    """Max pooling's gradient sent to the other interpreter's window maxima (its input
    and output in ROUTES, by this op's name); its own where ROUTES has none."""
    from tensorflow.python.ops import gen_nn_ops
    found = ROUTES.get(op.name)
    inputs, outputs = (op.inputs[0], op.outputs[0]) if found is None else (tf.constant(v) for v in found)
    return gen_nn_ops.max_pool_grad(inputs, outputs, grad, ksize=op.get_attr("ksize"), strides=op.get_attr("strides"),
                                    padding=op.get_attr("padding"), data_format=op.get_attr("data_format"))


def load_routes(folder):
    """FOLDER/routes.npz and .json, when there: ``{"relu": [batch norm op names], "pool":
    [max pool op names]}`` and per name its arrays (a0, a1, ... in that order: one per
    batch norm, its output; two per max pool, its input and output). Returns the
    gradient override map that routes them (empty without the file)."""
    path = os.path.join(folder, "routes.npz")
    if not os.path.exists(path):
        return {}
    with open(os.path.join(folder, "routes.json")) as f:
        names = json.load(f)
    with np.load(path, allow_pickle=False) as data:
        arrays = [data["a%d" % i] for i in range(len(data.files))]
    for name in names["relu"]:
        ROUTES[name] = [arrays.pop(0)]
    for name in names["pool"]:
        ROUTES[name] = [arrays.pop(0), arrays.pop(0)]
    tf.RegisterGradient("BnProgramRoutedRelu")(routed_relu_gradient)
    tf.RegisterGradient("BnProgramRoutedMaxPool")(routed_max_pool_gradient)
    return {"Relu": "BnProgramRoutedRelu", "MaxPool": "BnProgramRoutedMaxPool"}


def net(folder, name, zoo_dir, batch, size):
    routes = load_routes(folder)
    # zoo.ZooNet.inputs(batch)
    x = np.random.RandomState(0).uniform(-1.0, 1.0, (batch, size, size, 3)).astype(np.float32)
    if OLD:
        request = {"handle": "bn", "fn": "contrib_nets:" + name, "path": [zoo_dir],
                   "inputs": osp.save_arrays(folder, "inputs", [x]), "structure": osp.describe(x),
                   "seed": 42, "mode": "constant", "graph_rewrites": "as_written"}
        side = osp.Side(folder, request, {})
        with side.graph.gradient_override_map(routes):
            answer = side.forward(True, True)
        built = side.passes[answer["pass"]]
        loss, gradients = built["loss"], built["gradients"]
        graph = side.graph

        def fetch(names):
            found = side.fetch(answer["pass"], names)
            return osp.load_arrays(folder, found["file"])
    else:
        sys.path.insert(0, zoo_dir)
        import contrib_nets
        from equivtool.engine.sides.tf1_side import TF1Side
        from equivtool.seeding import DeterministicRandomTestTool
        side = TF1Side(getattr(contrib_nets, name), x, renamer=lambda key: key, loss_fn=None,
                       random_tool=DeterministicRandomTestTool(seed=42, mode="constant"))
        with side.graph.gradient_override_map(routes):
            forward = side.forward(training=True, with_gradients=True)
        loss, gradients, graph = forward.loss, forward.gradients, side.graph

        def fetch(names):
            side.initialize()
            return side.session.run([graph.get_tensor_by_name(n) for n in names], feed_dict=side.feed())
    gradients = dict((key[:-2] if key.endswith(":0") else key, g) for key, g in gradients.items())
    names, layers = wanted(graph)
    grad_names = sorted(gradients)
    everything = [loss.name] + [gradients[k].name for k in grad_names] + names
    values = fetch(everything)
    save(folder, "net", ["loss"] + ["gradients/" + k for k in grad_names] + names, values,
         {"layers": layers, "routed": sorted(ROUTES)})


def ops(folder):
    with open(os.path.join(folder, "ops_in.json")) as f:
        described = json.load(f)
    with np.load(os.path.join(folder, "ops_in.npz"), allow_pickle=False) as data:
        arrays = dict((k, data[k]) for k in data.files)
    graph = tf.Graph()
    fetches, feed, names = [], {}, []
    with graph.as_default():
        for i, layer in enumerate(described["layers"]):
            values = [arrays["l%d_%s" % (i, part)] for part in ("x", "scale", "offset", "dy")]
            x, scale, offset, dy = [tf.placeholder(tf.float32, v.shape) for v in values]
            feed.update(zip((x, scale, offset, dy), values))
            y, mean, variance = tf.nn.fused_batch_norm(x, scale, offset, epsilon=layer["epsilon"], is_training=True)
            dx, dscale, doffset = tf.gradients(y, [x, scale, offset], grad_ys=dy)
            fetches += [y, mean, variance, dx, dscale, doffset]
            names += ["l%d_%s" % (i, part) for part in ("y", "mean", "variance", "dx", "dscale", "doffset")]
        types = sorted(set(op.type for op in graph.get_operations() if "BatchNorm" in op.type))
    with tf.Session(graph=graph, config=config()) as session:
        values = session.run(fetches, feed_dict=feed)
    save(folder, "ops_out", names, values, {"op_types": types})


def main(argv):
    if len(argv) < 3 or not os.path.isdir(argv[1]) or argv[2] not in ("net", "ops"):
        sys.stderr.write("usage: python _bn_program.py FOLDER net NET ZOO_DIR BATCH SIZE | FOLDER ops\n")
        return 2
    if argv[2] == "net":
        net(argv[1], argv[3], argv[4], int(argv[5]), int(argv[6]))
    else:
        ops(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
