"""Run every code block of one Markdown page, in order, as a reader would (issue 35).

``python tests/docs_runner.py PAGE WORKDIR BINDIR`` is started by
``tests/test_docs.py`` once per page, in a fresh interpreter: a page's blocks
share one namespace (a later block uses what an earlier one defined, as in a
script), and nothing a page does to TensorFlow's global state (op determinism,
logical devices, seeds) reaches another page or the test process.

Sybil (a maintained runner for examples in documentation) finds the blocks:

- ```` ```python ```` runs in the page's namespace (``__name__ == "__main__"``);
- ```` ```python title="NAME.py" ```` is a file the page shows: it is written to
  WORKDIR under that name, and a later block imports or runs it;
- ```` ```bash ```` runs in ``bash -e -o pipefail`` in WORKDIR, with BINDIR first
  on ``PATH`` (there ``equivtool`` runs this checkout's command line and
  ``python`` is this interpreter);
- ``<!-- skip: next "reason" -->`` (Sybil's own directive) skips the next block;
  the reason is required, and is reported.

A ```` ```text ```` block right after a Python or shell block (nothing but blank
lines between) is what that block prints: each of its lines must be a line of
the block's output, in order, where ``...`` in a line stands for any text
(timings, a machine's name) and a line of only ``...`` for any lines.

The outcome of each block (line, kind, ran or skipped and why) is printed as
one JSON line, so the test can check that every block of the page was either
run or skipped with a reason. The first block that fails ends the run (exit 1)
with its traceback or its command's output.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import traceback
from unittest import SkipTest

from sybil import Document
from sybil.evaluators.skip import Skipper
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILE_BLOCK = re.compile(r'python title="([A-Za-z0-9_./-]+\.py)"\Z')
SHELL_TIMEOUT_S = 240


def tagged(evaluate, kind: str):
    """``evaluate`` with the kind of block it runs, for the outcome list."""
    def evaluator(example):
        return evaluate(example)
    evaluator.kind = kind
    return evaluator


class FileBlockParser:
    """```` ```python title="NAME.py" ````: the block's text is written to NAME.py."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.lexer = CodeBlockParser(language="python").lexers

    def __call__(self, document: Document):
        for region in self.lexer(document):
            match = FILE_BLOCK.match(region.lexemes["arguments"])
            if match:
                region.parsed = (match.group(1), str(region.lexemes["source"]))
                region.evaluator = tagged(self.write, "file")
                yield region

    def write(self, example) -> None:
        name, text = example.parsed
        path = os.path.join(self.workdir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)



def expected_output(document: Document, example) -> str | None:
    """The ```` ```text ```` block right after ``example``, or None."""
    match = re.match(r"\s*```text\n(.*?)^```", document.text[example.end:], re.S | re.M)
    return match.group(1) if match else None


def check_output(expected: str, printed: str) -> None:
    """Each expected line is a printed line, in order (``...``: any text, or any lines)."""
    lines = [line.rstrip() for line in printed.splitlines()]
    position = 0
    for want in expected.rstrip("\n").splitlines():
        want = want.rstrip()
        if want.strip() == "...":
            continue
        pattern = re.compile(".*?".join(re.escape(part) for part in want.split("...")) + r"\Z")
        for index in range(position, len(lines)):
            if pattern.match(lines[index]):
                position = index + 1
                break
        else:
            raise AssertionError(f"the block did not print, in order, the line {want!r}; it printed:\n"
                                 + "\n".join(lines[-60:]))


def shell_environment(bindir: str) -> dict:
    """The reader's shell: this checkout's ``equivtool`` and this ``python`` first on PATH."""
    env = dict(os.environ)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def make_bindir(bindir: str) -> None:
    """``equivtool`` (this checkout's command line) and ``python`` (this interpreter, its
    virtual environment included: a wrapper, since a symlink to it would lose the venv)."""
    os.makedirs(bindir, exist_ok=True)
    scripts = {"equivtool": f'exec "{sys.executable}" -c "import sys; from equivtool.cli import main; '
                            f'sys.exit(main())" "$@"',
               "python": f'exec "{sys.executable}" "$@"'}
    for name, line in scripts.items():
        path = os.path.join(bindir, name)
        with open(path, "w") as handle:
            handle.write(f"#!/bin/sh\n{line}\n")
        os.chmod(path, 0o755)


def shell_evaluator(workdir: str, env: dict):
    def evaluate(example) -> None:
        result = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", str(example.parsed)], cwd=workdir,
                                env=env, capture_output=True, text=True, timeout=SHELL_TIMEOUT_S)
        if result.returncode != 0:
            raise AssertionError(f"the shell block exited {result.returncode}:\n"
                                 f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        sys.stdout.write(result.stdout)  # what it printed, for a following output block
    return tagged(evaluate, "bash")


def kind_of(example) -> str:
    """``skip`` (a directive), ``file``, ``bash`` or ``python``."""
    if isinstance(example.region.evaluator, Skipper):
        return "skip"
    return getattr(example.region.evaluator, "kind", "python")


def run_page(page: str, workdir: str, bindir: str) -> list:
    """Evaluate every block of ``page`` in order; the outcome of each."""
    make_bindir(bindir)
    env = shell_environment(bindir)
    os.environ.update({key: env[key] for key in ("TF_CPP_MIN_LOG_LEVEL",)})
    os.chdir(workdir)
    sys.path.insert(0, workdir)
    document = Document.parse(page, PythonCodeBlockParser(), FileBlockParser(workdir),
                              CodeBlockParser(language="bash", evaluator=shell_evaluator(workdir, env)),
                              SkipParser())
    document.namespace["__name__"] = "__main__"
    outcomes = []
    for example in document:
        kind = kind_of(example)
        if kind == "skip":
            action, reason = example.parsed
            if action == "next" and not (reason or "").strip():
                raise ValueError(f"{page}, line {example.line}: 'skip: next' needs a reason in quotes")
            example.evaluate()
            continue
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                example.evaluate()
        except SkipTest as skip:
            outcomes.append({"line": example.line, "kind": kind, "outcome": "skipped", "reason": str(skip)})
            continue
        finally:
            sys.stderr.write(printed.getvalue())  # shown when the page fails
        expected = expected_output(document, example) if kind != "file" else None
        if expected is not None:
            try:
                check_output(expected, printed.getvalue())
            except AssertionError as error:
                raise AssertionError(f"{page}, line {example.line}: {error}") from None
        outcomes.append({"line": example.line, "kind": kind, "outcome": "ran", "reason": "",
                         "output_checked": expected is not None})
    return outcomes


def main(argv: list) -> int:
    page, workdir, bindir = argv
    try:
        outcomes = run_page(os.path.abspath(page), workdir, bindir)
    except BaseException:  # the failing block's traceback is the test's message
        traceback.print_exc()
        return 1
    print("OUTCOMES " + json.dumps(outcomes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
