"""The guide's own code for its steps 1-4, as the primary baseline of ``bench_parity.py``.

TensorFlow's guide "Validating correctness & numerical equivalence"
(tensorflow/docs, ``site/en/guide/migrate/validate_correctness.ipynb``) checks
a shim-wrapped tf-slim Inception-ResNet-v2 against its TF1 graph in four
steps. :func:`run_guide` runs those steps the way the notebook's code cells
write them: the same graphs and sessions, the same calls in the same order,
``tf.ones`` inputs, the same asserts and ``np.testing.assert_allclose`` calls
with the notebook's tolerances (its step 3 gives ``rtol=1e-06`` for the
regularization loss; every other comparison uses NumPy's defaults,
``rtol=1e-07, atol=0``), and a TF1 session with TensorFlow's default graph
optimizations. Only these substitutions are made by hand:

* the model: the project's Inception-ResNet-v2
  (``examples/inception_resnet_v2``, configured by ``parity.model_kwargs()``:
  ``batch_norm_scale=True`` as in the notebook, and the aux head the
  notebook's model builds by default) replaces the notebook's copy of the
  tf-slim model zoo; ``inception_resnet_v2(inputs, num_classes, is_training)``
  and ``InceptionResnetV2(num_classes)`` keep the notebook's signatures;
* the slim import alias (``import tf_slim as slim``), which the project's
  model uses;
* the random tool: the notebook defines ``DeterministicTestTool`` in a cell;
  tf-keras ships the same tool as
  ``tf.compat.v1.keras.utils.DeterministicRandomTestTool``, which is used here;
* sizes: ``height, width`` and the batch come from the benchmark's
  ``--image-size`` and ``--batch-size`` (the notebook uses 299 and 1), and
  ``num_classes`` is the benchmark's.

One setting follows the notebook's own troubleshooting advice rather than its
cells: with TensorFlow 2.21 on a CPU the cells as written fail their own
tolerance (``rtol=1e-07, atol=0``) in inference, because Grappler fuses ops in
the TF1 session (oneDNN kernels) that run unfused eagerly. Measured at 107 px:
logits of the ``num_random_ops`` inference cell off by up to 4.8e-08 absolute
(7.3e-04 relative, on a logit near zero), of the added constant-mode inference
cell by 2.7e-07; the training cells were bit-exact, and the regularization
losses within 9.8e-08 relative. The notebook's "Additional Testing &
Troubleshooting" suggests ``tf.config.optimizer.set_experimental_options`` to
disable optimization passes such as ``arithmetic_optimization`` before the TF1
computation. :data:`GRAPPLER_OFF` turns off that pass (which makes the
regularization losses bit-exact; equivtool turns it off too) and
``remapping`` (the fusions; with it off every logit is bit-exact).
``grappler_off=False`` runs the cells with TensorFlow's defaults, exactly as
the notebook does. The setting is process-wide: run this in a process of its
own, as ``bench_parity.py`` does.

Left out: the notebook's cells that demonstrate the tools on toy layers and
toy tensors (``BrokenScalingLayer``, ``FixedScalingLayer``, the ``a, b, c``
random tensors) and its ``print`` calls; they check nothing about the model.

Step 4 in the notebook has three model cells: ``num_random_ops`` inference,
``num_random_ops`` training, and ``constant`` training through a Keras
functional model. It has no ``constant`` inference cell; equivtool's
``random`` step compares that too. ``constant_inference=True`` adds one,
written like the notebook's constant-mode cell with ``training=False``.

Every assertion that runs is counted; a failing one raises, so the benchmark
process exits non-zero.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

#: Assertions a full run makes: step 1 (two scopes), step 2 (two asserts),
#: step 3 (two assert_allclose), step 4 (two assert_allclose per model cell).
NOTEBOOK_ASSERTIONS = 2 + 2 + 2 + 2 * 3
CONSTANT_INFERENCE_ASSERTIONS = 2
#: Grappler passes turned off before the TF1 sessions (see the module docstring).
GRAPPLER_OFF = {"arithmetic_optimization": False, "remapping": False}


def expected_assertions(constant_inference: bool) -> int:
    """How many assertions :func:`run_guide` makes when every one of them runs."""
    return NOTEBOOK_ASSERTIONS + (CONSTANT_INFERENCE_ASSERTIONS if constant_inference else 0)


def require_all_assertions(made: int, constant_inference: bool) -> None:
    """Raise AssertionError unless ``made`` is the full count (a cell that was skipped compared nothing)."""
    expected = expected_assertions(constant_inference)
    if made != expected:
        raise AssertionError(f"the guide's steps made {made} assertions, expected {expected}")


def run_guide(image_size: int, batch_size: int, num_classes: int = 1000,
              constant_inference: bool = False, grappler_off: bool = True) -> dict:
    """Run the guide's steps 1-4 on Inception-ResNet-v2; return the assertion count and step times.

    ``grappler_off`` sets :data:`GRAPPLER_OFF` for the whole process first.
    """
    import equivtool  # noqa: F401  (environment fix before TensorFlow; nothing else is used)
    import numpy as np
    import tensorflow as tf

    from examples.inception_resnet_v2.keras_shim import make_shim, tf1_forward
    from examples.inception_resnet_v2.parity import model_kwargs

    DeterministicTestTool = tf.compat.v1.keras.utils.DeterministicRandomTestTool
    kwargs = model_kwargs()
    assertions = 0
    seconds = {}

    # The two substitutions: the project's model behind the notebook's signatures.
    def inception_resnet_v2(inputs, num_classes, is_training):
        return tf1_forward(inputs, is_training, num_classes=num_classes, **kwargs)

    def InceptionResnetV2(num_classes):
        return make_shim(num_classes, **kwargs)

    def counted():
        nonlocal assertions
        assertions += 1

    @contextmanager
    def timed(step):
        start = time.perf_counter()
        yield
        seconds[step] = round(time.perf_counter() - start, 2)

    @contextmanager
    def assert_no_variable_creations():
        def invalid_variable_creator(next_creator, **kwargs):
            raise ValueError("Attempted to create a new variable instead of reusing an existing one. "
                             "Args: {}".format(kwargs))

        with tf.variable_creator_scope(invalid_variable_creator):
            yield

    @contextmanager
    def catch_and_raise_created_variables():
        created_vars = []

        def variable_catcher(next_creator, **kwargs):
            var = next_creator(**kwargs)
            created_vars.append(var)
            return var

        with tf.variable_creator_scope(variable_catcher):
            yield
        if created_vars:
            raise ValueError("Created vars:", created_vars)

    if grappler_off:
        tf.config.optimizer.set_experimental_options(GRAPPLER_OFF)
    height = width = image_size

    # Step 1: variables are created only once.
    with timed("1 variables once"):
        model = InceptionResnetV2(num_classes)
        inputs = tf.ones((batch_size, height, width, 3))
        model(inputs)
        with assert_no_variable_creations():
            model(inputs)
        counted()
        with catch_and_raise_created_variables():
            model(inputs)
        counted()

    # Step 2: variable counts, names, trainability and shapes match.
    with timed("2 parity"):
        graph = tf.Graph()
        with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
            inputs = tf.ones((batch_size, height, width, 3))
            out, endpoints = inception_resnet_v2(inputs, num_classes, is_training=False)
            tf1_variable_names_and_shapes = {
                var.name: (var.trainable, var.shape) for var in tf.compat.v1.global_variables()}
            num_tf1_variables = len(tf.compat.v1.global_variables())

        model = InceptionResnetV2(num_classes)
        inputs = tf.ones((batch_size, height, width, 3))
        out, endpoints = model(inputs, training=False)
        out, endpoints = model(inputs, training=False)
        num_tf2_variables = len(model.variables)
        tf2_variable_names_and_shapes = {
            var.name: (var.trainable, var.shape) for var in model.variables}

        assert num_tf1_variables == num_tf2_variables
        counted()
        assert tf1_variable_names_and_shapes == tf2_variable_names_and_shapes
        counted()

    # Step 3: every variable reset to a constant; inference outputs and
    # regularization losses match.
    with timed("3 fixed weights"):
        graph = tf.Graph()
        with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
            inputs = tf.ones((batch_size, height, width, 3))
            out, endpoints = inception_resnet_v2(inputs, num_classes, is_training=False)
            var_reset = tf.group([var.assign(tf.ones_like(var) * 0.001) for var in tf.compat.v1.global_variables()])
            sess.run(var_reset)
            reg_losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES)
            tf1_regularization_loss = sess.run(tf.math.add_n(reg_losses))
            tf1_output = sess.run(out)

        model = InceptionResnetV2(num_classes)
        inputs = tf.ones((batch_size, height, width, 3))
        out, endpoints = model(inputs, training=False)
        for var in model.variables:
            var.assign(tf.ones_like(var) * 0.001)
        tf2_output, endpoints = model(inputs, training=False)
        tf2_regularization_loss = tf.math.add_n(model.losses)

        np.testing.assert_allclose(tf1_regularization_loss, tf2_regularization_loss.numpy(), rtol=1e-06)
        counted()
        np.testing.assert_allclose(tf1_output, tf2_output.numpy())
        counted()

    # Step 4: random number generation aligned by the random tool.
    def direct_layer_cell(mode, is_training):
        # The notebook's num_random_ops cells: the layer is called directly.
        random_tool = DeterministicTestTool(mode=mode)
        with random_tool.scope():
            graph = tf.Graph()
            with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
                inputs = tf.ones((batch_size, height, width, 3))
                out, endpoints = inception_resnet_v2(inputs, num_classes, is_training=is_training)
                sess.run(tf.compat.v1.global_variables_initializer())
                reg_losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES)
                tf1_regularization_loss = sess.run(tf.math.add_n(reg_losses))
                tf1_output = sess.run(out)

        random_tool = DeterministicTestTool(mode=mode)
        with random_tool.scope():
            model = InceptionResnetV2(num_classes)
            inputs = tf.ones((batch_size, height, width, 3))
            tf2_output, endpoints = model(inputs, training=is_training)
            tf2_regularization_loss = tf.math.add_n(model.losses)

        np.testing.assert_allclose(tf1_regularization_loss, tf2_regularization_loss.numpy())
        counted()
        np.testing.assert_allclose(tf1_output, tf2_output.numpy())
        counted()

    def functional_model_cell(is_training):
        # The notebook's constant-mode cell: the layer inside a Keras functional model.
        random_tool = DeterministicTestTool()
        with random_tool.scope():
            graph = tf.Graph()
            with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
                inputs = tf.ones((batch_size, height, width, 3))
                out, endpoints = inception_resnet_v2(inputs, num_classes, is_training=is_training)
                sess.run(tf.compat.v1.global_variables_initializer())
                reg_losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES)
                tf1_regularization_loss = sess.run(tf.math.add_n(reg_losses))
                tf1_output = sess.run(out)

        random_tool = DeterministicTestTool()
        with random_tool.scope():
            keras_input = tf.keras.Input(shape=(height, width, 3))
            layer = InceptionResnetV2(num_classes)
            model = tf.keras.Model(inputs=keras_input, outputs=layer(keras_input))
            inputs = tf.ones((batch_size, height, width, 3))
            tf2_output, endpoints = model(inputs, training=is_training)
            tf2_regularization_loss = tf.math.add_n(model.losses)

        np.testing.assert_allclose(tf1_regularization_loss, tf2_regularization_loss.numpy())
        counted()
        np.testing.assert_allclose(tf1_output, tf2_output.numpy())
        counted()

    with timed("4 num_random_ops inference"):
        direct_layer_cell("num_random_ops", is_training=False)
    with timed("4 num_random_ops training"):
        direct_layer_cell("num_random_ops", is_training=True)
    with timed("4 constant training"):
        functional_model_cell(is_training=True)
    if constant_inference:
        with timed("4 constant inference (added)"):
            functional_model_cell(is_training=False)

    require_all_assertions(assertions, constant_inference)
    return {"passed": True, "comparisons": assertions, "steps": seconds,
            "grappler": tf.config.optimizer.get_experimental_options()}
