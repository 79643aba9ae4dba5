"""``./dev matrix``: prove equivtool on every TensorFlow minor it declares.

For each version (a TensorFlow minor such as ``2.16``), as a new user would:

1. a virtual environment of its own, ``.venv-matrix/<minor>/`` (git-ignored,
   cached: the dependencies are installed again only when the minor or
   setup.cfg changed) with the latest patch of that TensorFlow minor, tf-keras
   of the same minor and whatever numpy pip picks for them;
2. a fresh copy of the working tree (tracked and untracked, not ignored files)
   in ``.venv-matrix/<minor>/src``, so the op library built there never
   replaces the one of ``.venv/``; then ``pip install --no-build-isolation -e``
   of that copy, which compiles the cross-entropy op against this TensorFlow;
3. ``equivtool doctor`` (with its live check of the random tool and the op);
4. the test suite: ``--suite full`` (default) or ``--suite compat`` (the op,
   seeding and equivalence tests: what a TensorFlow version can break);
5. a small demo, ``equivtool demo --image-size 107`` (``--no-demo`` skips it).

Each version's result goes to ``.venv-matrix/<minor>/result.json`` and its
full output to ``.venv-matrix/<minor>/log.txt``; the table between the
markers of COMPATIBILITY.md is rewritten (atomically) with one row per
version, rows of versions not run this time are kept. ``--no-table`` leaves
COMPATIBILITY.md alone (the CI leg); ``--table-only`` runs nothing and
rewrites the table from the last results. ``EQUIVTOOL_MATRIX_DIR`` moves
the environments elsewhere. Exit status: 0 when every step of every
version passed, 1 otherwise, 2 for bad arguments.

Standard library only: it runs under the system ``python3`` before any
virtual environment exists.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DECLARED = ("2.16", "2.17", "2.18", "2.19", "2.20", "2.21")
# EQUIVTOOL_MATRIX_DIR puts the environments elsewhere (e.g. kept across fresh CI clones).
MATRIX_DIR = os.path.abspath(os.environ.get("EQUIVTOOL_MATRIX_DIR") or os.path.join(REPO, ".venv-matrix"))
TABLE_FILE = os.path.join(REPO, "COMPATIBILITY.md")
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
# What a TensorFlow version can break: the op (build, kernels, swap), the
# random tool (seeding, tf-keras' seed source), the equivalence engine (in one
# process and in worker processes), the repairs of the import-time fix, the
# private TensorFlow symbols equivtool reads, and the exported-model sides
# (loaders, the inlined TF2 signature, tfdbg's session watches), the TF1 graph
# build's shortcut (its answers against TensorFlow's own, in every nesting), and
# the fixed values a TF2 variable takes by DLPack (that TensorFlow's first write
# to such a variable goes to a buffer of its own).
COMPAT_TESTS = ("tests/test_ops*.py", "tests/ops/test_*.py", "tests/test_seeding*.py", "tests/test_graph_building.py",
                "tests/test_equivalence*.py", "tests/test_selfcheck.py", "tests/test_workers.py",
                "tests/test_compat*.py", "tests/test_tf_internals.py", "tests/test_exported.py",
                "tests/test_exported_localize.py", "tests/test_fixed_values.py")
# Packaging does not depend on the TensorFlow version and compiles the op twice more.
COMPAT_EXCLUDE = ("tests/test_ops_packaging.py",)
DEMO_ARGS = ("--image-size", "107")


def _minor(text: str) -> str:
    if not re.fullmatch(r"2\.\d+", text):
        raise argparse.ArgumentTypeError(
            f"VERSIONS: expected TensorFlow minors such as 2.16 (declared: {', '.join(DECLARED)}), got {text!r}")
    return text


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="./dev matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", type=_minor, metavar="VERSIONS",
                        help=f"TensorFlow minors (default: all declared, {' '.join(DECLARED)})")
    parser.add_argument("--suite", choices=("full", "compat", "none"), default="full",
                        help="full suite (default), the op/seeding/equivalence tests, or none")
    parser.add_argument("--no-demo", action="store_true", help="skip the demo")
    parser.add_argument("--no-table", action="store_true", help="do not rewrite COMPATIBILITY.md")
    parser.add_argument("--table-only", action="store_true",
                        help="run nothing: rewrite COMPATIBILITY.md from the versions' last result.json")
    return parser.parse_args(argv)


class _Log:
    """Appends every command's output to the version's log.txt and echoes a summary line."""

    def __init__(self, path: str, version: str):
        self.path = path
        self.version = version
        self.file = open(path, "a", encoding="utf-8")

    def say(self, message: str) -> None:
        line = f"[matrix {self.version} {time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()

    def run(self, cmd: list[str], cwd: str, env: dict | None = None) -> tuple[int, str, float]:
        self.file.write(f"\n$ (cd {cwd} && {' '.join(cmd)})\n")
        self.file.flush()
        offset = os.path.getsize(self.path)
        start = time.monotonic()
        # straight into the log, so a long run can be followed with tail -f
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=self.file, stderr=subprocess.STDOUT)
        seconds = time.monotonic() - start
        with open(self.path, "rb") as handle:
            handle.seek(offset)
            output = handle.read().decode("utf-8", "replace")
        self.file.write(f"[exit {proc.returncode} after {seconds:.0f} s]\n")
        self.file.flush()
        return proc.returncode, output, seconds

    def close(self) -> None:
        self.file.close()


def _tail(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " / ".join(kept[-lines:])[:300]


def _deps_key(version: str) -> str:
    with open(os.path.join(REPO, "setup.cfg"), "rb") as handle:
        return hashlib.sha256(version.encode() + handle.read()).hexdigest()


def _copy_tree(dest: str) -> None:
    """dest becomes a fresh copy of the working tree's tracked and untracked, not ignored files."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=REPO, stdout=subprocess.PIPE, check=True).stdout
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    for rel in filter(None, listing.decode().split("\0")):
        source = os.path.join(REPO, rel)
        if not os.path.isfile(source) or os.path.islink(source):
            continue  # deleted in the work tree but still in the index, or a link
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(source, target)
    # a checkout of its own (nothing committed): tests that list the tree with git work in the copy
    subprocess.run(["git", "init", "-q", dest], check=True)


