"""The shared pair: one TF1 build per pass and one TF2 layer under ``constant`` mode.

Most steps run on this pair (see ``equivtool.equivalence`` for why sharing
changes no key, name or number). Its two halves are independent until their
captures are compared: :class:`TF1Half` (the TF1 graphs and session) and
:class:`TF2Half` (the TF2 layer) each hold one side only, so that with
``workers=2`` each lives in a process of its own (see ``equivtool.engine.workers``).
Each half is built lazily by the first step that needs it.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Callable

from equivtool.engine import kinks as _kinks
from equivtool.engine.align import tf1_aligned, tf2_aligned
from equivtool.engine.sides.tf1_side import TF1Side, feedable
from equivtool.engine.sides.tf2_side import TF2Side, restore_snapshot, run_tapped, snapshot_layer
from equivtool.seeding import DeterministicRandomTestTool
from equivtool.engine.registry import SkipStep
from equivtool.variables import assert_no_variable_creations

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.options import Options

DISTRIBUTED_TRAINING = (
    "not comparable under a distribution strategy: each replica normalises with its own batch "
    "statistics and draws its own dropout masks, so training-mode outputs differ from a single "
    "device by design (gradients and optimizer steps are compared with training=False)")


class _Half:
    """What both halves share: ``side`` (a TF1Side or TF2Side) and ``inference_pass``."""

    side: TF1Side | TF2Side

    distributed: bool

    def inference_pass(self) -> tuple:  # pragma: no cover - each half defines it
        raise NotImplementedError

    def _training_pass(self) -> tuple:  # pragma: no cover - each half defines it
        raise NotImplementedError

    def training_pass(self) -> tuple:
        """The training pass, after the inference pass (skipped under a strategy)."""
        if self.distributed:
            raise SkipStep(DISTRIBUTED_TRAINING)
        self.inference_pass()
        return self._training_pass()

    def ran(self, key: str) -> bool:
        """Whether pass ``key`` (``"inference"``, ``"training"``) has run (its results are kept)."""
        return key in self._results

    def gradient_pass(self) -> tuple:
        """The pass the gradients come from: the training pass (distributed: the inference pass)."""
        return self.inference_pass() if self.distributed else self.training_pass()

    def _remember_start(self, key: str, side) -> None:
        """With ``localize=True``: the variables ``side`` holds as pass ``key`` starts,
        so that its localization re-run starts from them (see :meth:`as_started`)."""
        if self.localize:
            self._starts[key] = (side, side.read_variables())

    @contextlib.contextmanager
    def as_started(self, key: str):
        """The variables (moving statistics included) as they were when pass ``key``
        started, for a localization re-run; the current ones put back on every exit
        path. Later steps (a training call that updated batch-norm statistics) leave
        a re-run's numbers unchanged."""
        self.training_pass() if key == "training" else self.inference_pass()
        side, values = self._starts[key]
        saved = side.read_variables()
        try:
            side.assign_variables(values)
            yield
        finally:
            side.assign_variables(saved)

    @contextlib.contextmanager
    def preserved(self):
        """The variables as they are now, put back on every exit path; yields them
        (as :meth:`_keep` holds them)."""
        self.inference_pass()  # initialised (TF1) or built (TF2)
        saved = self._keep()
        try:
            yield saved
        finally:
            self._put_back(saved)

    def _keep(self):
        """The variables' values, to put back: ``{key: array}``."""
        return self.side.read_variables()

    def _put_back(self, saved) -> None:
        self.side.assign_variables(saved)


