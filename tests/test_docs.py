"""The documentation works as written (issue 35).

Every Python and shell block of ``README.md`` and ``docs/*.md`` runs, page by
page, each page in a fresh interpreter (``tests/docs_runner.py``, on Sybil); a
block may be skipped only with ``<!-- skip: next "reason" -->``. Which blocks
a page has is counted here independently of the runner, from the fences, so a
block the runner did not see (an unknown language tag, an indented fence) fails
the page instead of going unrun.

The site (``mkdocs.yml``: the pages and an API reference written from the
public names' docstrings) builds with ``--strict``: a broken link, anchor or
API reference fails it. The README is not part of the site, so its relative
links are checked here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNER = os.path.join(REPO, "tests", "docs_runner.py")
RUNNABLE = {"python", "py", "bash", "sh", "shell", "console", "zsh", "pycon", "ipython"}
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([^\s`]*)(.*)$")


def pages() -> list:
    docs = os.path.join(REPO, "docs")
    return ["README.md"] + sorted(os.path.join("docs", name) for name in os.listdir(docs) if name.endswith(".md"))


def runnable_fences(text: str) -> list:
    """The line numbers (1-based) of the fences that open a Python or shell block."""
    lines, opened = [], None
    for number, line in enumerate(text.split("\n"), start=1):
        match = FENCE.match(line)
        if not match:
            continue
        if opened is None:
            opened = match.group(2)
            if match.group(3).lower() in RUNNABLE:
                lines.append(number)
        elif match.group(2).startswith(opened) and not match.group(3):
            opened = None
    return lines


def run_page(page: str, tmp_path, timeout: int = 600) -> subprocess.CompletedProcess:
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, RUNNER, os.path.join(REPO, page), str(workdir), str(tmp_path / "bin")],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def outcomes_of(result: subprocess.CompletedProcess) -> list:
    assert result.returncode == 0, (result.stdout[-2000:] + result.stderr[-6000:])
    line = [line for line in result.stdout.splitlines() if line.startswith("OUTCOMES ")]
    assert len(line) == 1, result.stdout[-2000:]
    return json.loads(line[0][len("OUTCOMES "):])


def check_outcomes(text: str, outcomes: list) -> None:
    """Every runnable fence ran or was skipped with a reason; nothing else ran."""
    fences = runnable_fences(text)
    assert fences, "the page has no Python or shell block"
    seen = [outcome["line"] for outcome in outcomes]
    assert seen == fences, f"blocks at lines {fences}, the runner evaluated lines {seen}"
    for outcome in outcomes:
        assert outcome["outcome"] in ("ran", "skipped"), outcome
        if outcome["outcome"] == "skipped":
            assert len(outcome["reason"].strip()) > 10, f"line {outcome['line']}: a skip must say why"


def _read(page: str) -> str:
    with open(os.path.join(REPO, page), encoding="utf-8") as handle:
        return handle.read()


PAGES_WITH_BLOCKS = [page for page in pages() if runnable_fences(_read(page))]


def test_the_pages_have_blocks_to_run():
    assert "README.md" in PAGES_WITH_BLOCKS
    assert len(PAGES_WITH_BLOCKS) >= 10
    assert sum(len(runnable_fences(_read(page))) for page in PAGES_WITH_BLOCKS) >= 25


@pytest.mark.parametrize("page", PAGES_WITH_BLOCKS)
def test_every_block_of_the_page_runs(page, tmp_path):
    outcomes = outcomes_of(run_page(page, tmp_path))
    check_outcomes(_read(page), outcomes)
    assert any(outcome["outcome"] == "ran" for outcome in outcomes) or page == "README.md"


# --- the runner and the check can fail -------------------------------------------------------

def _planted(tmp_path, text: str) -> tuple:
    page = tmp_path / "planted.md"
    page.write_text(text)
    return text, run_page(str(page), tmp_path, timeout=120)


def test_a_page_runs_its_blocks_in_one_namespace_with_files_and_shell(tmp_path):
    text, result = _planted(tmp_path, '# p\n\n```python\nvalue = 2\n```\n\n'
                                      '```python title="shown.py"\nVALUE = 7\n```\n\n'
                                      '```bash\npython -c "import shown; assert shown.VALUE == 7" && touch ran\n```\n\n'
                                      '<!-- skip: next "it needs a GPU, which this machine has not" -->\n'
                                      '```python\nraise SystemExit(3)\n```\n\n'
                                      '```python\nimport shown\nassert value + shown.VALUE == 9\n'
                                      'print("header")\nprint("step  passed  0.47s")\nprint("a")\nprint("Verdict: 9")\n```\n\n'
                                      '```text\nstep  passed  ...s\n...\nVerdict: 9\n```\n\n'
                                      '```bash\necho "exit code $((2 + 1))"\n```\n\n```text\nexit code 3\n```\n')
    outcomes = outcomes_of(result)
    check_outcomes(text, outcomes)
    assert [(o["kind"], o["outcome"]) for o in outcomes] == [
        ("python", "ran"), ("file", "ran"), ("bash", "ran"), ("python", "skipped"), ("python", "ran"),
        ("bash", "ran")]
    assert [o.get("output_checked") for o in outcomes] == [False, False, False, None, True, True]
    assert (tmp_path / "work" / "ran").exists()


def test_a_failing_python_block_fails_the_page(tmp_path):
    _, result = _planted(tmp_path, "# p\n\n```python\nassert 1 + 1 == 3, 'planted'\n```\n")
    assert result.returncode == 1 and "planted" in result.stderr


@pytest.mark.parametrize("shown", ["Verdict: EQUIVALENT", "second\nfirst", "first ...x"])
def test_output_the_block_did_not_print_fails_the_page(tmp_path, shown):
    _, result = _planted(tmp_path, f"# p\n\n```python\nprint('first line')\nprint('second')\n```\n\n```text\n{shown}\n```\n")
    assert result.returncode == 1 and "the block did not print, in order, the line" in result.stderr


def test_a_failing_shell_block_fails_the_page(tmp_path):
    _, result = _planted(tmp_path, "# p\n\n```bash\ntrue\nfalse | cat\necho never\n```\n")
    assert result.returncode == 1 and "the shell block exited 1" in result.stderr


def test_a_skip_without_a_reason_is_refused(tmp_path):
    _, result = _planted(tmp_path, "# p\n\n<!-- skip: next -->\n```python\npass\n```\n")
    assert result.returncode == 1 and "needs a reason" in result.stderr


def test_a_block_the_runner_does_not_run_fails_the_check(tmp_path):
    text, result = _planted(tmp_path, "# p\n\n```python\npass\n```\n\n```sh\nfalse\n```\n\n"
                                      "```console\n$ false\n```\n")
    outcomes = outcomes_of(result)
    assert [o["line"] for o in outcomes] == [3]
    with pytest.raises(AssertionError, match=r"blocks at lines \[3, 7, 11\], the runner evaluated lines \[3\]"):
        check_outcomes(text, outcomes)


def test_a_page_without_blocks_or_with_a_short_skip_reason_fails_the_check():
    with pytest.raises(AssertionError, match="no Python or shell block"):
        check_outcomes("# p\n\n```text\nout\n```\n", [])
    with pytest.raises(AssertionError, match="a skip must say why"):
        check_outcomes("# p\n\n```python\npass\n```\n",
                       [{"line": 3, "kind": "python", "outcome": "skipped", "reason": "x"}])


# --- the site builds strictly; the README's links resolve --------------------------------------

def mkdocs_build(config: str, site, cwd: str = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", config, "-d", str(site)],
                          cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=REPO))


def undocumented(api_html: str, objects: dict) -> list:
    """The names whose docstring's first paragraph is not in the API page's text."""
    import html
    import inspect

    def words(text: str) -> str:
        return " ".join(text.replace("`", "").split())

    text = words(html.unescape(re.sub(r"<[^>]+>", "", api_html)))
    missing = []
    for name, obj in objects.items():
        doc = inspect.getdoc(obj) if inspect.isclass(obj) or inspect.isroutine(obj) else None
        if doc and words(doc.split("\n\n")[0]) not in text:
            missing.append(name)
    return missing


def test_the_site_builds_strictly_with_every_public_name_documented(tmp_path):
    result = mkdocs_build(os.path.join(REPO, "mkdocs.yml"), tmp_path / "site")
    assert result.returncode == 0, result.stderr[-4000:]
    import equivtool
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    names = [name for name in equivtool.__all__ if not name.startswith("__")]
    import importlib.util
    spec = importlib.util.spec_from_file_location("docs_api", os.path.join(REPO, "tools", "docs_api.py"))
    docs_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs_api)
    # the entry's id is where the name is defined (through a lazy package's own table)
    missing = [name for name in names
               if f'id="equivtool.{docs_api._defining(equivtool._EXPORTS[name], name)}.{name}"' not in api]
    assert not missing, f"public names without an API entry: {missing}"
    objects = {name: getattr(equivtool, name) for name in names}
    assert sum(1 for obj in objects.values() if getattr(obj, "__doc__", None)) >= 25
    assert undocumented(api, objects) == []
    for page in pages()[1:]:
        name = os.path.basename(page)[:-3]
        built = tmp_path / "site" / ("index.html" if name == "index" else f"{name}/index.html")
        assert built.exists(), f"{page} was not built"


def test_the_docstring_check_finds_a_missing_docstring():
    def documented():
        """Say what it does, with ``code``."""

    def other():
        """Something the page does not say."""

    page = "<p>Say what it <code>does</code>, with <code>code</code>.</p>"
    assert undocumented(page, {"documented": documented, "other": other, "constant": (1, 2)}) == ["other"]


def _small_site(tmp_path, page_text: str) -> str:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(page_text)
    with open(os.path.join(REPO, "mkdocs.yml")) as handle:
        config = handle.read()
    config = config.split("\nnav:")[0].replace("tools/docs_api.py", os.path.join(REPO, "tools", "docs_api.py"))
    config = config.replace("paths: [.]", f"paths: [{REPO}]")
    (tmp_path / "mkdocs.yml").write_text(config)
    return str(tmp_path / "mkdocs.yml")


def test_the_strict_build_fails_on_a_broken_link(tmp_path):
    config = _small_site(tmp_path, "# Home\n\nSee [the guide](no-such-guide.md).\n")
    result = mkdocs_build(config, tmp_path / "site", cwd=str(tmp_path))
    assert result.returncode != 0 and "no-such-guide.md" in result.stderr


def test_the_strict_build_fails_on_a_broken_anchor(tmp_path):
    config = _small_site(tmp_path, "# Home\n\nSee [below](#no-such-section).\n")
    result = mkdocs_build(config, tmp_path / "site", cwd=str(tmp_path))
    assert result.returncode != 0 and "no-such-section" in result.stderr


def test_the_strict_build_fails_on_a_broken_api_reference(tmp_path):
    config = _small_site(tmp_path, "# Home\n\n::: equivtool.comparison.NoSuchName\n")
    result = mkdocs_build(config, tmp_path / "site", cwd=str(tmp_path))
    assert result.returncode != 0 and "NoSuchName" in result.stderr


LINK = re.compile(r"\]\(([^)\s]+)\)")


def broken_links(text: str, base: str) -> list:
    """Relative link targets of a Markdown text that name no file or folder under ``base``."""
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        if not os.path.exists(os.path.join(base, path)):
            broken.append(target)
    return broken


def test_the_readme_links_resolve():
    text = _read("README.md")
    assert len(LINK.findall(text)) >= 10
    assert broken_links(text, REPO) == []


def test_the_link_check_finds_a_broken_link():
    assert broken_links("[a](docs/index.md) [b](docs/no-such.md#x) [c](https://example.org)", REPO) == \
        ["docs/no-such.md#x"]
