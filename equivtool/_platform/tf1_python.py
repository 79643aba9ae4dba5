"""A TensorFlow 1.15 interpreter beside this one: find a Python for it, make its environment, probe it.

The truth a migration must match is the old model as it ran, in TensorFlow 1.x,
not through ``tf.compat.v1`` inside TensorFlow 2 (contrib ops are gone there,
variables and control flow differ). TensorFlow 1.15's wheels exist for Python
3.6 and 3.7 only, so the old side runs in another interpreter; this module is
how equivtool gets one and tells what one holds:

* :func:`find_base_python`: a Python 3.6/3.7 from ``--python``, pyenv
  (``$PYENV_ROOT/versions/3.7.*``, then ``3.6.*``) or ``PATH``
  (``python3.7``, ``python3.6``);
* :func:`create_env`: a virtual environment with :data:`PINS` (the versions
  known to install and work together), reused when complete;
* :func:`probe`: the interpreter's Python and TensorFlow versions and whether
  ``tf.contrib`` imports, read by running a few lines there.

Nothing here imports TensorFlow in this process. Errors are
:class:`Tf1PythonError` (a ``ValueError``), one line naming what to do.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Callable, Optional

# What installs a working TensorFlow 1.15 on Python 3.6/3.7 today: newer NumPy
# and protobuf releases break its import.
PINS = ("tensorflow-cpu==1.15.0", "numpy<1.19", "protobuf<3.21")
PYTHONS = ((3, 7), (3, 6))  # in order of preference
CREATING = ".equivtool-tf1-env-creating"  # there while a creation runs: an interrupted one is resumed
PROBE_SECONDS = 180
INSTALL_HINT = ("install one (`pyenv install 3.7.16`, or your system's python3.7 package) "
                "or pass --python PATH")

# Run in the probed interpreter (Python 2.7 to 3.x syntax): one JSON line on stdout.
_PROBE = r"""
import json, os, platform, sys
info = {"executable": sys.executable, "python": platform.python_version(), "machine": platform.machine(),
        "tensorflow": None, "contrib": None, "error": None}
try:
    import tensorflow as tf
    info["tensorflow"] = tf.__version__
    info["cpu_build"] = not tf.test.is_built_with_cuda()
except Exception as exc:
    info["error"] = "importing tensorflow failed: %s: %s" % (type(exc).__name__, " ".join(str(exc).split()))
if info["tensorflow"] and info["tensorflow"].startswith("1."):
    try:
        getattr(tf, "contrib").layers
        info["contrib"] = True
    except Exception as exc:
        info["contrib"] = False
        info["error"] = "tf.contrib does not import: %s: %s" % (type(exc).__name__, " ".join(str(exc).split()))
sys.stdout.write("\n" + json.dumps(info) + "\n")
"""


class Tf1PythonError(ValueError):
    """No usable interpreter, or an environment that cannot be made: one line, exit code 2."""


@dataclass(frozen=True)
class Interpreter:
    """What :func:`probe` read from an interpreter.

    ``tensorflow`` is None when TensorFlow does not import there (``error`` says
    why); ``contrib`` is None on a TensorFlow without ``tf.contrib`` (2.x).
    """

    path: str
    python: str
    tensorflow: Optional[str] = None
    contrib: Optional[bool] = None
    cpu_build: Optional[bool] = None
    machine: str = ""
    error: Optional[str] = None

    @property
    def is_tf1(self) -> bool:
        return bool(self.tensorflow) and self.tensorflow.startswith("1.")

    def __str__(self) -> str:
        tf = f"TensorFlow {self.tensorflow}" if self.tensorflow else "no TensorFlow"
        return f"{self.path} (Python {self.python}, {tf})"

    def as_dict(self) -> dict:
        return {"path": self.path, "python": self.python, "tensorflow": self.tensorflow,
                "contrib": self.contrib, "cpu_build": self.cpu_build, "machine": self.machine}


def clean_env() -> dict:
    """The environment for another interpreter: this one's Python paths removed
    (a ``PYTHONPATH`` meant for Python 3.11 breaks Python 3.7), TensorFlow's
    start-up notices quietened, no ``TF2_BEHAVIOR``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP",
                                                              "PYENV_VERSION", "VIRTUAL_ENV")}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONNOUSERSITE"] = "1"
    # TensorFlow 2's own import sets TF2_BEHAVIOR=1 in this process's
    # environment. Inherited, it makes TensorFlow 1.15 turn on v2 behaviour as it
    # is imported (eager by default, resource variables, control flow v2): the
    # old code would not run as it ran.
    env.pop("TF2_BEHAVIOR", None)
    return env