class TF1Half(_Half):
    """The TF1 side of the pair: one graph for the inference pass, one for the training pass.

    The training pass is built in a graph of its own, exactly as a standalone
    build: built second in the same graph, its name scopes would be uniquified
    (``net_1/...``) and change name-derived output keys, op names and
    name-scoped collections. Its variables mirror the first graph's around
    every run (:meth:`_fetch`), as shared variables would: the values it only
    reads are fed to their reads, those it updates copied in and back out.
    """

    def __init__(self, o: "Options"):
        started = time.perf_counter()
        self.inputs = o.inputs
        self.distributed = o.strategy is not None
        self.localize, self._starts = o.localize, {}
        self.tool = DeterministicRandomTestTool(seed=o.seed, mode="constant")

        def side() -> TF1Side:
            return TF1Side(o.tf1_fn, o.inputs, renamer=o.renamer, loss_fn=o.loss_fn,
                           graph_rewrites=o.graph_rewrites,
                           random_tool=self.tool)

        self.side = side()
        with tf1_aligned(o, self.side):
            self.inference = self.side.forward(training=False,
                                               with_gradients=o.want_gradients and self.distributed)
        self.train_side = None if self.distributed else side()
        with tf1_aligned(o, self.train_side) if self.train_side else contextlib.nullcontext():
            self.training = None if self.distributed else self.train_side.forward(
                training=True, with_gradients=o.want_gradients)
        self._results: dict = {}
        self.build_seconds = time.perf_counter() - started

    def _fetch(self, key: str, forward, side: TF1Side | None = None) -> tuple:
        if key not in self._results:
            side = self.side if side is None else side
            fetches = (forward.outputs, forward.regularization, forward.loss, forward.gradients)
            wanted = tuple(x for x in fetches if x is not None)
            # Eager training calls update batch-norm statistics as they run; the
            # TF1 pass runs its UPDATE_OPS alongside so both sides stay equal.
            if side is not self.side and not self.localize:
                values = iter(self._fed_run(side, wanted, forward))
            else:
                if side is not self.side:  # the first graph's current values, in (localization re-runs
                    side.copy_variables_from(self.side)  # the pass there; a variable only it creates keeps its own)
                self._remember_start(key, side)
                values = iter(side.run(wanted, update_ops=forward.update_ops))
                if side is not self.side:  # and the updated values back out
                    self.side.copy_variables_from(side)
            self._results[key] = tuple(None if x is None else next(values) for x in fetches)
        return self._results[key]

    def _fed_run(self, side: TF1Side, wanted: tuple, forward) -> list:
        """The pass on ``side`` (the training graph) with the first graph's current
        values, moved once (see :mod:`equivtool.engine.sides._fed_reads`): fed to the
        reads of the variables the pass only reads, so they are never copied in or
        back; set in ``side`` for those it uses otherwise (the moving statistics it
        updates), which are copied back after it; a variable only ``side`` has is
        initialised there, as the copying path does."""
        plan = side.read_plan(wanted, forward.update_ops)
        theirs = set(self.side.keys)
        real = {side.keys[i] for i in plan.real if side.keys[i] in theirs}
        fed = {side.keys[i]: reads for i, reads in plan.fed.items() if side.keys[i] in theirs}
        values = self.side.read_variables(wanted=(real | set(fed)).__contains__)  # one run (all: a capture's)
        for key in fed:  # fetched arrays are fed by copy: each moved once to where a feed needs none
            values[key] = feedable(values[key])
        side.initialize_variables([v for v, key in zip(side.variables, side.keys) if key not in theirs])
        side.assign_variables({key: values[key] for key in real})
        feeds = {tensor: values[key] for key, reads in fed.items() for tensor in reads}
        del values  # the feeds hold what the run needs
        result = side.run_fed(wanted, feeds, update_ops=forward.update_ops)
        del feeds
        if real:  # what the pass may have changed, back out
            self.side.copy_variables_from(side, keys=real)
        return result

    def inference_on(self, values) -> tuple | None:
        """A fresh inference pass with ``values`` (``{key: value}``; a mapping that
        computes values on access is read once per variable) fed to the variables'
        reads: ``(outputs, regularization)``, no variable written. None, with nothing
        run, when the pass uses a variable other than by reading it, or a variable
        has no value in ``values``: then the values must be assigned."""
        self.inference_pass()  # the inference graph's runs in the order the assigning path makes them
        fetches = (self.inference.outputs, self.inference.regularization)
        plan = self.side.read_plan(fetches)
        keys = self.side.keys
        if plan.real or any(keys[i] not in values for i in plan.fed):
            return None
        feeds = {}
        for i, reads in plan.fed.items():
            value = values[keys[i]]
            feeds.update((tensor, value) for tensor in reads)
        return tuple(self.side.run_fed(fetches, feeds))

    def inference_pass(self) -> tuple:
        """``(outputs, regularization, loss, gradients)`` of the first inference run."""
        return self._fetch("inference", self.inference)

    def _training_pass(self) -> tuple:
        return self._fetch("training", self.training, self.train_side)

    def gradient_forward(self):
        return self.inference if self.distributed else self.training

    def inference_now(self) -> tuple:
        """A fresh inference pass with the current values: ``(outputs, regularization)``."""
        return self.side.run((self.inference.outputs, self.inference.regularization))

    def close(self) -> None:
        self.side.close()
        if self.train_side is not None:
            self.train_side.close()


