"""The shared pair: one TF1 build per pass and one TF2 layer under ``constant`` mode.

Most steps run on this pair (see ``equivtool.equivalence`` for why sharing
changes no key, name or number); it is built lazily by the first step that needs it.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

from equivtool.runners import TF1Side, TF2Side
from equivtool.seeding import DeterministicRandomTestTool
from equivtool.steps import SkipStep
from equivtool.variables import assert_no_variable_creations

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.equivalence import _Engine

DISTRIBUTED_TRAINING = (
    "not comparable under a distribution strategy: each replica normalises with its own batch "
    "statistics and draws its own dropout masks, so training-mode outputs differ from a single "
    "device by design (gradients and optimizer steps are compared with training=False)")


class ConstantPair:
    """One TF1 graph per pass and one TF2 layer under ``constant`` mode, built lazily.

    Without a strategy the TF2 layer's first call is the inference pass and its
    second (guarded) call the training pass, which also yields the gradients.
    With a strategy the first call creates the variables in cross-replica
    context (on the thread the random tool covers), and the distributed
    inference pass is the guarded second call and yields the gradients.
    """

    def __init__(self, engine: "_Engine"):
        self.engine = engine
        o = engine.options
        self.inputs = o.inputs
        self.distributed = o.strategy is not None
        self.tf1_tool = DeterministicRandomTestTool(seed=o.seed, mode="constant")
        self.tf2_tool = DeterministicRandomTestTool(seed=o.seed, mode="constant")
        started = time.perf_counter()
        self.tf1 = TF1Side(o.tf1_fn, o.inputs, renamer=o.renamer, loss_fn=o.loss_fn,
                           disable_arithmetic_optimization=o.disable_arithmetic_optimization,
                           random_tool=self.tf1_tool)
        self.inference = self.tf1.forward(training=False,
                                          with_gradients=o.want_gradients and self.distributed)
        # The training pass is built in a graph of its own, exactly as a
        # standalone build: built second in the same graph, its name scopes
        # would be uniquified (net_1/...) and change name-derived output keys,
        # op names and name-scoped collections. Its variables mirror the first
        # graph's around every run (_tf1_fetch), as shared variables would.
        self.tf1_train = None if self.distributed else TF1Side(
            o.tf1_fn, o.inputs, renamer=o.renamer, loss_fn=o.loss_fn,
            disable_arithmetic_optimization=o.disable_arithmetic_optimization,
            random_tool=self.tf1_tool)
        self.training = None if self.distributed else self.tf1_train.forward(
            training=True, with_gradients=o.want_gradients)
        # A layer instance built before the check got its initial values
        # elsewhere: it receives the TF1 graph's instead (noted in the steps).
        self.prebuilt = engine.user_layer is not None and bool(getattr(engine.user_layer, "built", False))
        with self.tf2_tool.scope():
            self.tf2 = TF2Side.create(engine.new_layer, o.inputs, renamer=o.renamer, loss_fn=o.loss_fn,
                                      use_tf_function=o.tf_function, strategy=o.strategy)
        self.layer = self.tf2.layer
        if self.prebuilt:
            self.tf2.assign_variables(self.tf1.read_variables())
        self.want_gradients = o.want_gradients
        self.build_seconds = time.perf_counter() - started
        self._tf1_results: dict = {}
        self._tf2_results: dict = {}

    def _tf2_call(self, key: str, training: bool, with_gradients: bool, guarded: bool):
        if key not in self._tf2_results:
            with self.tf2_tool.scope():
                guard = assert_no_variable_creations() if guarded else contextlib.nullcontext()
                with guard:
                    self._tf2_results[key] = self.tf2.forward(self.inputs, training=training,
                                                              with_gradients=with_gradients)
        return self._tf2_results[key]

    def tf2_inference(self):
        if self.distributed:
            return self._tf2_call("inference", False, self.want_gradients, guarded=True)
        return self._tf2_call("inference", False, False, guarded=False)

    def tf2_training(self):
        """Without a strategy: the layer's second call; it must create no variable (step 1)."""
        if self.distributed:
            raise SkipStep(DISTRIBUTED_TRAINING)
        self.tf2_inference()
        return self._tf2_call("training", True, self.want_gradients, guarded=True)

    def tf2_second_call(self):
        return self.tf2_inference() if self.distributed else self.tf2_training()

    def _tf1_fetch(self, key: str, forward, side: TF1Side | None = None):
        if key not in self._tf1_results:
            side = self.tf1 if side is None else side
            fetches = (forward.outputs, forward.regularization, forward.loss, forward.gradients)
            wanted = tuple(x for x in fetches if x is not None)
            if side is not self.tf1:  # the first graph's current values, in
                side.initialize()  # (a variable only the training pass creates keeps its own)
                side.assign_variables(self.tf1.read_variables())
            # Eager training calls update batch-norm statistics as they run; the
            # TF1 pass runs its UPDATE_OPS alongside so both sides stay equal.
            values = iter(side.run(wanted, update_ops=forward.update_ops))
            if side is not self.tf1:  # and the updated values back out
                self.tf1.assign_variables(side.read_variables())
            self._tf1_results[key] = tuple(None if x is None else next(values) for x in fetches)
        return self._tf1_results[key]

    def tf1_inference(self):
        return self._tf1_fetch("inference", self.inference)

    def tf1_training(self):
        if self.distributed:
            raise SkipStep(DISTRIBUTED_TRAINING)
        self.tf1_inference()
        return self._tf1_fetch("training", self.training, self.tf1_train)

    def gradients(self) -> tuple:
        """``(tf1 loss, tf1 gradients, tf2 loss, tf2 gradients)``."""
        tf1 = self.tf1_inference() if self.distributed else self.tf1_training()
        tf2 = self.tf2_second_call()
        return tf1[2], tf1[3], tf2[2], tf2[3]

    def snapshot(self) -> tuple:
        return self.tf1.read_variables(), self.tf2.read_variables()

    def restore(self, snapshot: tuple) -> None:
        tf1_values, tf2_values = snapshot
        self.tf1.assign_variables(tf1_values)
        self.tf2.assign_variables(tf2_values)

    @contextlib.contextmanager
    def preserved(self):
        """Both sides' variables as they are now, put back on every exit path.

        Yields the snapshot, so a step can return to it midway."""
        self.tf1_inference()  # initialised, and both layers built
        self.tf2_inference()
        saved = self.snapshot()
        try:
            yield saved
        finally:
            self.restore(saved)

    def inference_now(self) -> tuple:
        """A fresh inference pass on both sides with the current variable values:
        ``(tf1 outputs, tf1 regularization, tf2 outputs, tf2 regularization)``."""
        tf1_out, tf1_reg = self.tf1.run((self.inference.outputs, self.inference.regularization))
        with self.tf2_tool.scope():
            tf2_out, tf2_reg, _, _ = self.tf2.forward(self.inputs, training=False)
        return tf1_out, tf1_reg, tf2_out, tf2_reg

    def close(self) -> None:
        self.tf1.close()
        if self.tf1_train is not None:
            self.tf1_train.close()