def _version_of(python: str) -> Optional[tuple]:
    """(major, minor) of an interpreter, or None when it does not run."""
    try:
        done = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=60, env=clean_env())
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.fullmatch(r"(\d+)\.(\d+)", done.stdout.strip())
    return (int(match.group(1)), int(match.group(2))) if done.returncode == 0 and match else None


def _pyenv_candidates() -> list:
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    found = []
    for major, minor in PYTHONS:
        versions = glob.glob(os.path.join(root, "versions", f"{major}.{minor}.*", "bin", "python"))
        found += sorted(versions, key=lambda p: [int(x) if x.isdigit() else 0
                                                 for x in p.split(os.sep)[-3].split(".")], reverse=True)
    return found


def find_base_python(python: Optional[str] = None) -> str:
    """A Python 3.6 or 3.7 to build a TensorFlow 1.15 environment from: ``python``
    when given (it must be one), else pyenv's newest 3.7 then 3.6, else
    ``python3.7``/``python3.6`` on ``PATH``."""
    if python is not None:
        path = shutil.which(python) or python
        version = _version_of(path)
        if version is None:
            raise Tf1PythonError(f"--python: {python!r} does not run as a Python interpreter; "
                                 "expected the path of a Python 3.6 or 3.7")
        if version not in PYTHONS:
            raise Tf1PythonError(f"--python: {python} is Python {version[0]}.{version[1]}; TensorFlow 1.15 "
                                 "needs Python 3.6 or 3.7")
        return path
    candidates = _pyenv_candidates() + [p for p in (shutil.which(f"python{a}.{b}") for a, b in PYTHONS) if p]
    for candidate in candidates:
        if _version_of(candidate) in PYTHONS:
            return candidate
    raise Tf1PythonError("no Python 3.6 or 3.7 found (looked in pyenv's versions and for python3.7/python3.6 "
                         f"on PATH), and TensorFlow 1.15 needs one: {INSTALL_HINT}")


