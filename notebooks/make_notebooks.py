"""Write (and optionally execute) the two notebooks from the Python source below.

    python notebooks/make_notebooks.py             # rewrite both .ipynb files, without outputs
    python notebooks/make_notebooks.py --execute   # rewrite and execute them, saving outputs
    python notebooks/make_notebooks.py --execute deterministic_xent   # just one

The notebooks are generated so that their code reads as plain Python in a
review; edit the cells here, then regenerate with ``--execute`` (run it with
the Python of ``.venv``: the kernel runs the launching interpreter, see
:func:`execute`). ``tests/test_notebooks.py`` executes the committed
notebooks with :func:`execute` and checks that they match this source.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))

KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def md(text: str):
    return new_markdown_cell(textwrap.dedent(text).strip("\n"))


def code(text: str):
    return new_code_cell(textwrap.dedent(text).strip("\n"))


# Shared by both notebooks: quiet TensorFlow, equivtool before TensorFlow.
SETUP = '''
import contextlib
import os
import sys
import warnings

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"   # no C++ log lines in the outputs
warnings.filterwarnings("ignore")           # tf-slim / tf-keras deprecation notices


@contextlib.contextmanager
def start_up_lines_silenced():
    """TensorFlow 2.21 writes a few start-up lines (oneDNN, CUDA probe) straight to file
    descriptor 2 while it loads, before TF_CPP_MIN_LOG_LEVEL applies; keep them out."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


with start_up_lines_silenced():
    import equivtool                        # first: selects legacy Keras (tf-keras) before TensorFlow loads
    import numpy as np
    import tensorflow as tf
    tf.config.list_physical_devices()       # the device probe logs once, on first use

tf.get_logger().setLevel("ERROR")
'''


# ---------------------------------------------------------------------------
# validate_correctness.ipynb
# ---------------------------------------------------------------------------

def validate_correctness():
    cells = [
        md('''
        # Validating correctness and numerical equivalence, with equivtool

        TensorFlow's migration guide *Validating correctness & numerical equivalence* checks a
        TF1 model against its TF2 port in five hand-written steps. This notebook walks through
        the same steps with equivtool, each on a small model where it is cheap to show, and then
        runs them all on **Inception-ResNet-v2** (tf-slim, TF1 graph) against its TF2 shim layer
        with one call, `equivtool.check_equivalence`.

        | guide step | equivtool | report step |
        |---|---|---|
        | 1. variables are created once | `assert_no_variable_creations`, `catch_and_raise_created_variables`, `creates_variables_once` | `variables_once` |
        | 2. variable parity | `tf1_variables`, `tf2_variables`, `compare_variables` | `parity` |
        | 3. fixed weights: same outputs and regularization losses | done by the engine (`fixed_value` per variable name and shape) | `fixed_weights` |
        | 4. random numbers under `DeterministicRandomTestTool` | `equivtool.DeterministicRandomTestTool`, modes `constant` and `num_random_ops` | `random/...` |
        | 5. training: gradients | gradients of a scalar loss w.r.t. every trainable variable, matched by name | `gradients` |

        The image size is kept at 107 x 107 (the smallest at which the auxiliary head fits)
        so the whole notebook runs in a minute or two on a 2-core CPU.
        '''),
        code(SETUP + '''
import functools
from pathlib import Path

import tf_slim as slim

# The Inception-ResNet-v2 example is the repository's examples/ package: find the checkout
# from the working directory, or else from where equivtool is installed (editable install).
def _repository_root() -> Path:
    for base in (Path.cwd(), *Path.cwd().parents, Path(equivtool.__file__).resolve().parents[1]):
        if (base / "examples" / "inception_resnet_v2" / "keras_shim.py").is_file():
            return base
    raise FileNotFoundError("examples/inception_resnet_v2 not found: run this notebook from an equivtool checkout")

sys.path.insert(0, str(_repository_root()))
from examples.inception_resnet_v2 import keras_shim, parity