def _commit() -> str:
    """The tree proven: HEAD's short hash, with ``+changes`` when the work tree differs from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, stdout=subprocess.PIPE,
                          text=True).stdout.strip() or "unknown"
    # the table this tool rewrites is not a change to the tree it proves
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=normal", "--", ".",
                            f":!{os.path.relpath(TABLE_FILE, REPO)}"], cwd=REPO,
                           stdout=subprocess.PIPE, text=True).stdout.strip()
    return head + ("+changes" if dirty else "")


def _pip_versions(python: str) -> dict:
    code = ("import importlib.metadata as m, json\n"
            "out = {}\n"
            "for name in ('tensorflow', 'tf-keras', 'numpy', 'tf-slim'):\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: out[name] = None\n"
            "print(json.dumps(out))")
    proc = subprocess.run([python, "-c", code], stdout=subprocess.PIPE, text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


def _suite_files(src: str, suite: str) -> list[str]:
    if suite == "full":
        return []
    found = sorted({path for pattern in COMPAT_TESTS for path in glob.glob(os.path.join(src, pattern))})
    return [rel for rel in (os.path.relpath(path, src) for path in found) if rel not in COMPAT_EXCLUDE]


def _junit_counts(path: str) -> dict | None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    total["passed"] = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    failed = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    total["failed_tests"] = failed
    return total


def run_version(version: str, suite: str, demo: bool) -> dict:
    home = os.path.join(MATRIX_DIR, version)
    os.makedirs(home, exist_ok=True)
    log = _Log(os.path.join(home, "log.txt"), version)
    result: dict = {"version": version, "python": platform.python_version(), "commit": _commit(), "cpu": _cpu(),
                    "date": datetime.date.today().isoformat(), "suite_scope": suite, "ok": False}
    python = os.path.join(home, "bin", "python")
    try:
        # 1. dependencies (cached)
        stamp = os.path.join(home, ".deps-stamp")
        key = _deps_key(version)
        if not os.path.exists(python) or not os.path.exists(stamp) or open(stamp).read() != key:
            log.say(f"creating the environment: tensorflow=={version}.*, tf-keras=={version}.* (downloads a large wheel)")
            # creates it, or repairs one whose creation was cut short (no pip); keeps what is installed
            rc, out, _ = log.run([sys.executable, "-m", "venv", home], REPO)
            if rc:
                result["install"] = f"venv failed: {_tail(out)}"
                return result
            rc, out, seconds = log.run([python, "-m", "pip", "install", "-q", "--upgrade", "pip", "setuptools", "wheel"], REPO)
            if rc == 0:
                rc, out, seconds = log.run([python, "-m", "pip", "install", "-q",
                                            f"tensorflow=={version}.*", f"tf-keras=={version}.*"], REPO)
            if rc:
                result["install"] = f"dependencies failed: {_tail(out)}"
                return result
            with open(stamp, "w") as handle:
                handle.write(key)
        # 2. a fresh copy of the tree, installed as a user would: builds the op
        src = os.path.join(home, "src")
        _copy_tree(src)
        log.say("pip install --no-build-isolation -e .[test,report] (compiles the op)")
        rc, out, seconds = log.run([python, "-m", "pip", "install", "-q", "--no-build-isolation", "-e", ".[test,report]"], src)
        result["versions"] = _pip_versions(python)
        result["install_s"] = round(seconds)
        if rc:
            result["install"] = f"FAILS: {_tail(out)}"
            log.say(result["install"])
            return result
        result["install"] = "ok"
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)
        equivtool = os.path.join(home, "bin", "equivtool")
        # 3. doctor
        rc, out, _ = log.run([equivtool, "doctor"], src, env)
        result["doctor"] = "ok" if rc == 0 else f"exit {rc}: {_tail(out, 4)}"
        log.say(f"doctor: {result['doctor']}")
        # 4. suite
        if suite != "none":
            files = _suite_files(src, suite)
            junit = os.path.join(home, "junit.xml")
            if os.path.exists(junit):
                os.remove(junit)
            # Files in parallel, as ./dev test runs them (when this environment has pytest-xdist).
            workers = int(os.environ.get("EQUIVTOOL_TEST_WORKERS") or min(os.cpu_count() or 1, 4))
            parallel = []
            if workers > 1 and log.run([python, "-c", "import xdist"], src, env)[0] == 0:
                parallel = ["-n", str(workers), "--dist", "loadfile"]
            log.say(f"pytest ({suite}{': ' + ' '.join(files) if files else ''}{', ' + ' '.join(parallel) if parallel else ''})")
            rc, out, seconds = log.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *parallel,
                                        f"--junitxml={junit}", *files], src, env)
            counts = _junit_counts(junit) or {}
            result["suite"] = dict(counts, rc=rc, seconds=round(seconds))
            log.say(f"pytest: exit {rc}, {_tail(out, 1)} ({seconds:.0f} s)")
        # 5. demo
        if demo:
            rc, out, seconds = log.run([equivtool, "demo", *DEMO_ARGS], src, env)
            if rc == 0 and "EQUIVALENT" in out:
                verdict = "EQUIVALENT"
            elif rc == 1:
                verdict = "NOT EQUIVALENT"
            else:
                verdict = f"error (exit {rc}): {_tail(out, 2)}"
            result["demo"] = {"verdict": verdict, "seconds": round(seconds)}
            log.say(f"demo: {verdict} ({seconds:.0f} s)")
        result["ok"] = (result["doctor"] == "ok"
                        and (suite == "none" or result["suite"].get("rc") == 0)
                        and (not demo or result["demo"]["verdict"] == "EQUIVALENT"))
        return result
    finally:
        _write_atomic(os.path.join(home, "result.json"), json.dumps(result, indent=2) + "\n")
        log.say(f"done: {'ok' if result['ok'] else 'FAILED'} (log: {log.path})")
        log.close()


def _write_atomic(path: str, text: str) -> None:
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)  # replaces a symlink itself, never writes through it
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def _cpu() -> str:
    """The CPU's model name and the vector extensions oneDNN can use: its fused kernels round
    differently across them, so every row names its CPU. Read by equivtool's own
    ``_platform/graph_rewrites.cpu`` (loaded from its file: this tool runs without equivtool's
    dependencies), the same description as the report's header."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "_equivtool_graph_rewrites", os.path.join(REPO, "equivtool", "_platform", "graph_rewrites.py"))
    execution = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(execution)
    cpu = execution.cpu()
    isa = [name for name in ("AVX-512", "AMX BF16") if name in cpu["isa"]]
    return f"{cpu['model']} ({', '.join(isa)})" if isa else cpu["model"]


