"""The TF1 side in another interpreter: ``check_equivalence(..., tf1_python=PATH)``.

The truth a migration must match is the old model as it ran in TensorFlow 1.x
(``tf.contrib`` included), not what ``tf.compat.v1`` inside TensorFlow 2 makes
of it. With ``tf1_python`` the TF1 side of each step runs in that interpreter,
in the self-contained program :mod:`equivtool.engine.sides._old_side_program`
(Python 3.6 syntax, TensorFlow 1.x API, NumPy; no equivtool, no pickle),
while the TF2 side runs here. The two speak JSON lines over the program's
stdin/stdout, with arrays as ``.npz`` files in a temporary folder of this
process (a variable's value that both ends hold crosses as a reference:
:mod:`equivtool.engine.sides._old_known`); the folder is removed and the program stopped on every exit (the
engine's ``close`` runs on errors, Ctrl-C and SIGTERM:
:mod:`equivtool.engine.signals`).

What runs there: :class:`OldTF1Side` declares forward passes, variables,
gradients, training, checkpoints and intermediates (localization), so ``parity``, ``fixed_weights`` (the
values computed here by the same rule and sent), both random modes (the
program holds the random tool's TF1 half, with the same seed arithmetic),
``gradients`` (the default loss, or ``loss_fn`` named ``"module:function"``
and imported on both sides), ``optimizer`` (the TF1 factory named
``"module:function"``), ``checkpoint`` and ``resume`` run. :data:`STEP_SIDES`
lists them: the steps that only read, assign, save and restore variables and
run the inference pass (``parity``, ``fixed_weights``, ``checkpoint``) run
their own TF1 functions on :class:`OldTF1Half`, which answers what they ask of
the in-process half; ``resume``'s own TF1 function hands its work to
:mod:`equivtool.checkpoints._resume_old` (a feature, which the engine does not
import), which drives :meth:`OldTF1Side.restore_training` and
:meth:`OldTF1Side.resume_step`; the others have a TF1 function here. A step
not listed is skipped with the reason: never reported as passed. Localization
asks the program to describe a pass's ops and fetches them by name
(:meth:`OldTF1Side.op_graph`, :mod:`equivtool.engine.sides.old_graph`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from equivtool._base import scratch
from equivtool._base.slices import slices_arrays
from equivtool._base.tree import flatten_tensors
from equivtool.engine import noise_floor
from equivtool.engine.kinks import routed_on as kinks_routed
from equivtool.engine.outputs import split_outputs
from equivtool.engine.pair import _Half
from equivtool.engine.registry import SkipStep
from equivtool.engine.steps.common import fresh_pass_capture
from equivtool.engine.sides import CHECKPOINTS, FORWARD, GRADIENTS, INTERMEDIATES, TRAINING, VARIABLES, Side
from equivtool.engine.sides._old_known import KnownValues
from equivtool.engine.sides._old_python_args import NOT_YET as _NOT_YET
from equivtool.engine.sides.tf1_side import variable_key

if TYPE_CHECKING:  # pragma: no cover
    from equivtool.engine.run import Engine

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_old_side_program.py")
START_SECONDS = 300  # importing TensorFlow 1.15 (and tf.contrib) takes seconds; a wedged start ends here
QUIT_SECONDS = 10    # for the program to end once asked (or once its stdout closed), before it is killed


class OldSideError(Exception):
    """An error raised by the TF1 side in the old interpreter: its type, one line and
    the user's frame there; the traceback there is the ``__cause__``
    (:class:`OldSideTraceback`), so the report's traceback holds it."""


class OldSideTraceback(Exception):
    """The full traceback printed in the old interpreter."""


# --------------------------------------------------------------------------
# the program
# --------------------------------------------------------------------------

def _describe(node):
    """The structure of ``inputs`` as the program's ``rebuild`` reads it."""
    if isinstance(node, Mapping):
        return {"dict": [[str(key), _describe(value)] for key, value in node.items()]}
    if isinstance(node, list):
        return {"list": [_describe(value) for value in node]}
    if isinstance(node, tuple):
        return {"tuple": [_describe(value) for value in node]}
    return "leaf"