print(f"equivtool {equivtool.__version__}, TensorFlow {tf.__version__}, "
      f"tf.keras from {tf.keras.__name__.split('.')[0]!r}, devices: "
      f"{[d.device_type for d in tf.config.list_physical_devices()]}")
'''),
        md('''
        ## The model mapping

        The TF2 side is the TF1 code itself, run inside a Keras layer whose `call` is decorated
        with `tf.compat.v1.keras.utils.track_tf1_style_variables`: the layer then owns the
        variables that `tf.compat.v1.get_variable` and tf-slim create, under the same names as in
        the TF1 graph. The small model below (the README's) is the pattern; the
        Inception-ResNet-v2 shim in `examples/inception_resnet_v2/keras_shim.py` is the same
        thing with the full tf-slim network inside.

        `tf1_forward(inputs, training)` builds the TF1 graph and returns its end points in
        forward order; equivtool uses that order to name the first end point where the numbers
        part.
        '''),
        code('''
def tf1_forward(inputs, training, bn_epsilon=1e-5):
    """Builds the TF1 graph, as the old code did; returns end points in forward order."""
    end_points = {}
    with tf.compat.v1.variable_scope("net"):
        net = slim.conv2d(inputs, 8, 3, scope="conv1"); end_points["conv1"] = net
        net = slim.batch_norm(net, scale=True, epsilon=bn_epsilon, is_training=training, scope="bn1")
        end_points["bn1"] = net
        net = slim.dropout(slim.flatten(net), 0.8, is_training=training)
        end_points["logits"] = slim.fully_connected(net, 10, activation_fn=None, scope="logits")
    return end_points


class Net(tf.keras.layers.Layer):
    """The TF2 shim: the same code, with its variables tracked by the layer."""

    @equivtool.creates_variables_once
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs, training=None):
        return tf1_forward(inputs, bool(training))


x = np.random.RandomState(0).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
print({name: tuple(t.shape) for name, t in Net()(x).items()})
'''),
        md('''
        ## Step 1: variables are created once

        A shim layer must create its variables on the first call and reuse them on every later
        call. The guide's classic mistake is a layer object (or a `tf.Variable`) constructed
        inside `call`: every call then makes fresh, randomly initialised weights, and outputs
        silently change from call to call.

        `equivtool.assert_no_variable_creations()` raises at the line that creates a variable;
        `catch_and_raise_created_variables()` lets the block finish and lists every variable
        created in it. `@equivtool.creates_variables_once` (on `Net.call` above) applies the first
        guard automatically to every call after the first.
        '''),
        code('''
class BrokenLayer(tf.keras.layers.Layer):
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs):
        with tf.compat.v1.variable_scope("dense_one"):
            out = tf.compat.v1.layers.dense(inputs, 4)      # tracked by the shim: reused on later calls
        return tf.keras.layers.Dense(2, name="dense_two")(out)  # BUG: a new Dense layer on every call


broken = BrokenLayer()
features = np.ones((1, 3), np.float32)
broken(features)                                     # the first call may create variables
try:
    with equivtool.assert_no_variable_creations():
        broken(features)                             # the second one must not
except equivtool.VariableCreationError as error:
    message = str(error)
    print("VariableCreationError:", message[message.find("Variable "):])
'''),
        code('''
try:
    with equivtool.catch_and_raise_created_variables():
        broken(features)
except equivtool.VariableCreationError as error:
    print(error)
'''),
        md('''
        The fix is to create nested Keras layers once, e.g. in `__init__` (or with
        `tf.compat.v1.keras.utils.get_or_create_layer` inside `call`). The fixed layer passes the
        guard:
        '''),
        code('''
class FixedLayer(tf.keras.layers.Layer):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense_two = tf.keras.layers.Dense(2, name="dense_two")   # created once

    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs):
        with tf.compat.v1.variable_scope("dense_one"):
            out = tf.compat.v1.layers.dense(inputs, 4)
        return self.dense_two(out)


fixed = FixedLayer()
first = fixed(features)
with equivtool.assert_no_variable_creations():
    second = fixed(features)