def probe(python: str, argument: str = "--tf1-python") -> Interpreter:
    """Run a few lines in ``python`` and read what it holds; an interpreter that
    does not run at all is a :class:`Tf1PythonError` naming ``argument``."""
    if not python:
        raise Tf1PythonError(f"{argument}: expected the path of a Python interpreter, got {python!r}")
    path = shutil.which(python) or python
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise Tf1PythonError(f"{argument}: {python!r} is not an executable file; expected the path of a Python "
                             "interpreter (make one with: equivtool tf1-env DIR)")
    try:
        done = subprocess.run([path, "-c", _PROBE], capture_output=True, text=True, timeout=PROBE_SECONDS,
                              env=clean_env())
    except subprocess.TimeoutExpired:
        raise Tf1PythonError(f"{argument}: {path} did not answer within {PROBE_SECONDS} s") from None
    except OSError as exc:
        raise Tf1PythonError(f"{argument}: cannot run {path}: {exc.strerror or exc}") from None
    lines = done.stdout.strip().splitlines()
    try:
        info = json.loads(lines[-1])
    except (IndexError, ValueError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise Tf1PythonError(f"{argument}: {path} is not a Python interpreter equivtool can use: {last}") from None
    return Interpreter(path=os.path.abspath(path), python=info["python"], tensorflow=info.get("tensorflow"),
                       contrib=info.get("contrib"), cpu_build=info.get("cpu_build"),
                       machine=info.get("machine", ""), error=info.get("error"))


def default_env() -> str:
    """Where ``./dev test`` keeps its TensorFlow 1.15 environment: ``$EQUIVTOOL_TF1_ENV``,
    else ``~/.cache/equivtool/tf1-env-1.15`` (outside the repository, kept across clones)."""
    return os.path.abspath(os.environ.get("EQUIVTOOL_TF1_ENV")
                           or os.path.expanduser("~/.cache/equivtool/tf1-env-1.15"))


def env_python(folder: str) -> str:
    return os.path.join(os.path.abspath(folder), "bin", "python")


def complete_env(folder: str) -> Optional[Interpreter]:
    """The environment in ``folder`` when it is complete (no creation under way
    or interrupted there, and its interpreter imports TensorFlow 1.15.0 and
    ``tf.contrib``), else None."""
    if os.path.exists(os.path.join(folder, CREATING)) or not os.path.isfile(env_python(folder)):
        return None
    try:
        found = probe(env_python(folder))
    except Tf1PythonError:
        return None
    return found if found.tensorflow == "1.15.0" and found.contrib else None


def _run(command: list, what: str, log: Callable[[str], None]) -> None:
    log(f"[tf1-env] {what}: {' '.join(command)}")
    done = subprocess.run(command, capture_output=True, text=True, env=clean_env())
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).strip().splitlines()
                 if line.strip() and "/opt/pypi-more" not in line]
        raise Tf1PythonError(f"tf1-env: {what} failed (exit {done.returncode}): "
                             f"{lines[-1].strip() if lines else 'no output'}")


def create_env(folder: str, python: Optional[str] = None,
               log: Callable[[str], None] = lambda text: None) -> tuple[Interpreter, bool]:
    """Create, or reuse when complete, a TensorFlow 1.15 environment in ``folder``.

    Returns (its interpreter as probed, whether it was created now). A folder
    that exists, is not empty, is not complete and is not an environment this
    function started is refused before anything runs. A creation marks the
    folder until it is done, so an interrupted one is resumed by the next call
    (pip skips what is installed).
    """
    folder = os.path.abspath(os.fspath(folder))
    found = complete_env(folder)
    if found is not None:
        log(f"[tf1-env] reusing {folder}: {found}")
        return found, False
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise Tf1PythonError(f"DIR: {folder} is a file; expected a new or empty folder")
    if os.path.isdir(folder) and os.listdir(folder) and not os.path.exists(os.path.join(folder, CREATING)):
        raise Tf1PythonError(f"DIR: {folder} exists and is not an equivtool TF 1.15 environment; give a new "
                             "or empty folder")
    base = find_base_python(python)
    version = _version_of(base)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, CREATING), "w", encoding="utf-8") as f:
        f.write(base + "\n")
    if not os.path.isfile(env_python(folder)):
        _run([base, "-m", "venv", folder], f"creating the virtual environment with {base}", log)
    pip = [env_python(folder), "-m", "pip", "--disable-pip-version-check"]
    if version == (3, 6):  # Python 3.6's bundled pip cannot read today's index
        _run(pip + ["install", "-q", "--upgrade", "pip"], "upgrading pip", log)
    _run(pip + ["install", "-q", *PINS], "installing " + " ".join(PINS), log)
    found = probe(env_python(folder), "DIR")
    if found.tensorflow != "1.15.0" or not found.contrib:
        raise Tf1PythonError(f"tf1-env: {folder} was made, but {found.error or f'it holds {found}'}")
    os.unlink(os.path.join(folder, CREATING))
    log(f"[tf1-env] created {folder}: {found}")
    return found, True