def _rebuild(description, leaves: list, slices=slices_arrays):
    """The structure the program described (``{"slices": ...}``: a tf.IndexedSlices's
    components, made one leaf by ``slices(mapping of them)``) holding ``leaves``."""
    iterator = iter(leaves)

    def build(node):
        if node == "leaf":
            return next(iterator)
        if "slices" in node:
            return slices({key: build(value) for key, value in node["slices"]})
        if "dict" in node:
            return {key: build(value) for key, value in node["dict"]}
        if "list" in node:
            return [build(value) for value in node["list"]]
        return tuple(build(value) for value in node["tuple"])
    return build(description)


class OldProgram:
    """The old-side program running in ``python``: one request at a time, its temporary folder."""

    def __init__(self, python: str, path: tuple):
        from equivtool._platform import tf1_python as _tf1
        self.path = list(path)
        self.lock = threading.Lock()
        self.known = KnownValues()  # the variable values both ends hold (see _old_known)
        temp = tempfile.gettempdir()
        scratch.remove_stale(temp, "tf1-side")  # the folders of killed runs (see _base.scratch)
        self.folder = tempfile.mkdtemp(prefix=scratch.prefix("tf1-side"), dir=temp)
        self._stderr = open(os.path.join(self.folder, "stderr.txt"), "w+", encoding="utf-8", errors="replace")
        self.process = None
        self.kernel_ops: dict = {}  # what the kernel floor's graphs perturbed and skipped (engine.kernel_floor)
        try:
            self.process = subprocess.Popen([python, PROGRAM, self.folder], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                            env=_tf1.clean_env(), cwd=path[-1] if path else None)
            info = self.request("hello", timeout=START_SECONDS)
        except BaseException:
            self.close()
            raise
        self.interpreter = {"path": python, "python": info["python"], "tensorflow": info["tensorflow"],
                            "machine": info["machine"], "cpu_build": info["cpu_build"],
                            "contrib_imported": info["contrib"]}
        if not str(info["tensorflow"]).startswith("1."):
            self.close()
            raise ValueError(f"tf1_python: {python} holds TensorFlow {info['tensorflow']}; the old side needs "
                             "TensorFlow 1.x (make one with: equivtool tf1-env DIR)")
        if info.get("eager"):  # v2 behaviour turned on as TensorFlow started there (a sitecustomize, say)
            self.close()
            raise ValueError(f"tf1_python: TensorFlow {info['tensorflow']} in {python} starts with v2 behaviour "
                             "(eager execution, resource variables); the old side needs it as TF1 code ran: "
                             "graph mode with reference variables (remove what enables v2 behaviour there)")

    def ran_under(self) -> str:
        """``"TensorFlow 1.15.0, Python 3.7.16, x86_64: /path/bin/python"`` (as ``compare --old-python``)."""
        i = self.interpreter
        return f"TensorFlow {i['tensorflow']}, Python {i['python']}, {i['machine']}: {i['path']}"

    def _stderr_tail(self) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read()[-4000:]

    def request(self, op: str, timeout: float | None = None, **fields) -> dict:
        """Send one request and read its answer (within ``timeout`` seconds when given: the
        first answer, whose wait is the interpreter's start); an error there is an
        :class:`OldSideError`."""
        with self.lock:  # one request at a time (with workers, the TF1 side runs on a thread)
            return self._request(op, fields, timeout)

    def _request(self, op: str, fields: dict, timeout: float | None) -> dict:
        if self.process is None:
            raise OldSideError(f"the TF1 interpreter is not running: {self._last_line()}")
        try:  # one that already ended (at start: an import failed) says so as one that ends now does
            if self.process.poll() is not None:
                raise BrokenPipeError
            self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            self.process.wait()
            raise OldSideError(f"the TF1 interpreter exited (status {self.process.returncode}) during "
                               f"{op!r}: {self._last_line()}") from OldSideTraceback(self._stderr_tail())
        if timeout is not None and not select.select([self.process.stdout], [], [], timeout)[0]:
            raise OldSideError(f"the TF1 interpreter did not answer {op!r} within {timeout:g} s: {self._last_line()}")
        line = self.process.stdout.readline()
        if not line:  # its stdout closed: it ended, or soon will (or closed it itself: then it is stopped)
            try:
                self.process.wait(timeout=QUIT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            raise OldSideError(f"the TF1 interpreter exited (status {self.process.returncode}) during "
                               f"{op!r}: {self._last_line()}") from OldSideTraceback(self._stderr_tail())
        answer = json.loads(line)
        if not answer.pop("ok"):
            error = answer["error"]
            where = f" (at {error['frame']})" if error.get("frame") else ""
            raise OldSideError(f"{error['type']} in the TF1 interpreter: {error['message']}{where}") \
                from OldSideTraceback(error["traceback"])
        return answer

    def _last_line(self) -> str:
        lines = [line for line in self._stderr_tail().splitlines() if line.strip()]
        return lines[-1].strip() if lines else "no output"

    def send(self, name: str, arrays: list) -> str:
        """``arrays`` as ``name.npz`` in the folder, for the program to read (and delete)."""
        np.savez(os.path.join(self.folder, name + ".npz"),
                 **{f"a{i}": np.asarray(value) for i, value in enumerate(arrays)})
        return name + ".npz"

    def receive(self, answer: dict) -> dict:
        """``{name: array}`` of an answer's file (deleted once read; none: nothing was sent)."""
        if answer.get("file") is None:
            return {}
        path = os.path.join(self.folder, answer["file"])
        with np.load(path, allow_pickle=False) as data:
            values = [data[f"a{i}"] for i in range(len(data.files))]
        os.unlink(path)
        return dict(zip(answer["names"], values))

    def send_values(self, op: str, names: list, values: list, **fields) -> dict:
        """Request ``op`` (``assign``, ``load_global_state``) with the variables ``names`` set to
        ``values``: only those the program does not hold already cross, the others as references
        (:mod:`equivtool.engine.sides._old_known`); both ends keep them as ``op``'s values once
        it succeeded there."""
        with self.lock:
            sent_names, sent, same = self.known.split(names, values)
            file = self.send(op, sent) if sent else None
            answer = self._request(op, {**fields, "names": sent_names, "file": file, "same": same,
                                        "order": list(names)}, None)
            self.known.keep(op, names, values)
            return answer

    def receive_values(self, op: str, **fields) -> dict:
        """``{name: array}`` of request ``op`` (``read``, ``global_state``), which sends only the
        values this end does not hold already; both ends keep them as ``op``'s values."""
        with self.lock:
            answer = self._request(op, fields, None)
            try:
                values = self.known.resolve(answer["order"], self.receive(answer), answer["same"])
            except BaseException:
                self.known.clear()  # the ends may disagree now: both forget
                with contextlib.suppress(Exception):
                    self._request("forget", {}, None)
                raise
            self.known.keep(op, list(values), list(values.values()))
            return values

    def close(self) -> None:
        """Stop the program (asked, then killed) and remove the folder; safe to call twice."""
        process, self.process = self.process, None
        try:
            if process is not None:
                try:
                    if process.poll() is None:
                        process.stdin.write('{"op": "quit"}\n')
                        process.stdin.flush()
                        process.wait(timeout=QUIT_SECONDS)
                except (OSError, ValueError, subprocess.TimeoutExpired):
                    pass
                finally:
                    if process.poll() is None:
                        process.kill()
                        process.wait()
                    for stream in (process.stdin, process.stdout):
                        with contextlib.suppress(OSError, ValueError):
                            stream.close()
        finally:
            with contextlib.suppress(OSError, ValueError):
                self._stderr.close()
            shutil.rmtree(self.folder, ignore_errors=True)


_LANE = threading.local()  # .own: this thread's sides use the engine's second program (own_models_lane)


def own_models_lane() -> None:
    """Makes the old sides made on this thread use the engine's second program
    (``Engine.old_program_own``, started on first use): with ``workers=3`` the steps
    that build models of their own run there while the pair's steps run in the first
    (:mod:`equivtool.engine.old_workers`)."""
    _LANE.own = True


def program(e: "Engine") -> OldProgram:
    """The engine's old-side program (on a thread of :func:`own_models_lane`: its second),
    started on first use; a failed start is reported by the first step and skips the
    later ones with its reason."""
    attribute = "old_program_own" if getattr(_LANE, "own", False) else "old_program"
    found = getattr(e, attribute, None)
    if isinstance(found, str):
        raise SkipStep(f"not run: the TF1 interpreter did not start in an earlier step ({found})")
    if found is None:
        o = e.options
        try:
            found = OldProgram(o.tf1_python, o.tf1_path)
        except Exception as exc:
            setattr(e, attribute, f"{type(exc).__name__}: {exc}"[:300])
            raise
        if getattr(e, attribute, None) is not None:  # the check ended while it started (Ctrl-C with workers=2)
            found.close()
            raise SkipStep(f"not run: {getattr(e, attribute)}")
        setattr(e, attribute, found)
        e.old_interpreter = found.interpreter
        e.old_ran_under = found.ran_under()
    return found


# --------------------------------------------------------------------------
# the side
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class VariableSpec:
    """A variable of the old graph as the steps read one (``name``, ``shape``, ``dtype``,
    ``trainable``), so that the steps that only read and assign variables run unchanged."""

    name: str
    shape: tuple
    dtype: str
    trainable: bool


@dataclasses.dataclass
class OldForward:
    """A forward pass built there: its index, output structure, random while loops and flags."""

    index: int
    outputs: Any                 # the structure (as _rebuild reads it)
    gradients: list              # names of the variables with a gradient
    sparse: list
    loops: dict
    leaf_flags: list             # per output leaf (flattened), then the regularization
    loss_flag: bool
    gradient_flags: dict
    kinks: list = dataclasses.field(default_factory=list)  # with kinks routed: [{name, type, shape, ...}]


class OldTF1Side(Side):
    """The user's TF1 function in one graph and session of the old interpreter."""

    KIND = "TF1 graph in the TF1 interpreter"
    CAPABILITIES = frozenset({FORWARD, VARIABLES, GRADIENTS, TRAINING, CHECKPOINTS, INTERMEDIATES})

    _count = 0

    @classmethod
    def step_side(cls, step):
        """This side's function for ``step`` (:data:`STEP_SIDES`); a step without one is
        skipped with the reason, never run in-process on a name it cannot call."""
        if step.name in STEP_SIDES:
            return STEP_SIDES[step.name]

        def refused(e, **params):
            raise SkipStep(f"{step.name}: {_NOT_YET}")
        return refused

    def __init__(self, e: "Engine", mode: str, tool: str | None = None):
        o = e.options
        self.program = program(e)
        self.renamer = o.renamer
        OldTF1Side._count += 1
        self.handle = f"side{OldTF1Side._count}"
        leaves = [np.asarray(leaf) for leaf in flatten_tensors(o.inputs)]
        self.program.request("open", handle=self.handle, fn=o.tf1_fn, path=list(o.tf1_path),
                             inputs=self.program.send("inputs", leaves), structure=_describe(o.inputs),
                             seed=o.seed, mode=mode, tool=tool, graph_rewrites=o.graph_rewrites, loss=o.tf1_loss,
                             **({"kernel_floor": True} if getattr(e, "kernel_floor_run", False) else {}),
                             **({"kinks": True} if kinks_routed(e) else {}))
        self.closed = False
        self.variables: list = []   # VariableSpec, in creation order
        self.names: list = []
        self.keys: list = []
        self.specs: dict = {}
        self.trainable_keys: set = set()
        self.forwards: list = []    # OldForward, by pass
        self._graphs: dict = {}     # pass -> OldGraph (described for localization)

    def forward(self, training: bool, with_gradients: bool = False) -> OldForward:
        answer = self.program.request("forward", handle=self.handle, training=training, gradients=with_gradients)
        _count_kernel_ops(self.program, answer)
        variables = answer["variables"]
        self.variables = [VariableSpec(v["name"], tuple(v["shape"]), v["dtype"], v["trainable"]) for v in variables]
        self.names = [v["name"] for v in variables]
        self.keys = [variable_key(name, self.renamer) for name in self.names]
        self.specs = {v["name"]: v for v in variables}
        self.trainable_keys = {key for key, v in zip(self.keys, variables) if v["trainable"]}
        forward = OldForward(answer["pass"], answer["outputs"], answer["gradients"], answer["sparse"],
                             answer["loops"], answer["leaf_flags"], answer["loss_flag"], answer["gradient_flags"],
                             answer.get("kinks") or [])
        self.forwards.append(forward)
        return forward

    def op_graph(self, outputs) -> tuple:
        """``(graph, output tensors)`` of the pass whose outputs are ``outputs`` (the
        structure a step holds, ``forward.outputs``), described there for localization
        (:mod:`equivtool.engine.sides.old_graph`)."""
        from equivtool.engine.sides.old_graph import OldGraph
        found = [forward for forward in self.forwards if forward.outputs is outputs]
        if len(found) != 1:
            raise ValueError(f"outputs: expected the outputs of one forward pass of {self.handle}, "
                             f"found {len(found)} passes with them")
        index = found[0].index
        if index not in self._graphs:
            self._graphs[index] = OldGraph(self.program.request("describe", handle=self.handle,
                                                                **{"pass": index}))
        graph = self._graphs[index]
        return graph, graph.roots()

    def op_runner(self, outputs):
        """``run(tensors) -> values`` of the pass whose outputs are ``outputs``: one
        ``fetch`` there per call, the inputs fed (a new session there where the pass draws
        random numbers, as :meth:`equivtool.engine.sides.tf1_side.TF1Side.op_runner`)."""
        from equivtool.engine.sides.old_graph import op_runner
        [forward] = [forward for forward in self.forwards if forward.outputs is outputs]

        def fetch(names):
            return self.program.receive(self.program.request("fetch", handle=self.handle, names=names,
                                                             **{"pass": forward.index}))
        return op_runner(fetch)

    def run(self, forward: OldForward, fetch=("outputs", "regularization"), update_ops: bool = False) -> dict:
        """``{"outputs": structure, "regularization": value, "loss": value, "gradients": {key: dense}}``
        (the parts asked for)."""
        values = self.program.receive(self.program.request(
            "run", handle=self.handle, fetch=list(fetch), update_ops=update_ops, **{"pass": forward.index}))
        result = {}
        if "outputs" in fetch:
            leaves = [values[f"outputs/{i}"] for i in range(sum(1 for k in values if k.startswith("outputs/")))]
            result["outputs"] = _rebuild(forward.outputs, leaves)
        if "regularization" in fetch:
            result["regularization"] = values["regularization"]
        if "loss" in fetch:
            result["loss"] = values.get("loss")
        if "gradients" in fetch:
            result["gradients"] = {variable_key(k[len("gradients/"):], self.renamer): v
                                   for k, v in values.items() if k.startswith("gradients/")}
        return result

    def route(self, forward: OldForward, values: Mapping[int, np.ndarray]) -> dict:
        """The pass's gradients routed at its kinks by ``values`` (kink index -> the TF2
        side's input to it; see :mod:`equivtool.engine.kinks`): ``{"routed": {key: dense},
        "gradients": {key: dense} (as computed, again), "inputs": [each kink's input here]}``."""
        indices = sorted(values)
        answer = self.program.request("route", handle=self.handle, kinks=indices,
                                      file=self.program.send("route", [values[i] for i in indices]),
                                      **{"pass": forward.index})
        found = self.program.receive(answer)
        result: dict = {"routed": {}, "gradients": {}, "inputs": [None] * len(forward.kinks)}
        for name, value in found.items():
            part, _, rest = name.partition("/")
            if part == "kink":
                result["inputs"][int(rest)] = value
            else:
                result[part][variable_key(rest, self.renamer)] = value
        return result

    def route_training(self, training: dict, steps: int, values: Mapping[tuple, np.ndarray]) -> dict:
        """``steps`` optimizer steps of ``training`` with its kinks routed by ``values``
        ((step, kink index) -> the TF2 side's input there), from the state there now:
        ``{"losses": [...], "inputs": [[each kink's input here] per step], "variables":
        [{key: value} per step]}``."""
        keys = sorted(values)
        answer = self.program.request("route_train", handle=self.handle, train=training["train"], steps=steps,
                                      kinks=[list(key) for key in keys],
                                      file=self.program.send("route_train", [values[key] for key in keys]))
        kinks = len(training.get("kinks") or [])
        result: dict = {"losses": [None] * steps, "inputs": [[None] * kinks for _ in range(steps)],
                        "variables": [{} for _ in range(steps)]}
        for name, value in self.program.receive(answer).items():
            part, _, rest = name.partition("/")
            step, _, rest = rest.partition("/")
            if part == "loss":
                result["losses"][int(step)] = float(value)
            elif part == "kink":
                result["inputs"][int(step)][int(rest)] = value
            else:
                result["variables"][int(step)][variable_key(rest, self.renamer)] = value
        return result

    def read_variables(self, wanted: Callable[[str], bool] | None = None) -> dict:
        """``{key: value}``, of the keys ``wanted`` accepts when given (all are read there)."""
        values = self.program.receive_values("read", handle=self.handle)
        found = ((variable_key(name, self.renamer), value) for name, value in values.items())
        return {key: value for key, value in found if wanted is None or wanted(key)}

    def assign_variables(self, values_by_key: Mapping[str, np.ndarray]) -> None:
        pairs = [(name, values_by_key[key]) for name, key in zip(self.names, self.keys) if key in values_by_key]
        self.program.send_values("assign", [name for name, _ in pairs], [np.asarray(v) for _, v in pairs],
                                 handle=self.handle)

    def build_training(self, make_optimizer: str, training: bool) -> dict:
        """A training pass there (``make_optimizer``: ``"module:function"``):
        ``{"train", "optimizer", "loops", "loss_flag"}``."""
        return _count_kernel_ops(self.program, self.program.request(
            "train_build", handle=self.handle, optimizer=make_optimizer, training=training))

    def train_step(self, training: dict) -> float:
        """One optimizer step in a new session there; the loss before the step."""
        return self.program.request("train_step", handle=self.handle, train=training["train"])["loss"]

    def global_state(self) -> dict:
        """``{op name: value}`` of every global variable there (slots and counters too)."""
        return self.program.receive_values("global_state", handle=self.handle)

    def load_global_state(self, values: Mapping[str, np.ndarray]) -> None:
        names = list(values)
        self.program.send_values("load_global_state", names, [np.asarray(values[name]) for name in names],
                                 handle=self.handle)

    @contextlib.contextmanager
    def perturbed(self, start: Mapping[str, np.ndarray], seed: int):
        """As :meth:`equivtool.engine.sides.tf1_side.TF1Side.perturbed`: ``start`` one ULP
        away (computed here), ``start`` loaded back on every exit path."""
        try:
            self.load_global_state(noise_floor.Perturbed(start, seed))
            yield
        finally:
            self.load_global_state(start)

    def save_checkpoint(self, prefix) -> str:
        """The variables written there with ``tf.train.Saver``; the checkpoint's path."""
        return self.program.request("save", handle=self.handle, path=os.path.abspath(os.fspath(prefix)))["path"]

    def restore_checkpoint(self, path) -> None:
        self.program.request("restore", handle=self.handle, path=os.path.abspath(os.fspath(path)))

    def checkpoint_names(self) -> dict:
        """Matching key -> the name a TF1 checkpoint stores the variable under."""
        return {key: self.specs[name]["op"] for name, key in zip(self.names, self.keys)}

    def restore_training(self, training: dict, path) -> dict:
        """Every variable of ``training``'s graph (the model's, the optimizer's slots and
        beta powers) restored there from the TF1 checkpoint at ``path`` (one it lacks is
        named): ``{"slots": count, "non_slot": [op names]}``."""
        return self.program.request("restore_training", handle=self.handle, train=training["train"],
                                    path=os.path.abspath(os.fspath(path)))

    def resume_step(self, training: dict) -> tuple:
        """One optimizer step there (after :meth:`restore_training`): ``(loss, capture)``, the
        capture as :mod:`equivtool.checkpoints._resume` compares it: ``variables`` and
        ``slots`` (``"<key>/Adam_1"``) by key, ``optimizer`` (beta powers) by op name."""
        answer = self.program.request("resume_step", handle=self.handle, train=training["train"])
        capture: dict = {"variables": {}, "slots": {}, "optimizer": {}}
        for name, value in self.program.receive(answer).items():
            part, _, rest = name.partition("/")
            if part == "variables":
                capture["variables"][variable_key(rest, self.renamer)] = value
            elif part == "slots":
                variable, _, slot = rest.rpartition("/")
                capture["slots"][f"{variable_key(variable, self.renamer)}/{slot}"] = value
            else:
                capture["optimizer"][rest] = np.float32(value)
        return answer["loss"], capture

    def copy_variables_from(self, other: "OldTF1Side") -> None:
        self.program.request("copy", handle=self.handle, source=other.handle)

    def close(self) -> None:
        process = self.program.process
        if self.closed or process is None or process.poll() is not None:
            return
        self.closed = True
        if not self.program.lock.acquire(blocking=False):
            return  # a request of the TF1 thread is under way: Ctrl-C or SIGTERM, the program is stopped next
        self.program.lock.release()
        self.program.request("close", handle=self.handle)


def _count_kernel_ops(program: OldProgram, answer: dict) -> dict:
    """``answer``, its ``kernel_floor`` counts (ops perturbed and skipped there) added to the program's."""
    found = answer.get("kernel_floor")
    if found:
        totals = program.kernel_ops
        for key in ("perturbed_ops", "perturbed_outputs"):
            totals[key] = totals.get(key, 0) + found[key]
        skipped = totals.setdefault("skipped", {})
        for reason, count in found["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + count
    return answer


class OldTF1Half(_Half):
    """The pair's TF1 half in the old interpreter: one graph for the inference pass,
    one for the training pass, their variables mirrored as in
    :class:`equivtool.engine.pair.TF1Half`."""

    def __init__(self, e: "Engine"):
        started = time.perf_counter()
        o = e.options
        self.distributed, self.localize, self._starts = False, o.localize, {}
        self.side = OldTF1Side(e, "constant", tool=f"pair{id(self)}")
        self.train_side = None
        self.inference = self.side.forward(training=False)
        self.train_side = OldTF1Side(e, "constant", tool=f"pair{id(self)}")
        self.training = self.train_side.forward(training=True, with_gradients=o.want_gradients)
        self.with_loss = o.want_gradients  # the loss is fetched even where it reaches no variable
        self._results: dict = {}
        self.build_seconds = time.perf_counter() - started

    def _fetch(self, key: str, forward: OldForward, side: OldTF1Side, fetch) -> dict:
        if key not in self._results:
            if side is not self.side:
                side.copy_variables_from(self.side)
            self._remember_start(key, side)  # with localize: where its re-run starts
            self._results[key] = side.run(forward, fetch, update_ops=True)
            if side is not self.side:
                self.side.copy_variables_from(side)
        return self._results[key]

    def inference_pass(self) -> dict:
        return self._fetch("inference", self.inference, self.side, ("outputs", "regularization"))

    def _training_pass(self) -> dict:
        fetch = ("outputs", "regularization") + (("loss", "gradients") if self.with_loss else ())
        return self._fetch("training", self.training, self.train_side, fetch)

    def inference_on(self, values) -> None:
        """As :meth:`equivtool.engine.pair.TF1Half.inference_on`, whose None means "assign
        the values instead": there the values cross to the interpreter either way, and
        the program assigns what it receives (feeding them is not built there)."""
        return None

    def route_training(self, training: dict, start: Mapping, steps: int, values) -> dict:
        """:meth:`OldTF1Side.route_training` from ``start`` (the global state the step's
        training started from); the variables and ``start`` put back on every exit path."""
        with self.preserved():
            try:
                self.side.load_global_state(start)
                return self.side.route_training(training, steps, values)
            finally:
                self.side.load_global_state(start)

    def route_kinks(self, values) -> dict:
        """The training pass's gradients routed at its kinks (:meth:`OldTF1Side.route`)."""
        return self.train_side.route(self.training, values)

    def inference_now(self) -> tuple:
        found = self.side.run(self.inference)
        return found["outputs"], found["regularization"]

    def close(self) -> None:
        for side in (self.side, self.train_side):
            if side is not None:
                side.close()


# --------------------------------------------------------------------------
# the TF1 functions of the steps (see equivtool.engine.steps for the in-process ones)
# --------------------------------------------------------------------------

def _leaf_flags(forward: OldForward, outputs) -> list:
    """Per part of the outputs (as the judgement walks them, see steps.common.forward_capture)
    and then the regularization: whether each leaf depends on a random while loop."""
    if not forward.loops:
        return []
    flat = forward.leaf_flags
    # each leaf as the set of the program's leaves it holds (a tf.IndexedSlices: its components)
    indexed = _rebuild(forward.outputs, [frozenset([i]) for i in range(len(flat) - 1)],
                       slices=lambda parts: frozenset().union(*parts.values()))
    parts = [[any(flat[i] for i in leaf) for leaf in flatten_tensors(part)]
             for _, part, _ in split_outputs(indexed, indexed)]
    return parts + [[flat[-1]]]


def _forward_capture(forward: OldForward, found: dict) -> dict:
    return {"outputs": found["outputs"], "regularization": found["regularization"],
            "loops": dict(forward.loops), "leaf_flags": _leaf_flags(forward, found["outputs"])}


def _random_constant(e: "Engine", mode: str, training: bool) -> dict:
    half = e.tf1_half
    found = half.training_pass() if training else half.inference_pass()
    capture = _forward_capture(half.training if training else half.inference, found)
    if training:
        capture["variables"] = half.side.read_variables()
    return capture


def _random_fresh(e: "Engine", mode: str, training: bool) -> dict:
    side, capture = OldTF1Side(e, mode), {}
    try:
        forward = side.forward(training=training)
        capture = fresh_pass_capture(side, forward, training, bool(e.options.localize),
                                     lambda: _forward_capture(forward, side.run(forward, update_ops=True)))
        return capture
    finally:
        if "_local" not in capture:
            side.close()


def _gradients(e: "Engine") -> dict:
    o, half = e.options, e.tf1_half
    found = half.gradient_pass()
    forward = half.training
    side = half.side
    gradients = found.get("gradients") or {}
    flags = {}
    if forward.loops:
        flags = {"loss": forward.loss_flag}
        flags.update({f"gradients/{variable_key(k, side.renamer)}": v for k, v in forward.gradient_flags.items()})
    return {"loss": found["loss"], "gradients": {k: gradients[k] for k in side.keys if k in gradients},
            "trainable": [k for k in side.keys if k in side.trainable_keys],
            "loss_target": None if o.tf1_loss else "outputs" + _primary_path(found["outputs"]),
            "sparse": [variable_key(k, side.renamer) for k in forward.sparse],
            "loops": dict(forward.loops), "flags": flags,
            **({"kinks": forward.kinks} if kinks_routed(e) else {})}


def _optimizer(e: "Engine") -> dict:
    """As ``steps.training._optimizer_tf1``, there: ``train_steps`` steps of the TF1 optimizer
    (``"module:function"``) from the pair's state after its calls, then the same
    steps from one ULP away for the noise floor; the variables put back after."""
    o, half = e.options, e.tf1_half
    if o.optimizers is None:
        raise SkipStep("no optimizers given: pass optimizers=(\"module:make_tf1_optimizer\", make_tf2_optimizer)")
    side = half.side
    half.gradient_pass()  # both sides have had the same calls (batch-norm statistics included)
    losses, values, floor_run = [], [], None
    routed = kinks_routed(e)
    with half.preserved():
        training = side.build_training(o.optimizers[0], True)
        start = side.global_state() if o.noise_floor or routed else None
        for _ in range(o.train_steps):
            losses.append(side.train_step(training))
            values.append(side.read_variables())
        if start is not None and o.noise_floor:
            with side.perturbed(start, o.seed):
                floor_run = [(side.train_step(training), side.read_variables()) for _ in range(o.train_steps)]
    forward = half.training
    loops = {**training["loops"], **forward.loops}
    flags = {}
    if loops:  # a variable's update depends on the loops when its gradient (in the pair's pass) does
        for step in range(o.train_steps):
            flags[f"step_{step + 1}/loss"] = training["loss_flag"]
            flags.update({f"step_{step + 1}/variables/{variable_key(k, side.renamer)}": flag
                          for k, flag in forward.gradient_flags.items()})
    found = {"losses": losses, "variables": values, "optimizer": training["optimizer"], "floor_run": floor_run,
             "sparse": [variable_key(k, side.renamer) for k in forward.sparse], "loops": loops, "flags": flags}
    if routed:  # what engine.kinks.route_optimizer needs to run the same steps with the kinks routed
        found.update({"kinks": training["kinks"], "_kink_training": training, "_kink_start": start})
    return found


def _primary_path(outputs) -> str:
    from equivtool.engine.sides.tf1_side import primary_output_path
    return primary_output_path(outputs)


#: The TF1 function of each step that runs in the old interpreter, by the step's name
#: (not by the module that runs it in-process, which may move): its own (None: the
#: old side answers what it asks of the in-process TF1 side), or one here where the
#: step reads TF1 graph objects.
STEP_SIDES = {
    "variables_once": None,
    "parity": None,
    "fixed_weights": None,
    "checkpoint": None,
    "resume": None,  # the step's own, which hands its TF1 side to checkpoints._resume_old
    **{f"random/constant/{what}": _random_constant for what in ("inference", "training")},
    **{f"random/num_random_ops/{what}": _random_fresh for what in ("inference", "training")},
    "gradients": _gradients,
    "optimizer": _optimizer,
}