print("second call created no variable; outputs equal:", np.array_equal(first, second))
'''),
        md('''
        ## Step 2: variable parity

        Both sides must hold the same variables: same names, shapes, dtypes and trainability.
        `tf1_variables` builds the TF1 function in a fresh `tf.Graph` and reads its collections;
        `tf2_variables` calls the layer twice (the second call under the step-1 guard) and reads
        `layer.variables`; `compare_variables` lines them up by name.
        '''),
        code('''
expected = equivtool.tf1_variables(tf1_forward, x, True)
actual = equivtool.tf2_variables(Net(), x, training=True)
print(equivtool.compare_variables(expected, actual))
'''),
        md('''
        A port often renames an outer scope. Parity then fails and says which names are on one
        side only; a `rename` rule (regular expression to replacement) maps the names to one key
        and the check passes. `check_equivalence` takes the same `rename` argument.
        '''),
        code('''
def tf1_forward_old_scope(inputs, training):       # the TF1 code had one more outer scope
    with tf.compat.v1.variable_scope("legacy"):
        return tf1_forward(inputs, training)

renamed = equivtool.tf1_variables(tf1_forward_old_scope, x, True)
print(equivtool.compare_variables(renamed, actual))
print()
print(equivtool.compare_variables(renamed, actual, rename={r"^legacy/": ""}))
'''),
        md('''
        ## Step 3: fixed weights

        Random initialisers draw different numbers in a TF1 session and in eager code, so the
        guide assigns every variable a fixed, non-random value and compares inference outputs
        and regularization losses. equivtool's `fixed_weights` step derives each value from the
        variable's name and shape alone (so both sides get the same numbers without sharing a
        checkpoint), runs both sides, compares every end point, and restores the weights.

        Because the end points are compared in forward order, a bug is located where it
        starts. Here the "port" forgot the TF1 code's `epsilon=1e-5` in batch norm (slim's
        default is 1e-3): the convolution still matches, `bn1` is the first end point to part.
        '''),
        code('''
class PortWithBug(tf.keras.layers.Layer):
    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs, training=None):
        return tf1_forward(inputs, bool(training), bn_epsilon=1e-3)    # BUG: slim's default epsilon

bug_report = equivtool.check_equivalence(tf1_forward, PortWithBug, x, steps=["fixed_weights"])
print(bug_report.table())
print(bug_report.verdict())
'''),
        md('''
        ## Step 4: random numbers, `DeterministicRandomTestTool`

        Dropout, random initialisers and other stateful random ops draw different numbers in a
        TF1 graph and in eager TF2 code. Inside a `DeterministicRandomTestTool` scope every
        random op gets a fixed seed, so both sides draw the same numbers:

        * `mode="constant"`: every op gets the same seed, whatever the order of the ops, so ops
          of equal shape draw equal values (simplest; catches everything but order mistakes);
        * `mode="num_random_ops"`: the seed counts the random ops created so far, so the values
          follow program order (stricter: both sides must create their random ops in the same
          order).

        The cell below is the guide's demonstration: three uniform draws in a TF1 session and
        eagerly, under a fresh tool for each side.
        '''),
        code('''
def three_draws():
    return tf.random.uniform([3, 1]), tf.random.uniform([3, 3]), tf.random.uniform([3, 3])

for mode in ("constant", "num_random_ops"):
    tool = equivtool.DeterministicRandomTestTool(mode=mode)
    with tool.scope():
        graph = tf.Graph()
        with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
            tf1_values = session.run(three_draws())
    tool = equivtool.DeterministicRandomTestTool(mode=mode)
    with tool.scope():
        tf2_values = [t.numpy() for t in three_draws()]
    same = all(np.array_equal(a, b) for a, b in zip(tf1_values, tf2_values))
    print(f"{mode:15s} TF1 graph == TF2 eager: {same}; "
          f"the two [3, 3] draws equal each other: {np.array_equal(tf2_values[1], tf2_values[2])}")
