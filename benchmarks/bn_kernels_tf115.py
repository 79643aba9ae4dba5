"""inception_v1 against TensorFlow 1.15, measured op by op: where its gradients part (issue 37).

Why: with the TF1 side in TensorFlow 1.15 and ``kernel_floor=True`` the zoo's
inception_v1 (224 px, batch 1) fails ``gradients`` and ``optimizer``: leaves in
``Mixed_4b`` and later are 40x to 2000x beyond their kernel floors, the stem's
weight gradient off by 0.25. The reading left by the session that found it
(TF 1.15's fused batch norm less accurate, normalising over too few values)
was not measured. This script measures it, in three tables:

1. **The net, op by op** (``--net``): the check's training pass with gradients
   (the zoo's input, the random tool's ``constant`` mode and seed 42, the default
   loss: what the check's ``gradients`` step runs) built once in each interpreter
   by ``benchmarks/_bn_program.py`` (TensorFlow 1.15: the old side program's own
   ``Side``; here: equivtool's ``TF1Side``), every fused batch norm's and its
   gradient's inputs and outputs fetched. Per batch norm: the values it normalises
   over (N) and its batch variances; how far the two interpreters' input, output
   and, on the way back, incoming gradient (``dy``) are apart; and where the ReLU
   after it gets inputs of opposite sign in the two (a *sign flip*: ReLU's gradient
   is 0 on one side and the full incoming gradient on the other).
2. **The fused batch norm alone, on identical inputs** (``--ops``): each layer's
   input, scale, offset and incoming gradient as captured here (2.21) are fed to a
   lone ``tf.nn.fused_batch_norm`` (training mode) and its gradient in both
   interpreters; both are compared with a float64 NumPy reference.
3. The first op where the gradients part, named.

Not a test. Run (about a minute per interpreter on an idle 2-core machine)::

    EQUIVTOOL_TF1_PYTHON=~/.cache/equivtool/tf1-env-1.15/bin/python \\
        PYTHONPATH=$PWD .venv/bin/python benchmarks/bn_kernels_tf115.py [--batch 1] [--header]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO_DIR = os.path.join(ROOT, "examples", "slim_zoo")
PROGRAM = os.path.join(ROOT, "benchmarks", "_bn_program.py")
sys.path[:0] = [ROOT]

from equivtool._base import scratch  # noqa: E402
from equivtool._platform.tf1_python import clean_env  # noqa: E402
from equivtool.engine.signals import sigterm_unwinds  # noqa: E402
from benchmarks.zoo_floor import load, machine_line  # noqa: E402
from benchmarks.zoo_tf1_python import add_tf1_python, require_tf1_python  # noqa: E402

SIZE = 224  # the zoo's inception_v1 input (its final 7x7 average pool fixes it)


def run_program(python: str, folder: str, *arguments: str, old: bool) -> None:
    """``_bn_program.py FOLDER ARGUMENTS`` in ``python`` (the old interpreter: a clean
    environment, no TF2_BEHAVIOR; here: this tree on the path); the child is ended
    when this process stops first."""
    env = clean_env() if old else dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    child = subprocess.Popen([python, PROGRAM, folder, *arguments], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = child.communicate()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != 0:
        raise RuntimeError(f"{os.path.basename(PROGRAM)} {' '.join(arguments)} failed in {python}: "
                           f"{output.strip().splitlines()[-1] if output.strip() else child.returncode}")


def read(folder: str, name: str) -> tuple:
    """``(description, {name: array})`` of FOLDER/name.npz and .json."""
    with open(os.path.join(folder, name + ".json")) as f:
        description = json.load(f)
    with np.load(os.path.join(folder, name + ".npz"), allow_pickle=False) as data:
        values = {key: data[f"a{i}"] for i, key in enumerate(description["names"])}
    return description, values


# -- float64 references -------------------------------------------------------------

def reference_forward(x, scale, offset, epsilon) -> tuple:
    """Training-mode batch norm in float64: ``(y, batch mean, batch variance (n/(n-1)), inv std, xhat)``."""
    flat = x.astype(np.float64).reshape(-1, x.shape[-1])
    n = flat.shape[0]
    mean = flat.mean(axis=0)
    variance = ((flat - mean) ** 2).mean(axis=0)
    inverse = 1.0 / np.sqrt(variance + float(epsilon))
    xhat = (flat - mean) * inverse
    y = xhat * scale.astype(np.float64) + offset.astype(np.float64)
    return y.reshape(x.shape), mean, variance * n / max(n - 1, 1), inverse, xhat


def reference_backward(dy, scale, inverse, xhat) -> tuple:
    """Its gradient in float64: ``(dx, dscale, doffset)``."""
    flat = dy.astype(np.float64).reshape(-1, dy.shape[-1])
    n = flat.shape[0]
    doffset = flat.sum(axis=0)
    dscale = (flat * xhat).sum(axis=0)
    dx = scale.astype(np.float64) * inverse * (flat - doffset / n - xhat * dscale / n)
    return dx.reshape(dy.shape), dscale, doffset


# -- table 1: the net, op by op -----------------------------------------------------

def short(op: str) -> str:
    name = op.replace("gradients/", "").replace("_grad/FusedBatchNormGradV3", "")
    return name.replace("InceptionV1/", "").replace("/BatchNorm/FusedBatchNormV3", "")


def layers(description: dict) -> tuple:
    """``(forward layers, gradient layers)`` by op name, each in creation order."""
    forward = {layer["op"]: layer for layer in description["layers"] if layer["kind"] == "forward"}
    backward = {layer["op"]: layer for layer in description["layers"] if layer["kind"] == "gradient"}
    return forward, backward


def net_rows(old: tuple, new: tuple) -> tuple:
    """Per batch norm (forward order): N, variances, the interpreters' differences and
    the ReLU sign flips; and the first gradient op whose incoming gradient parts."""
    (old_d, o), (new_d, n) = old, new
    old_forward, old_backward = layers(old_d)
    new_forward, new_backward = layers(new_d)
    by_forward = {op.replace("gradients/", "").replace("_grad/FusedBatchNormGradV3", ""): op for op in new_backward}
    rows, flips_in_order = [], []
    for op, layer in new_forward.items():
        theirs = old_forward[op]
        x_new, x_old = n[layer["inputs"][0]], o[theirs["inputs"][0]]
        y_new, y_old = n[layer["outputs"][0]], o[theirs["outputs"][0]]
        variance = x_new.astype(np.float64).reshape(-1, x_new.shape[-1]).var(axis=0)
        count = int(np.prod(x_new.shape[:-1]))
        flip = (y_new > 0) != (y_old > 0)
        cells = [f"`{short(op)}`", f"{count}", f"{variance.min():.1e}", f"{np.median(variance):.1e}",
                 f"{np.abs(x_new - x_old).max():.1e}", f"{np.abs(y_new - y_old).max():.1e}", f"{int(flip.sum())}"]
        grad = by_forward.get(op)
        if grad is None:
            cells += ["n/a"] * 3
        else:
            dy_new, dy_old = n[new_backward[grad]["inputs"][0]], o[old_backward[grad]["inputs"][0]]
            apart = np.abs(dy_new.astype(np.float64) - dy_old)
            at = apart[flip].max() if flip.any() else 0.0
            elsewhere = apart[~flip].max() if (~flip).any() else 0.0
            cells += [f"{np.abs(dy_new).max():.1e}", f"{at:.1e}" if flip.any() else "n/a", f"{elsewhere:.1e}"]
            flips_in_order.append((grad, op, int(flip.sum()), at, elsewhere, np.abs(y_new[flip]).max()
                                   if flip.any() else 0.0, np.abs(dy_new).max()))
        rows.append("| " + " | ".join(cells) + " |")
    return rows, first_parting(flips_in_order, list(new_backward))


def first_parting(found: list, backward_order: list) -> str:
    """The first gradient op (in the order the backward pass runs them) whose incoming
    gradient differs between the interpreters by more than 1e-4 of its largest value."""
    by_grad = {row[0]: row for row in found}
    for grad in backward_order:
        _, op, flips, at, elsewhere, near, largest = by_grad[grad]
        if max(at, elsewhere) > 1e-4 * largest:
            where = "at the elements whose ReLU input changed sign" if at > elsewhere else "elsewhere"
            return (f"first parting: the gradient into `{short(op)}` (op `{grad}`), {max(at, elsewhere):.1e} "
                    f"apart against a largest value of {largest:.1e}, {where}: {flips} sign flip(s) of the "
                    f"batch norm's output, at most {near:.1e} from 0; elsewhere {elsewhere:.1e}")
    return "first parting: none (every incoming gradient within 1e-4 of its largest value)"


# -- the counterfactual: the same ReLU pattern on both sides ----------------------------

def write_routes(folder: str, old: tuple, new: tuple) -> tuple:
    """FOLDER/routes.npz and .json (read by _bn_program.py's load_routes): for each batch
    norm whose output changes sign between the interpreters, 2.21's output (the pattern
    its ReLU passes); for every max pool, 2.21's input and output (the window maxima its
    gradient goes to; where both interpreters' maxima are the same, routing by 2.21's
    changes nothing). Returns ``(batch norms, max pools)``."""
    (old_d, o), (new_d, n) = old, new
    old_forward, _ = layers(old_d)
    relu, pool, arrays = [], [], []
    for op, layer in layers(new_d)[0].items():
        y_new, y_old = n[layer["outputs"][0]], o[old_forward[op]["outputs"][0]]
        if ((y_new > 0) != (y_old > 0)).any():
            relu.append(op)
            arrays.append(y_new)
    pools = [layer for layer in new_d["layers"] if layer["kind"] == "pool"]
    for layer in pools:
        pool.append(layer["op"])
    arrays += [n[name] for layer in pools for name in (layer["inputs"][0], layer["outputs"][0])]
    np.savez(os.path.join(folder, "routes.npz"), **{f"a{i}": value for i, value in enumerate(arrays)})
    with open(os.path.join(folder, "routes.json"), "w") as f:
        json.dump({"relu": relu, "pool": pool}, f)
    return relu, pool


def weight_gradients(values: dict) -> list:
    """The keys of the weight gradients (the fetched tensors' names end in ``:N``)."""
    return [k for k in values if k.startswith("gradients/") and ":" not in k]


WATCHED = ("Conv2d_1a_7x7/weights", "Mixed_4e/Branch_0/Conv2d_0a_1x1/weights", "Mixed_5c/Branch_1/Conv2d_0b_3x3/weights")


def gradient_summary(old: dict, new: dict) -> str:
    """The weight gradients' largest difference, the leaves over the guide's tolerance
    (atol 1e-5, rtol 1e-6) and the watched leaves' differences."""
    keys = weight_gradients(new)
    if not keys:
        raise ValueError("gradients: none captured, nothing compared")
    apart = {k: float(np.abs(new[k].astype(np.float64) - old[k]).max()) for k in keys}
    over = sum(1 for k in keys if not np.allclose(old[k], new[k], rtol=1e-6, atol=1e-5))
    worst = max(apart, key=apart.get)
    watched = "; ".join(f"`{w}` {apart['gradients/InceptionV1/' + w]:.1e}" for w in WATCHED
                        if "gradients/InceptionV1/" + w in apart)
    return (f"largest {apart[worst]:.2e} (`{worst[len('gradients/'):]}`); {over} of {len(keys)} over the guide's "
            f"tolerance; {watched}")


def kernel_floors(tf1_python: str, batch: int) -> dict:
    """``{leaf: kernel floor}`` of the check's ``gradients`` step (the zoo's check of
    inception_v1 with the TF1 side in ``tf1_python`` and ``kernel_floor=True``, that
    step only): the floors a routed difference is judged against."""
    import equivtool
    from benchmarks.zoo_tf1_python import floors
    from examples.slim_zoo.zoo import ZOO
    report = equivtool.check_equivalence(
        tf1_fn="contrib_nets:inception_v1", tf2_layer=ZOO["inception_v1"].shim, inputs=ZOO["inception_v1"].inputs(batch),
        tf1_python=tf1_python, tf1_path=[ZOO_DIR], kernel_floor=True, steps=["gradients"])
    found = {leaf: floor for leaf, (_, floor) in floors(report.step("gradients")).items()}
    if not found:
        raise RuntimeError(f"kernel floor: the gradients step measured none ({report.step('gradients').message})")
    return found


def judged(old: dict, new: dict, floor: dict, multiple: float = 10.0) -> tuple:
    """``(within tolerance, within multiple x kernel floor only, beyond both, no floor)``
    over the weight gradients: the check's judgement of each leaf (guide's tolerance
    rtol 1e-6, atol 1e-5; then the kernel floor)."""
    within = floored = beyond = missing = 0
    for key in weight_gradients(new):
        if np.allclose(old[key], new[key], rtol=1e-6, atol=1e-5):
            within += 1
        elif key not in floor or not np.isfinite(floor[key]):
            missing += 1
        elif np.abs(new[key].astype(np.float64) - old[key]).max() <= multiple * floor[key]:
            floored += 1
        else:
            beyond += 1
    if within + floored + beyond + missing == 0:
        raise ValueError("gradients: none compared")
    return within, floored, beyond, missing


# -- table 2: the op alone on identical inputs ---------------------------------------

def write_op_inputs(folder: str, new: tuple) -> list:
    """FOLDER/ops_in.npz and .json: per forward batch norm its captured (2.21) input,
    scale, offset and incoming gradient; the layer names, in order."""
    description, n = new
    forward, backward = layers(description)
    by_forward = {op.replace("gradients/", "").replace("_grad/FusedBatchNormGradV3", ""): op for op in backward}
    arrays, described = {}, []
    for i, (op, layer) in enumerate(item for item in forward.items() if item[0] in by_forward):
        x, scale, offset = (n[name] for name in layer["inputs"])
        arrays.update({f"l{i}_x": x, f"l{i}_scale": scale, f"l{i}_offset": offset,
                       f"l{i}_dy": n[backward[by_forward[op]]["inputs"][0]]})
        described.append({"op": op, "epsilon": layer["epsilon"]})
    np.savez(os.path.join(folder, "ops_in.npz"), **arrays)
    with open(os.path.join(folder, "ops_in.json"), "w") as f:
        json.dump({"layers": described}, f)
    return [(layer, arrays) for layer in described]


PARTS = ("y", "mean", "variance", "dx", "dscale", "doffset")


def op_errors(inputs: list, outputs: dict) -> list:
    """Per layer ``{part: max abs error against float64}`` of one interpreter's outputs."""
    errors = []
    for i, (layer, arrays) in enumerate(inputs):
        x, scale, offset, dy = (arrays[f"l{i}_{part}"] for part in ("x", "scale", "offset", "dy"))
        y, mean, variance, inverse, xhat = reference_forward(x, scale, offset, layer["epsilon"])
        dx, dscale, doffset = reference_backward(dy, scale, inverse, xhat)
        reference = dict(zip(PARTS, (y, mean, variance, dx, dscale, doffset)))
        errors.append({part: float(np.abs(outputs[f"l{i}_{part}"].astype(np.float64)
                                          - reference[part].reshape(outputs[f"l{i}_{part}"].shape)).max())
                       for part in PARTS} | {"largest": {part: float(np.abs(reference[part]).max()) for part in PARTS}})
    return errors


def op_rows(inputs: list, old: list, new: list) -> list:
    """Per layer: each part's error against float64, TF 1.15 / TF 2.21 (``old``, ``new``: :func:`op_errors`)."""
    rows = []
    for i, ((layer, arrays), mine, theirs) in enumerate(zip(inputs, new, old)):
        x = arrays[f"l{i}_x"]
        cells = [f"`{short(layer['op'])}`", str(int(np.prod(x.shape[:-1])))]
        for part in PARTS:
            cells.append(f"{theirs[part]:.1e} / {mine[part]:.1e}")
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def summary(old: list, new: list) -> str:
    """The largest error of each part over the layers, relative to that layer's largest value."""
    cells = []
    for part in PARTS:
        worst = []
        for errors in (old, new):
            worst.append(max(e[part] / e["largest"][part] for e in errors if e["largest"][part]))
        cells.append(f"{part} {worst[0]:.1e} (1.15) / {worst[1]:.1e} (2.21)")
    return "largest error relative to the layer's largest value: " + "; ".join(cells)


NET_HEADER = ("| batch norm | N | smallest variance | median variance | input apart | output apart | ReLU sign flips "
              "| largest incoming gradient | gradient apart at the flips | gradient apart elsewhere |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
OP_HEADER = ("| batch norm | N | y | batch mean | batch variance | dx | dscale | doffset |\n"
             "|---|---:|---:|---:|---:|---:|---:|---:|")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/bn_kernels_tf115.py", description=__doc__.split("\n")[0])
    add_tf1_python(parser)
    parser.add_argument("--batch", type=int, default=1, help="the batch (default 1, the zoo's)")
    parser.add_argument("--header", action="store_true", help="print the machine line first")
    parser.add_argument("--kernel-floor", action="store_true",
                        help="also run the check's gradients step with kernel_floor=True and judge the "
                             "gradients, as computed and routed alike, against its floors")
    args = parser.parse_args(argv)
    require_tf1_python(parser, args)
    if args.batch < 1:
        parser.error(f"--batch: expected a positive int, got {args.batch}")
    if args.header:
        print(f"machine: {machine_line()}", flush=True)
    print(f"# inception_v1, {SIZE} px, batch {args.batch}: load average at start {load()}", flush=True)
    with sigterm_unwinds(), tempfile.TemporaryDirectory(prefix=scratch.prefix("bn-kernels")) as folder:
        old_folder, new_folder = os.path.join(folder, "old"), os.path.join(folder, "new")
        os.mkdir(old_folder)
        os.mkdir(new_folder)
        net = ("net", "inception_v1", ZOO_DIR, str(args.batch), str(SIZE))
        run_program(args.tf1_python, old_folder, *net, old=True)
        run_program(sys.executable, new_folder, *net, old=False)
        old, new = read(old_folder, "net"), read(new_folder, "net")
        print(f"# TensorFlow {old[0]['tensorflow']} (Python {old[0]['python']}) against "
              f"{new[0]['tensorflow']} (Python {new[0]['python']})", flush=True)
        print(f"# loss: {float(old[1]['loss']):.9g} (1.15), {float(new[1]['loss']):.9g} (2.21)", flush=True)
        rows, parting = net_rows(old, new)
        print(NET_HEADER)
        print("\n".join(rows))
        print(f"# {parting}", flush=True)
        routed_folder = os.path.join(folder, "old_routed")
        os.mkdir(routed_folder)
        relu, pool = write_routes(routed_folder, old, new)
        run_program(args.tf1_python, routed_folder, *net, old=True)
        routed = read(routed_folder, "net")
        if routed[0].get("routed") != sorted(relu + pool):
            raise RuntimeError(f"routes: expected the 1.15 run to route {len(relu) + len(pool)} ops, "
                               f"it routed {len(routed[0].get('routed') or [])}")
        print(f"# weight gradients, TF 1.15 against 2.21: {gradient_summary(old[1], new[1])}", flush=True)
        print(f"# the same, TF 1.15's gradient routed as 2.21's (the ReLU after the {len(relu)} batch norm(s) "
              f"with a sign flip, the {len(pool)} max pools), its values its own: "
              f"{gradient_summary(routed[1], new[1])}", flush=True)
        if args.kernel_floor:
            floor = kernel_floors(args.tf1_python, args.batch)
            for what, values in (("as computed", old[1]), ("routed as 2.21's", routed[1])):
                within, floored, beyond, missing = judged(values, new[1], floor)
                print(f"# judged as the check judges them, TF 1.15's gradients {what}: {within} within tolerance, "
                      f"{floored} within 10 x their kernel floor, {beyond} beyond it, {missing} without a floor",
                      flush=True)
        inputs = write_op_inputs(old_folder, new)
        os.link(os.path.join(old_folder, "ops_in.npz"), os.path.join(new_folder, "ops_in.npz"))
        os.link(os.path.join(old_folder, "ops_in.json"), os.path.join(new_folder, "ops_in.json"))
        run_program(args.tf1_python, old_folder, "ops", old=True)
        run_program(sys.executable, new_folder, "ops", old=False)
        (old_ops_d, old_ops), (new_ops_d, new_ops) = read(old_folder, "ops_out"), read(new_folder, "ops_out")
        print(f"# the op alone: {old_ops_d['op_types']} (1.15), {new_ops_d['op_types']} (2.21); "
              "each cell: max abs error against float64, TF 1.15 / TF 2.21")
        print(OP_HEADER)
        old_errors, new_errors = op_errors(inputs, old_ops), op_errors(inputs, new_ops)
        print("\n".join(op_rows(inputs, old_errors, new_errors)))
        print(f"# {summary(old_errors, new_errors)}")
    print(f"# load average at end {load()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
