"""``equivtool doctor [--tf1-python PATH]``: a list of small checks, each returning ``(ok, text)``.

Each check imports what it reads when it runs, so importing this module (and
the command line, which lists them) has no side effect; :func:`run` prints
their lines and sets the exit code (1 when one found a problem).
"""

from __future__ import annotations

import functools
import platform
from typing import Callable

from equivtool.cli.common import EXIT_DIFFERENT, EXIT_OK


@functools.lru_cache(maxsize=1)
def _versions():
    from equivtool._platform import env as _env
    try:
        return _env.check_versions(), None
    except _env.EquivtoolEnvironmentError as exc:
        return None, str(exc)


def _version_check(attribute: str, missing: str = "") -> Callable[[], tuple[bool, str]]:
    def check() -> tuple[bool, str]:
        versions, error = _versions()
        if versions is None:
            return False, error
        value = getattr(versions, attribute)
        return (False, missing) if value is None and missing else (True, str(value))
    return check


def doctor_legacy_keras() -> tuple[bool, str]:
    from equivtool._platform import env as _env
    if _env.legacy_keras_active():
        return True, "active (tf.keras is tf-keras)"
    return False, "NOT active: set TF_USE_LEGACY_KERAS=1 before importing TensorFlow"


def doctor_slim_fix() -> tuple[bool, str]:
    from equivtool._platform import env as _env
    state = _env.slim_fix_state()
    if state == "broken":
        return False, "broken: tf_keras.legacy_tf_layers cannot be resolved, slim.batch_norm will fail"
    return True, state


def _repairs_of(library: str, missing: str) -> Callable[[], tuple[bool, str]]:
    """The repairs of one library by the import-time fix (equivtool._platform.compat): what each did."""
    def check() -> tuple[bool, str]:
        from equivtool._platform import compat as _compat
        repairs = [r for r in _compat.repairs(import_libraries=True) if r.library == library]
        if not repairs:
            return True, missing
        text = "; ".join(f"{r.name}: {r.state}" + (f" ({r.detail})" if r.state == "failed" else "")
                         for r in repairs)
        return all(r.state != "failed" for r in repairs), text
    return check


def doctor_shim() -> tuple[bool, str]:
    import tensorflow as tf
    if hasattr(tf.compat.v1.keras.utils, "track_tf1_style_variables"):
        return True, "track_tf1_style_variables available"
    return False, "track_tf1_style_variables MISSING from tf.compat.v1.keras.utils"


def doctor_devices() -> tuple[bool, str]:
    import tensorflow as tf
    devices = [f"{d.device_type}:{d.name.split(':')[-1]}" for d in tf.config.list_physical_devices()]
    build = tf.sysconfig.get_build_info()
    return True, (f"{', '.join(devices)} (TF built with CUDA {build.get('cuda_version', 'none')}, "
                  f"cuDNN {build.get('cudnn_version', 'none')})")


def doctor_machine() -> tuple[bool, str]:
    """What a verdict depends on: the CPU, its instruction sets, oneDNN, threads."""
    from equivtool._platform import graph_rewrites as _graph_rewrites
    cpu, threads = _graph_rewrites.cpu(), _graph_rewrites.threads()
    return True, (f"{cpu['model']} ({', '.join(cpu['isa']) or 'no AVX2'}"
                  + (f"; ONEDNN_MAX_CPU_ISA={cpu['onednn_max_cpu_isa']}" if "onednn_max_cpu_isa" in cpu else "")
                  + f"), oneDNN {'on' if _graph_rewrites.onednn_enabled() else 'off'}, "
                  f"threads intra-op {threads['intra_op']}, inter-op {threads['inter_op']}"
                  + (" (TensorFlow's default)" if threads["default"] else ""))


def doctor_rewrites() -> tuple[bool, str]:
    from equivtool._platform import graph_rewrites as _graph_rewrites
    return True, ("as_written (default) turns off " + ", ".join(_graph_rewrites.turned_off("as_written"))
                  + " in TF1 sessions and TF2 function graphs")


def doctor_xent_op() -> tuple[bool, str]:
    from equivtool.ops import op_status
    status = op_status()
    if status.get("built") and not status.get("error"):
        return True, f"built for TF {status.get('built_for_tf')} at {status.get('path')}"
    return False, f"NOT usable: {status.get('error') or 'not built'} (run: equivtool build-ops)"


def doctor_xent_gpu() -> tuple[bool, str]:
    """Where the op's GPU kernels come from (NVRTC at run time, or none and why),
    which NVRTC, the architectures cached, the driver version."""
    from equivtool.ops import op_status
    from equivtool.ops import describe_gpu
    status = op_status()
    if not status.get("built") or status.get("error"):
        return True, "op library not usable (see: xent op)"
    now = status.get("gpu_kernels")
    head = f"none ({now.reason})" if now is not None and now.source == "none" else str(now)
    return True, f"now: {head}; {describe_gpu(status['path'])}"