'''),
        md('''
        Under the tool, `check_equivalence` compares inference and training outputs (dropout on,
        batch norm in training mode) in each selected mode. In `constant` mode one TF1 graph and
        one TF2 layer serve both passes; `num_random_ops` needs a fresh graph and a fresh layer
        per pass, as in the guide.

        ## Step 5: gradients

        In training mode, under the `constant` random tool, equivtool computes a scalar loss
        (default: mean square of the first output plus the regularization loss; pass `loss_fn`
        for your own) and its gradient with respect to every trainable variable on both sides,
        and compares them matched by variable name. With `optimizers=(make_tf1, make_tf2)` the
        `optimizer` step goes on to compare several training steps.

        On the small model, all the default steps in both random modes take a few seconds:
        '''),
        code('''
small_report = equivtool.check_equivalence(tf1_forward, Net, x)
print(small_report.table())
print(small_report.verdict())
'''),
        md('''
        ## All steps in one call: Inception-ResNet-v2

        The TF1 side is `keras_shim.tf1_forward` (the tf-slim network inside its arg scope, the
        published configuration: batch-norm scale and the auxiliary logits head); the TF2 side
        is a fresh `keras_shim.InceptionResnetV2` layer per need (`make_shim` is the factory).
        One batch of one 107 x 107 image.

        Two choices, both stated in the call:

        * `modes=("constant",)` keeps this cell near a minute on a shared 2-core CPU. The
          `num_random_ops` mode needs a fresh graph and a fresh layer for each of its two
          passes, which roughly doubles the time; `equivtool demo --image-size 107` runs both
          modes. Building the two models is charged to the first step, `variables_once`.
        * Gradients get `rtol=1e-4` (the guide's `atol=1e-5` kept); every other step uses the
          guide's `rtol=1e-6, atol=1e-5`. The first convolution's weight gradient sums over
          every position of a 53 x 53 map after back-propagating through about 450 layers;
          the TF1 graph and eager TF2 (and, from run to run, multi-threaded CPU kernels)
          accumulate those float32 sums in different orders, which moves single elements by
          up to about 1e-4 *relative*. How much that is in absolute terms depends on the loss
          scale: with 1001 classes these gradients are small and pass the guide's tolerance
          by a margin of 5-20x, with 10 classes one element in 864 misses it by a hair (a
          difference of 1.05e-5). A relative allowance states the cause instead of relying on the scale.
        '''),
        code('''
import time

def show_progress(step):
    print(f"  {step.name:28s} {step.status:7s} {step.seconds:6.1f}s", flush=True)

images = np.random.RandomState(0).uniform(-1, 1, (1, 107, 107, 3)).astype(np.float32)
model_kwargs = parity.model_kwargs()          # batch_norm_scale=True, create_aux_logits=True
start = time.perf_counter()
report = equivtool.check_equivalence(
    functools.partial(keras_shim.tf1_forward, num_classes=1001, **model_kwargs),
    functools.partial(keras_shim.make_shim, 1001, **model_kwargs),
    images,
    modes=("constant",),
    step_tolerances={"gradients": equivtool.Tolerance(rtol=1e-4, atol=1e-5)},
    progress=show_progress,
    meta={"model": "Inception-ResNet-v2", "image_size": 107},
)
print(f"total {time.perf_counter() - start:.0f}s")
'''),
        md('''
        ## The report

        `print(report)` gives the table: one row per step, its status, time, the largest
        absolute difference and, for a failing step, the first end point or variable that
        differs (the failing steps' details follow the verdict). `report.step(name)` returns a
        step's full result; `report.to_html(path)` writes a self-contained page with a
        per-end-point error plot, `report.to_json(path)` the same data as JSON, and
        `report.raise_for_failure()` turns a failure into an `AssertionError` for tests (the
        pytest helper `equivtool.testing.assert_equivalent` does the whole call).
        '''),
        code('''
print(report)
'''),
        code('''
parity_data = report.step("parity").data
print(f"variables: {parity_data['tf1_variables']} on each side, {parity_data['trainable']} trainable "
      f"({parity_data['trainable_parameters']:,} parameters); gradients compared: "
      f"{report.step('gradients').data['variables']}")
print("Inception-ResNet-v2:", report.raise_for_failure().verdict())
'''),
    ]
    return cells


# ---------------------------------------------------------------------------
# deterministic_xent.ipynb
# ---------------------------------------------------------------------------

def deterministic_xent():
    cells = [
        md('''
        # A deterministic softmax cross-entropy: `equivtool.ops`

        Training the same model twice on the same GPU, with the same seeds and the same data,
        can give different weights. One known source is TensorFlow's fused softmax
        cross-entropy (`tf.nn.sparse_softmax_cross_entropy_with_logits` and
        `tf.nn.softmax_cross_entropy_with_logits`): its back-prop on GPU is non-deterministic
        ([tensorflow/tensorflow#38185](https://github.com/tensorflow/tensorflow/issues/38185)).

        **Why.** Per row, the op reduces the logits twice (the maximum, then the sum of
        `exp(logit - max)`); on a GPU a row's reduction is split across threads, and the partial
        sums are combined in an order that depends on scheduling. Floating-point addition is not
        associative, so a different combination order changes the last bits of the sum, and
        those bits flow into the loss, the gradient and, step after step, the weights.
        TensorFlow's own answer, under op determinism, has been to refuse (an
        `UnimplementedError`) or to fall back to a composite of slower, unfused ops.

        **equivtool's op** (`equivtool/ops/kernels`) computes each row in an order fixed by the number
        of classes alone: on the CPU rows are sharded over threads, each row reduced by one thread; on the GPU one thread block per row,
        merging per-thread partial states in a fixed halving tree, with no atomics and no
        cross-block reduction. Results are bitwise reproducible across runs, thread counts and
        batch splits.

        The cell below shows the root cause in NumPy: the same float32 numbers, summed in two
        orders.
        '''),
        code('''
import numpy as np

values = np.random.RandomState(0).standard_normal(100_000).astype(np.float32)
forward_sum = np.float32(0)
for v in values[:2000]:
    forward_sum += v
backward_sum = np.float32(0)
for v in values[:2000][::-1]:
    backward_sum += v
print(f"sum of 2000 float32 values, front to back: {forward_sum!r}; back to front: {backward_sum!r}; "
      f"equal: {forward_sum == backward_sum}")
'''),
        md('''
        ## Setup

        `import equivtool` comes before TensorFlow. `op_status()` reports the compiled op
        library (built against the installed TensorFlow by the package install, or by
        `equivtool build-ops`).
        '''),
        code(SETUP + '''
import time

import equivtool.ops as xops

status = xops.op_status()
print(f"op library built: {status['built']}, for TensorFlow {status['built_for_tf']}, "
      f"CUDA kernels compiled: {status['cuda']}")
gpus = tf.config.list_physical_devices("GPU")
print(f"GPUs visible here: {len(gpus)}" + ("" if gpus else
      " -- no GPU on this machine: the checks below run the CPU kernel; the GPU kernel "
      "shares its row arithmetic (xent_row.h)"))
'''),
        md('''
        ## The swap-in: `deterministic_xent()`

        Call `xops.sparse_softmax_cross_entropy_with_logits` directly, or leave the model code
        alone and wrap it in `with xops.deterministic_xent():`. Inside the block, TensorFlow's
        public cross-entropy functions (`tf.nn...`, `tf.compat.v1.nn...`,
        `tf.compat.v1.losses...`) and tf-keras' losses with `from_logits=True` run on
        equivtool's op; every patched global is restored when the block exits, even on an
        exception.
        '''),
        code('''
rng = np.random.RandomState(0)
logits = tf.constant(rng.standard_normal((256, 1000)).astype(np.float32) * 3)
labels = tf.constant(rng.randint(0, 1000, 256).astype(np.int32))

def ops_in(fn):
    """The op types a traced call of fn runs."""
    graph = tf.function(fn).get_concrete_function().graph
    return sorted({op.type for op in graph.get_operations()
                   if "Xent" in op.type or "CrossEntropy" in op.type})

keras_loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
print("outside the block:", ops_in(lambda: tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)),
      ops_in(lambda: keras_loss(labels, logits)))
with xops.deterministic_xent():
    print("inside the block: ", ops_in(lambda: tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)),
          ops_in(lambda: keras_loss(labels, logits)))
print("after the block:  ", ops_in(lambda: tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)))
'''),
        md('''
        ## Determinism: repeated runs are bitwise identical

        The loss and its gradient with respect to the logits, five times over, and the loss of
        the whole batch against the losses of its two halves computed separately (a batch split
        must not change a row's result). Bitwise: `np.array_equal`, no tolerance.
        '''),
        code('''
def loss_and_gradient(logits, labels):
    with tf.GradientTape() as tape:
        tape.watch(logits)
        loss = xops.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        total = tf.reduce_mean(loss)
    return loss.numpy(), tape.gradient(total, logits).numpy()

runs = [loss_and_gradient(logits, labels) for _ in range(5)]
repeat_identical = all(np.array_equal(loss, runs[0][0]) and np.array_equal(grad, runs[0][1])
                       for loss, grad in runs[1:])
halves = np.concatenate([
    xops.sparse_softmax_cross_entropy_with_logits(labels=labels[:100], logits=logits[:100]).numpy(),
    xops.sparse_softmax_cross_entropy_with_logits(labels=labels[100:], logits=logits[100:]).numpy()])
split_identical = np.array_equal(halves, runs[0][0])
print(f"5 repeat runs bitwise identical (loss and gradient): {repeat_identical}")
print(f"batch split 100 + 156 bitwise identical to the whole batch: {split_identical}")
assert repeat_identical and split_identical
'''),
        md('''
        ## Agreement with `tf.nn.sparse_softmax_cross_entropy_with_logits`

        Bitwise equality with TensorFlow's op is not the goal (the two sum in different orders);
        agreement within float32 rounding is. Loss and gradient, against TensorFlow's fused op,
        with the migration guide's tolerance (`rtol=1e-6, atol=1e-5`).
        '''),
        code('''
with tf.GradientTape() as tape:
    tape.watch(logits)
    tf_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    tf_total = tf.reduce_mean(tf_loss)
tf_grad = tape.gradient(tf_total, logits).numpy()
our_loss, our_grad = runs[0]
tolerance = equivtool.Tolerance(rtol=1e-6, atol=1e-5)
for name, ours, theirs in (("loss", our_loss, tf_loss.numpy()), ("gradient", our_grad, tf_grad)):
    close = bool(tolerance.close(theirs, ours).all())
    print(f"{name:8s} max abs difference {np.max(np.abs(ours - theirs)):.2e}; "
          f"within rtol=1e-6, atol=1e-5: {close}")
    assert close, name
'''),
        md('''
        ## Huge logits stay finite

        The loss is `logsumexp(logits) - logits[label]`. Computed naively, `exp(10000)`
        overflows float32 to `inf`; the op (like TensorFlow's) subtracts the row maximum first,
        so a row shifted by 10000 has exactly the loss of the unshifted row.
        '''),
        code('''
big = tf.constant([[0., 1., 2., 3.], [10000., 10001., 10002., 10003.]])
target = tf.constant([3, 3])
naive = tf.math.log(tf.reduce_sum(tf.exp(big), axis=-1)) - tf.gather(big, target, batch_dims=1)
ours = xops.sparse_softmax_cross_entropy_with_logits(labels=target, logits=big).numpy()
theirs = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=target, logits=big).numpy()
print("naive log(sum(exp(x))) - x[label]:", naive.numpy())
print("equivtool:                        ", ours)
print("tf.nn:                            ", theirs)
stable = bool(np.all(np.isfinite(ours)) and ours[0] == ours[1])
print(f"stable: {stable} (both rows finite and equal)")
assert stable
'''),
        md('''
        ## Speed

        The op's benchmark (`benchmarks/bench_xent.py`) writes its table to the
        "Cross-entropy op" section of `benchmarks/RESULTS.md`: median milliseconds of a
        `tf.function`, TensorFlow's fused op against equivtool's, measured side by side on the
        same machine. The cell below reads that table; when the checkout has no such section
        yet, it times a few small shapes here instead (and says so).
        '''),
        code('''
import re
from pathlib import Path

COLUMNS = ("TF fwd", "ours fwd", "TF fwd+bwd", "ours fwd+bwd")

def results_table():
    """Rows of the cross-entropy table in benchmarks/RESULTS.md, or None."""
    for base in (Path.cwd(), *Path.cwd().parents, Path(equivtool.__file__).resolve().parents[1]):
        path = base / "benchmarks" / "RESULTS.md"
        if path.is_file():
            break
    else:
        return None
    text = path.read_text(encoding="utf-8")
    section = re.search(r"^## [^\\n]*cross[- ]entropy.*?(?=^## |\\Z)", text,
                        flags=re.IGNORECASE | re.MULTILINE | re.DOTALL)
    if not section:
        return None
    lines = [line.strip().strip("|").split("|") for line in section.group(0).splitlines()
             if line.strip().startswith("|")]
    if len(lines) < 3:
        return None
    header = [cell.strip() for cell in lines[0]]
    if not all(column in header for column in COLUMNS + ("shape", "dtype")):
        return None
    rows = []
    for cells in lines[2:]:                           # lines[1] is the |---| rule
        row = dict(zip(header, (cell.strip() for cell in cells)))
        try:
            rows.append({"label": f"{row['shape']} {row['dtype']}",
                         **{column: float(row[column]) for column in COLUMNS}})
        except (KeyError, ValueError):
            return None
    return rows or None


def time_here(shapes=((64, 1000), (256, 1000), (256, 8192), (1024, 8192)), rounds=7):
    """Median ms per call, eager, float32; the two ops alternate within each round."""
    ops = {"TF": tf.nn.sparse_softmax_cross_entropy_with_logits,
           "ours": xops.sparse_softmax_cross_entropy_with_logits}

    def forward(op, labels, logits):
        return op(labels=labels, logits=logits).numpy()

    def forward_backward(op, labels, logits):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            total = tf.reduce_sum(op(labels=labels, logits=logits))
        return tape.gradient(total, logits).numpy()

    rows = []
    for b, c in shapes:
        shape_logits = tf.constant(rng.standard_normal((b, c)).astype(np.float32))
        shape_labels = tf.constant(rng.randint(0, c, b).astype(np.int32))
        row = {"label": f"[{b}, {c}] float32"}
        for suffix, run in ((" fwd", forward), (" fwd+bwd", forward_backward)):
            samples = {name: [] for name in ops}
            for name in ops:
                run(ops[name], shape_labels, shape_logits)        # warm up
            for round_ in range(rounds):
                for name in (list(ops) if round_ % 2 else list(ops)[::-1]):
                    start = time.perf_counter()
                    run(ops[name], shape_labels, shape_logits)
                    samples[name].append(time.perf_counter() - start)
            for name in ops:
                row[name + suffix] = float(np.median(samples[name])) * 1e3
        rows.append(row)
    return rows


rows = results_table()
source = "benchmarks/RESULTS.md (bench_xent.py)"
if rows is None:
    print("benchmarks/RESULTS.md has no cross-entropy table yet: timing small shapes here, eagerly, on CPU.")
    rows = time_here()
    source = "timed in this notebook (eager, small shapes)"
print(f"source: {source}")
print(f"{'shape, dtype':24s} {'TF fwd':>8s} {'ours fwd':>9s} {'speed-up':>9s} {'TF fwd+bwd':>11s} "
      f"{'ours fwd+bwd':>13s} {'speed-up':>9s}")
for row in rows:
    print(f"{row['label']:24s} {row['TF fwd']:8.2f} {row['ours fwd']:9.2f} "
          f"{row['TF fwd'] / row['ours fwd']:8.1f}x {row['TF fwd+bwd']:11.2f} {row['ours fwd+bwd']:13.2f} "
          f"{row['TF fwd+bwd'] / row['ours fwd+bwd']:8.1f}x")
'''),
        code('''
import io

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from IPython.display import Image, display

fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
positions = np.arange(len(rows))
for ax, suffix, title in zip(axes, (" fwd", " fwd+bwd"), ("forward", "forward + backward")):
    tf_ms = [row["TF" + suffix] for row in rows]
    our_ms = [row["ours" + suffix] for row in rows]
    ax.bar(positions - 0.2, tf_ms, width=0.4, label="tf.nn (fused)")
    ax.bar(positions + 0.2, our_ms, width=0.4, label="equivtool")
    for x, theirs, ours in zip(positions, tf_ms, our_ms):
        ax.annotate(f"{theirs / ours:.1f}x", (x + 0.2, ours), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(positions, [row["label"] for row in rows], fontsize=7, rotation=15)
    ax.set_yscale("log")
    ax.set_ylabel("median ms (log scale)", fontsize=8)
    ax.set_title(title, fontsize=10)
axes[0].legend(fontsize=8)
fig.suptitle(f"Sparse softmax cross-entropy on CPU; speed-up over tf.nn on the bars. Source: {source}",
             fontsize=9)
fig.tight_layout()
buffer = io.BytesIO()
fig.savefig(buffer, format="png", dpi=70)           # a small PNG keeps the notebook small
plt.close(fig)
display(Image(buffer.getvalue()))
'''),
        md('''
        ## Summary

        * `xops.sparse_softmax_cross_entropy_with_logits` / `xops.softmax_cross_entropy_with_logits`
          are drop-in replacements for `tf.nn`'s, with gradients (first and second order).
        * `with xops.deterministic_xent():` routes existing model code through them without
          edits and restores TensorFlow afterwards.
        * Repeat runs and batch splits give bitwise identical losses and gradients; the values
          agree with TensorFlow's op to float32 rounding; huge logits stay finite.
        * A GPU was not available for this run; on a GPU the same checks apply unchanged (the
          CUDA kernel uses the same fixed-order row arithmetic).
        '''),
    ]
    return cells


NOTEBOOKS = {
    "validate_correctness": validate_correctness,
    "deterministic_xent": deterministic_xent,
}


def build(name: str):
    nb = new_notebook(cells=NOTEBOOKS[name]())
    for index, cell in enumerate(nb.cells):          # stable ids: regenerating changes no id
        cell["id"] = f"cell-{index:02d}"
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def execute(nb, cwd: str = HERE, timeout: int = 600):
    """Execute ``nb`` in place, in a kernel running this interpreter, with ``cwd`` as working directory.

    The kernel is ipykernel's built-in ``python3`` spec, whose command is
    ``sys.executable -m ipykernel_launcher``: no ``ipykernel install`` is needed,
    and no kernelspec installed elsewhere (user or system Jupyter directories)
    can substitute another interpreter.
    """
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient
    from traitlets import default

    class ThisInterpreterKernelManager(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _only_the_native_spec(self):
            return KernelSpecManager(kernel_dirs=[], ensure_native_kernel=True)

    # The client creates the kernel manager, so it also shuts the kernel down.
    client = NotebookClient(nb, kernel_manager_class=ThisInterpreterKernelManager,
                            kernel_name=KERNELSPEC["name"], timeout=timeout, record_timing=False,
                            resources={"metadata": {"path": cwd}})
    client.execute()
    return nb


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--execute", action="store_true", help="execute and save the outputs")
    parser.add_argument("names", nargs="*", metavar="name",
                        help=f"which notebooks, among {', '.join(NOTEBOOKS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(NOTEBOOKS))
    if unknown:
        parser.error(f"unknown notebook(s) {unknown}; choose from {list(NOTEBOOKS)}")
    for name in args.names or list(NOTEBOOKS):
        nb = build(name)
        if args.execute:
            print(f"executing {name} ...", flush=True)
            execute(nb)
        path = os.path.join(HERE, f"{name}.ipynb")
        nbformat.validate(nb)
        nbformat.write(nb, path)
        print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