class TF2Half(_Half):
    """The TF2 side of the pair: one layer under ``constant`` mode.

    Without a strategy the layer's first call is the inference pass and its
    second (guarded) call the training pass, which also yields the gradients.
    With a strategy the first call creates the variables in cross-replica
    context (on the thread the random tool covers), and the distributed
    inference pass is the guarded second call and yields the gradients.
    """

    def __init__(self, o: "Options", new_layer: Callable, initial_values: Callable[[], dict] | None = None):
        """``initial_values`` (a layer instance built before the check): a function
        returning the TF1 graph's initial values, which the layer receives."""
        started = time.perf_counter()
        self.inputs = o.inputs
        self.distributed = o.strategy is not None
        self.localize, self._starts = o.localize, {}
        self.want_gradients = o.want_gradients
        # the training calls' kink inputs kept (engine.kinks): a tap per call, or None
        self.kink_tap = (lambda: _kinks.tap(o)) if _kinks.wanted(o) else None
        self.kinks = None
        self.tool = DeterministicRandomTestTool(seed=o.seed, mode="constant")
        self._aligned = lambda: tf2_aligned(o)
        with self.tool.scope(), self._aligned():  # (a strategy's first call creates the variables)
            self.side = TF2Side.create(new_layer, o.inputs, renamer=o.renamer, loss_fn=o.loss_fn,
                                       use_tf_function=o.tf_function, strategy=o.strategy,
                                       graph_rewrites=o.graph_rewrites)
        self.layer = self.side.layer
        self.prebuilt = initial_values is not None
        if self.prebuilt:
            self.side.assign_variables(initial_values())
        self._results: dict = {}
        self.build_seconds = time.perf_counter() - started

    def _call(self, key: str, training: bool, with_gradients: bool, guarded: bool) -> tuple:
        if key not in self._results:
            if training:  # (an inference pass changes no variable: its start is remembered after it,
                self._remember_start(key, self.side)  # once the layer's first call has built them)
            with self.tool.scope():
                guard = assert_no_variable_creations() if guarded else self._aligned()
                with guard:
                    if training and with_gradients and self.kink_tap is not None:
                        tap = self.kink_tap()
                        self._results[key] = run_tapped(tap, self.side.forward, self.inputs, training=training,
                                                        with_gradients=with_gradients)
                        self.kinks = tap.capture()
                    else:
                        self._results[key] = self.side.forward(self.inputs, training=training,
                                                               with_gradients=with_gradients)
            if not training:
                self._remember_start(key, self.side)
        return self._results[key]

    def inference_pass(self) -> tuple:
        if self.distributed:
            return self._call("inference", False, self.want_gradients, guarded=True)
        return self._call("inference", False, False, guarded=False)

    def _training_pass(self) -> tuple:
        """Without a strategy: the layer's second call; it must create no variable (step 1)."""
        return self._call("training", True, self.want_gradients, guarded=True)

    def inference_now(self) -> tuple:
        with self.tool.scope():
            outputs, regularization, _, _ = self.side.forward(self.inputs, training=False)
        return outputs, regularization

    def _keep(self):
        """``[(variable, value)]``, kept as tensors: no copy out to NumPy and back in
        (see :func:`~equivtool.engine.sides.tf2_side.snapshot_layer`)."""
        return snapshot_layer(self.layer)

    def _put_back(self, saved) -> None:
        restore_snapshot(saved)
