"""A non-editable ``pip install`` into a fresh virtual environment builds the
op, and the installed package rebuilds it (``equivtool build-ops``) and runs
``equivtool demo`` with nothing from the source checkout on its path.

The fresh environment sees the shared environment's site-packages through a
``.pth`` file (TensorFlow is not downloaded again); a ``.pth`` line adds a
folder to ``sys.path`` without running that folder's own ``.pth`` files, so
the shared environment's editable equivtool stays invisible, and the test
checks that the equivtool it runs is the installed one.
"""

import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.slow  # two compilations of the op (CPU only: about a minute each)


def _run(cmd, cwd, env=None, timeout=900):
    proc = subprocess.run(cmd, cwd=cwd, env=env, text=True, timeout=timeout,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n" \
                                 f"{proc.stdout[-4000:]}"
    return proc.stdout


def _source_copy(dest):
    """The files git tracks (plus untracked, not ignored ones): no build outputs."""
    listed = _run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                  cwd=REPO).split("\0")
    for rel in filter(None, listed):
        src = os.path.join(REPO, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("fresh")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=root)
    python = venv / "bin" / "python"
    purelib = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                   cwd=root).strip()
    with open(os.path.join(purelib, "shared-environment.pth"), "w") as f:
        f.write(sysconfig.get_path("purelib") + "\n")
    source = _source_copy(root / "source")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)
    env.pop("EQUIVTOOL_OPS_LIBRARY", None)
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-build-isolation",
          "--no-deps", "--no-cache-dir", str(source)], cwd=root, env=env)
    shutil.rmtree(source)  # nothing of the checkout may be needed from here on
    work = root / "elsewhere"
    work.mkdir()
    return {"python": str(python), "bin": str(venv / "bin"), "purelib": purelib, "env": env,
            "cwd": str(work)}


def _in_venv(installed, code):
    return _run([installed["python"], "-c", code], cwd=installed["cwd"], env=installed["env"])


def test_install_builds_the_op_into_the_installed_package(installed):
    out = _in_venv(installed, "import equivtool, equivtool.ops as o; s = o.op_status(); "
                              "print(equivtool.__file__); print(s['path']); print(s['error'])")
    module_file, library, error = out.strip().splitlines()[-3:]
    assert module_file.startswith(installed["purelib"]), module_file  # not the checkout's
    assert library.startswith(installed["purelib"]) and os.path.isfile(library), library
    assert error == "None", out


def test_installed_package_ships_the_op_sources(installed):
    # the repository's top-level custom_ops/ is installed as equivtool/ops/kernels
    kernels = os.path.join(installed["purelib"], "equivtool", "ops", "kernels")
    tracked = _run(["git", "ls-files", "custom_ops"], cwd=REPO).split()
    assert tracked and sorted(os.listdir(kernels)) == sorted(os.path.basename(p) for p in tracked)


def test_build_ops_works_in_the_installed_package(installed):
    library = os.path.join(installed["purelib"], "equivtool", "ops",
                           "_xent_ops" + sysconfig.get_config_var("EXT_SUFFIX"))
    before = os.stat(library).st_mtime_ns
    out = _run([os.path.join(installed["bin"], "equivtool"), "build-ops"],
               cwd=installed["cwd"], env=installed["env"])
    assert f"built {library}" in out and os.stat(library).st_mtime_ns != before, out
    out = _in_venv(installed, "import tensorflow as tf, equivtool.ops as o; print(float("
                              "o.sparse_softmax_cross_entropy_with_logits(labels=[1], "
                              "logits=[[0.0, 0.0]])[0]))")
    assert abs(float(out.strip().splitlines()[-1]) - 0.6931472) < 1e-6, out


def test_demo_runs_from_the_installed_package(installed, tmp_path):
    html = tmp_path / "report.html"
    out = _run([os.path.join(installed["bin"], "equivtool"), "demo", "--image-size", "107",
                "--num-classes", "5", "--steps", "variables_once,parity", "--modes", "constant",
                "--html", str(html)], cwd=installed["cwd"], env=installed["env"])
    assert html.is_file() and "parity" in out, out[-3000:]