def _row(result: dict) -> str:
    v = result.get("versions") or {}
    tf = v.get("tensorflow") or f"{result['version']}.?"
    stack = f"{tf} | {v.get('tf-keras') or '-'} | {v.get('numpy') or '-'}"
    install = result.get("install", "not run")
    if install == "ok" and "install_s" in result:
        install = f"ok, {result['install_s']} s"
    doctor = result.get("doctor", "not run")
    suite = result.get("suite")
    if suite is None:
        suite_cell = "not run"
    elif "tests" not in suite:
        suite_cell = f"did not run (exit {suite.get('rc')})"
    else:
        scope = "full suite" if result.get("suite_scope") == "full" else "op + seeding + equivalence tests"
        parts = [f"{suite['passed']} passed"]
        for key, word in (("failures", "failed"), ("errors", "errors"), ("skipped", "skipped")):
            if suite.get(key):
                parts.append(f"{suite[key]} {word}")
        suite_cell = f"{scope}: {', '.join(parts)} ({suite['seconds']} s)"
    demo = result.get("demo")
    demo_cell = f"{demo['verdict']}, {demo['seconds']} s" if demo else "not run"
    when = f"{result.get('date', '')} ({result['commit']})" if result.get("commit") else result.get("date", "")
    return f"| {stack} | {result.get('cpu', '?')} | {install} | {doctor} | {suite_cell} | {demo_cell} | {when} |"


