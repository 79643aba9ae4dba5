"""``compare --old-python PATH``: OLD run by the recorder in another interpreter, as it ran, then compared here.

A TF1 SavedModel is proven against what it computed in TensorFlow 1.x, not
against what ``tf.compat.v1`` inside this TensorFlow makes of it (contrib ops
are not even registered here). The old interpreter runs the same
self-contained recorder that ``equivtool record-script`` prints, on OLD, into
a golden record in a temporary folder of this process; the record is then OLD's
side (:class:`OldInterpreterSide`) and the comparison is the golden-record one.
The folder is removed, and the old interpreter stopped, on every exit: an
error, Ctrl-C, or SIGTERM (:func:`equivtool.engine.signals.sigterm_unwinds`,
applied by the caller).

What crosses between the interpreters is the recorder's command line, an
``.npz`` of inputs when the caller gave some, and the record (JSON plus
``.npy``, never pickle). An error there is one line (the recorder's own, or the
last line of a traceback), with the whole stderr kept on the exception
(:attr:`OldInterpreterError.stderr`).
"""

from __future__ import annotations

import os
import subprocess
from typing import Mapping, Optional

import numpy as np

from equivtool.exported._errors import short
from equivtool.exported._record import RecordSide, recorder_source
from equivtool.exported._sides import ModelLoadError

_RECORDABLE = ("tf1-saved-model", "frozen-graph")


class OldInterpreterError(ModelLoadError):
    """The old interpreter could not record OLD: one line; ``stderr`` holds all it wrote."""

    def __init__(self, message: str, stderr: str = ""):
        super().__init__(message)
        self.stderr = stderr


def probe_old_python(python: str):
    """The old interpreter as probed (:func:`equivtool._platform.tf1_python.probe`);
    one that cannot run TensorFlow is refused here, before any work."""
    from equivtool._platform import tf1_python as _tf1
    try:
        found = _tf1.probe(python, "--old-python")
    except _tf1.Tf1PythonError as exc:
        raise ModelLoadError(str(exc)) from None
    if found.tensorflow is None:
        raise ModelLoadError(f"--old-python: {found.path} (Python {found.python}) cannot import TensorFlow: "
                             f"{found.error}; make an environment with: equivtool tf1-env DIR")
    return found


def check_old(kind: str, path: str) -> None:
    if kind not in _RECORDABLE:
        raise ModelLoadError(f"--old-python: OLD {path} is a {kind}; the old interpreter records a TF1 SavedModel "
                             "folder or a frozen graph .pb")


def _items(mapping: Mapping, form) -> list:
    return [form(k, v) for k, v in mapping.items()]


def recorder_command(python: str, script: str, model: str, out: str, *, signature: str, tags, graph_inputs,
                     graph_outputs, input_shapes, val_range, seed: int, batches: int, inputs_file: Optional[str],
                     intermediates: bool, graph_rewrites: str) -> list:
    """The command line that records ``model`` into ``out`` in ``python``."""
    command = [python, script, model, out, "--signature", signature, "--tags", ",".join(tags),
               "--seed", str(seed), "--batches", str(batches), "--graph-rewrites", graph_rewrites]
    if graph_inputs:
        command += ["--graph-inputs", ",".join(_items(graph_inputs, lambda k, v: f"{k}={v}"))]
    if graph_outputs:
        command += ["--graph-outputs", ",".join(_items(graph_outputs, lambda k, v: f"{k}={v}"))]
    for name, shape in input_shapes.items():
        command += ["--input-shapes", f"{name}:{','.join(str(d) for d in shape)}"]
    for name, (lo, hi) in val_range.items():
        command += ["--val-range", f"{name}:{lo!r},{hi!r}"]
    if inputs_file is not None:
        command += ["--inputs", inputs_file]
    if intermediates:
        command.append("--intermediates")
    return command


def inputs_file(inputs, folder: str) -> Optional[str]:
    """The ``--inputs`` file to hand the recorder: a path as given; a feed (or a
    list of one) written to ``folder`` as ``.npz``. The recorder reads one batch."""
    if inputs is None:
        return None
    if isinstance(inputs, (str, os.PathLike)):
        return os.path.abspath(os.fspath(inputs))
    feeds = [inputs] if isinstance(inputs, Mapping) else list(inputs)
    if len(feeds) != 1:
        raise ModelLoadError(f"inputs: with --old-python, one batch of inputs (a dict input name -> array); "
                             f"got {len(feeds)} batches")
    path = os.path.join(folder, "inputs.npz")
    np.savez(path, **{str(k): np.asarray(v) for k, v in feeds[0].items()})
    return path


def run_recorder(command: list, old_path: str) -> None:
    """Run the recorder; the old interpreter is stopped on any exit of this call
    (an exception, Ctrl-C or SIGTERM raised here kills it before propagating)."""
    from equivtool._platform import tf1_python as _tf1
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=_tf1.clean_env(), errors="replace")
    try:
        _, stderr = process.communicate()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0:
        lines = [line for line in stderr.splitlines() if line.strip()]
        own = [line for line in lines if line.startswith("record.py: error: ")]
        if own:
            text = own[-1][len("record.py: error: "):]
        else:
            text = lines[-1].strip() if lines else f"exit status {process.returncode}, no output"
        raise OldInterpreterError(f"--old-python: {command[0]} could not record OLD {old_path}: {short(text)}",
                                  stderr)


class OldInterpreterSide(RecordSide):
    """OLD as the old interpreter ran it: the record it wrote, under OLD's path,
    with the interpreter's Python and TensorFlow in its description."""

    def __init__(self, record_path: str, model_path: str, interpreter):
        super().__init__(record_path)
        self.record_path, self.path = self.path, os.fspath(model_path)
        self.kind = (self.header.get("model") or {}).get("kind", "tf1-saved-model")
        writer = dict(self.header.get("writer") or {})
        self.interpreter = {"path": interpreter.path, "python": writer.get("python", interpreter.python),
                            "tensorflow": writer.get("tensorflow", interpreter.tensorflow),
                            "machine": writer.get("machine", interpreter.machine),
                            "contrib_imported": bool(writer.get("contrib"))}
        self.meta = {k: v for k, v in self.meta.items() if k not in ("recorded_from", "recorded_kind",
                                                                      "recorded_with")}
        self.meta["ran_under"] = self.ran_under()
        self.meta["interpreter"] = dict(self.interpreter)

    def ran_under(self) -> str:
        """"TensorFlow 1.15.0, Python 3.7.16, x86_64: /path/to/python", the report's header line."""
        i = self.interpreter
        return f"TensorFlow {i['tensorflow']}, Python {i['python']}, {i['machine']}: {i['path']}"

    def input_provenance(self) -> str:
        return f"{self.header.get('provenance', '')}, generated or read in the old interpreter"

    def _intermediates_reason(self) -> Optional[str]:
        if not self.nodes or not self.header.get("graph"):
            return "the old interpreter recorded no intermediates"
        return None


def script_path(folder: str) -> str:
    """The recorder's source written into ``folder`` (the same text ``record-script`` prints)."""
    path = os.path.join(folder, "record.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(recorder_source())
    return path
