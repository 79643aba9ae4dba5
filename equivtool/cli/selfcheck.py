"""``equivtool doctor``'s live check: run the random tool and the op, tiny, on this TensorFlow.

A version list would say which TensorFlow/tf-keras pairs were tested; this
says whether the pair installed here works. Each check runs the real code
path for a few milliseconds and compares what it got with what it must give:

- **random tool**: inside ``DeterministicRandomTestTool`` scopes, tf-keras
  initializers created without a seed (they draw from tf-keras' seed source,
  which the tool replaces) and ``tf.random.uniform`` in a TF1 graph and in
  eager mode. ``constant`` mode must give equal values for equal shapes on
  both sides and the same values as tf-keras' own tool; ``num_random_ops``
  must give different values to successive ops (so the values compared are
  real draws). tf-keras 2.16-2.18 asked the seed source for
  ``randint(1, 1e9)`` and a float seed broke every initializer: this finds it.
- **xent op**: loads the compiled op and compares its loss and gradient on a
  2x3 batch with ``tf.nn.sparse_softmax_cross_entropy_with_logits``.

Nothing here prints: ``equivtool doctor`` (:mod:`equivtool.cli.doctor`) prints the results.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SelfCheck", "check_op", "check_random_tool", "run_selfchecks"]


@dataclass(frozen=True)
class SelfCheck:
    """One live check: its name, whether it passed, and what it found."""

    name: str
    ok: bool
    detail: str

    def __str__(self) -> str:
        return f"{self.name:<15} {'ok' if self.ok else 'FAILS'}: {self.detail}"


def _error(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"[:300]


def check_random_tool() -> SelfCheck:
    """The random tool seeds tf-keras initializers and TF random ops, graph and eager, as it promises."""
    name = "random tool"
    try:
        import numpy as np
        import tensorflow as tf
        import tf_keras
        from equivtool.seeding import DeterministicRandomTestTool

        def draws():
            keras = [tf_keras.initializers.GlorotUniform()((2, 3)).numpy() for _ in range(2)]
            eager = tf.random.uniform((2, 3)).numpy()
            return keras, eager

        with DeterministicRandomTestTool(mode="constant").scope():
            keras, eager = draws()
            with tf.Graph().as_default(), tf.compat.v1.Session() as session:
                graph = session.run(tf.compat.v1.random.uniform((2, 3)))
        with tf.compat.v1.keras.utils.DeterministicRandomTestTool(mode="constant").scope():
            original = tf.random.uniform((2, 3)).numpy()
        with DeterministicRandomTestTool(mode="num_random_ops").scope():
            counted, _ = draws()
    except Exception as exc:  # the point of the check: report what breaks, don't crash doctor
        return SelfCheck(name, False, f"cannot seed on this TensorFlow/tf-keras: {_error(exc)}")
    problems = []
    if not np.array_equal(keras[0], keras[1]):
        problems.append("constant mode gave two equal-shaped tf-keras initializers different values")
    if not np.array_equal(graph, eager):
        problems.append("constant mode gave the TF1 graph and eager different values")
    if not np.array_equal(eager, original):
        problems.append("constant mode's values differ from tf-keras' own DeterministicRandomTestTool")
    if np.array_equal(counted[0], counted[1]):
        problems.append("num_random_ops mode gave two successive initializers the same values")
    if problems:
        return SelfCheck(name, False, "; ".join(problems))
    return SelfCheck(name, True, "tf-keras initializers and TF random ops seeded (graph == eager, "
                                 "same as tf-keras' tool)")


def check_op() -> SelfCheck:
    """The compiled op loads and agrees with TensorFlow's on a tiny batch, loss and gradient."""
    name = "xent op live"
    try:
        import numpy as np
        import tensorflow as tf
        from equivtool import ops

        logits = tf.constant([[1.0, 2.0, 3.0], [0.5, -1.0, 4.0]])
        labels = tf.constant([2, 0])
        results = []
        for fn in (ops.sparse_softmax_cross_entropy_with_logits, tf.nn.sparse_softmax_cross_entropy_with_logits):
            with tf.GradientTape() as tape:
                tape.watch(logits)
                loss = fn(labels=labels, logits=logits)
            results.append((loss.numpy(), tape.gradient(loss, logits).numpy()))
    except Exception as exc:
        return SelfCheck(name, False, f"cannot run: {_error(exc)} (run: equivtool build-ops)")
    (loss, grad), (tf_loss, tf_grad) = results
    if loss.shape != (2,) or grad.shape != (2, 3):
        return SelfCheck(name, False, f"wrong shapes: loss {loss.shape}, gradient {grad.shape}")
    if not (np.allclose(loss, tf_loss, rtol=1e-6, atol=1e-6) and np.allclose(grad, tf_grad, rtol=1e-6, atol=1e-6)):
        return SelfCheck(name, False, f"differs from TensorFlow's op: loss {loss.tolist()} vs {tf_loss.tolist()}")
    return SelfCheck(name, True, "loss and gradient on a 2x3 batch match TensorFlow's op")


def run_selfchecks() -> tuple[SelfCheck, ...]:
    """Both live checks, in the order doctor prints them."""
    return (check_random_tool(), check_op())