HEADER = ("| TensorFlow | tf-keras | numpy | CPU | install (`pip install --no-build-isolation -e .`, op build) "
          "| `equivtool doctor` | tests | demo (`--image-size 107`) | date (commit) |\n"
          "|---|---|---|---|---|---|---|---|---|")


def write_table(results: list[dict]) -> None:
    text = open(TABLE_FILE, encoding="utf-8").read() if os.path.exists(TABLE_FILE) else f"{BEGIN}\n{END}\n"
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{TABLE_FILE}: expected the markers {BEGIN} and {END} around the table")
    head, rest = text.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    rows = {}
    for line in body.splitlines():
        match = re.match(r"\|\s*(2\.\d+)\.", line)
        if match:
            rows[match.group(1)] = line
    for result in results:
        rows[result["version"]] = _row(result)
    ordered = [rows[key] for key in sorted(rows, key=lambda k: tuple(map(int, k.split("."))))]
    _write_atomic(TABLE_FILE, f"{head}{BEGIN}\n{HEADER}\n" + "\n".join(ordered) + f"\n{END}{tail}")


def main(argv: list[str]) -> int:
    args = _parse(argv)
    versions = args.versions or list(DECLARED)
    if args.table_only:
        found = [os.path.join(MATRIX_DIR, v, "result.json") for v in versions]
        results = [json.load(open(path)) for path in found if os.path.exists(path)]
        write_table(results)
        print(f"[matrix] table rewritten from {len(results)} result(s): {TABLE_FILE}")
        return 0
    os.makedirs(MATRIX_DIR, exist_ok=True)
    results = []
    for version in versions:
        results.append(run_version(version, args.suite, not args.no_demo))
        if not args.no_table:
            write_table(results)
    for result in results:
        print(f"[matrix] {result['version']}: {'ok' if result['ok'] else 'FAILED'}  {_row(result)}")
        if not result["ok"]:  # what went wrong, without opening the log
            with open(os.path.join(MATRIX_DIR, result["version"], "log.txt"), encoding="utf-8") as handle:
                tail = handle.read().splitlines()[-40:]
            print("\n".join(f"    {line}" for line in tail))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