def _live_check(name: str) -> Callable[[], tuple[bool, str]]:
    """A live check of equivtool.cli.selfcheck (the real code path, run tiny here)."""
    def check() -> tuple[bool, str]:
        from equivtool.cli import selfcheck as _selfcheck
        result = getattr(_selfcheck, name)()
        return result.ok, ("ok: " if result.ok else "FAILS: ") + result.detail
    return check


# (label, check): add a line here to add a check to `equivtool doctor`.
DOCTOR_CHECKS: list[tuple[str, Callable[[], tuple[bool, str]]]] = [
    ("tensorflow", _version_check("tensorflow")),
    ("tf-keras", _version_check("tf_keras")),
    ("tf-slim", _version_check("tf_slim", "not installed: pip install tf-slim==1.1.0")),
    ("numpy", _version_check("numpy")),
    ("legacy Keras", doctor_legacy_keras),
    ("tf-slim fix", doctor_slim_fix),
    ("TF repairs", _repairs_of("TensorFlow", "none")),
    ("tf-slim repairs", _repairs_of("tf-slim", "none (tf-slim is not installed)")),
    ("shim", doctor_shim),
    ("devices", doctor_devices),
    ("machine", doctor_machine),
    ("graph rewrites", doctor_rewrites),
    ("xent op", doctor_xent_op),
    ("xent op GPU", doctor_xent_gpu),
    ("random tool", _live_check("check_random_tool")),
    ("xent op live", _live_check("check_op")),
]


def tf1_python_checks(python: str) -> list[tuple[str, Callable[[], tuple[bool, str]]]]:
    """``equivtool doctor --tf1-python PATH``: the old interpreter's Python, its
    TensorFlow (1.x, where the old side ran) and ``tf.contrib``, probed once."""
    probed = functools.lru_cache(maxsize=1)(lambda: _tf1_probe(python))

    def python_check() -> tuple[bool, str]:
        found = probed()
        if isinstance(found, str):
            return False, found
        return True, f"{found.path}: Python {found.python} ({found.machine})"

    def tensorflow_check() -> tuple[bool, str]:
        found = probed()
        if isinstance(found, str):
            return False, "not probed (see: tf1 python)"
        if found.tensorflow is None:
            return False, found.error or "TensorFlow does not import"
        if not found.is_tf1:
            return False, (f"{found.tensorflow} is not TensorFlow 1.x (the old side would run through "
                           "tf.compat.v1, not as it ran; make a 1.15 one with: equivtool tf1-env DIR)")
        return True, f"{found.tensorflow} ({'CPU' if found.cpu_build else 'CUDA'} build)"

    def contrib_check() -> tuple[bool, str]:
        found = probed()
        if isinstance(found, str) or not found.is_tf1:  # the line above is the problem
            return True, "not checked (see: tf1 tensorflow)"
        return (True, "importable") if found.contrib else (False, found.error or "does not import")

    return [("tf1 python", python_check), ("tf1 tensorflow", tensorflow_check), ("tf1 contrib", contrib_check)]


def _tf1_probe(python: str):
    """The probed interpreter, or the one-line reason it could not be probed."""
    from equivtool._platform import tf1_python as _tf1
    try:
        return _tf1.probe(python)
    except _tf1.Tf1PythonError as exc:
        return str(exc)


def clear_cache() -> None:
    """Forget the versions read by an earlier run (each ``equivtool doctor`` reads them afresh)."""
    _versions.cache_clear()


def run(args) -> int:
    clear_cache()
    problems = []
    print(f"equivtool doctor (Python {platform.python_version()}, {platform.machine()})")
    checks = list(DOCTOR_CHECKS)
    if getattr(args, "tf1_python", None) is not None:
        checks += tf1_python_checks(args.tf1_python)
    for label, check in checks:
        try:
            ok, text = check()
        except Exception as exc:  # noqa: BLE001 - report, don't crash: this is the diagnostic command
            ok, text = False, f"check failed: {type(exc).__name__}: {exc}"
        print(f"  {label:<15} {text}")
        if not ok:
            problems.append(f"{label}: {text}")
    if problems:
        print("\nProblems:")
        for problem in problems:
            print(f"  - {problem}")
        return EXIT_DIFFERENT
    print("\nThe environment can run equivtool.")
    return EXIT_OK


def add_parser(subparsers) -> None:
    doctor = subparsers.add_parser("doctor", help="check that this environment can run equivtool")
    doctor.add_argument("--tf1-python", default=None, metavar="PATH",
                        help="also check an old interpreter: its Python, TensorFlow 1.x and tf.contrib")
    doctor.set_defaults(run=run)
