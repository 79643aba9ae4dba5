"""The two notebooks run top to bottom and show what they say (issue 6).

Their sources are the Jupytext percent-format files ``notebooks/<name>.py``;
the committed ``.ipynb`` must hold exactly those cells (with the outputs of
their last execution).

Each notebook is copied to a temporary directory and executed there (the
committed file is never rewritten), in a kernel running this interpreter
(``make_notebooks.execute``: ipykernel's built-in ``python3`` spec, no
``ipykernel install`` needed). A cell that raises fails the test; the
assertions then read the outputs.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil

import nbformat
import pytest

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")


def _generator():
    spec = importlib.util.spec_from_file_location(
        "make_notebooks", os.path.join(NOTEBOOKS, "make_notebooks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


make_notebooks = _generator()


def _run(name: str, tmp_path) -> str:
    """Execute a temporary copy of notebooks/<name>.ipynb; return all of its text outputs."""
    copy = tmp_path / f"{name}.ipynb"
    shutil.copyfile(os.path.join(NOTEBOOKS, f"{name}.ipynb"), copy)
    nb = nbformat.read(copy, as_version=4)
    make_notebooks.execute(nb, cwd=str(tmp_path), timeout=600)
    nbformat.write(nb, copy)  # the executed copy, for a look after a failure
    return _text_outputs(nb)


def _text_outputs(nb) -> str:
    """All text outputs, one per line; consecutive outputs of one stream are concatenated.

    The kernel may split one ``print`` into several stream outputs (it flushes
    on a timer), so a stream's pieces are joined as written, never with a newline.
    """
    texts, stream = [], None
    for cell in nb.cells:
        stream = None  # a new cell starts a new stream
        for output in cell.get("outputs", ()):
            if output.output_type == "stream":
                if stream == output.name:
                    texts[-1] += output.text
                else:
                    texts.append(output.text)
                stream = output.name
            else:
                stream = None
                if "data" in output:
                    texts.append(output.data.get("text/plain", ""))
    return "\n".join(texts)


def test_text_outputs_join_a_split_print_as_written():
    stream = nbformat.v4.new_output
    cell = nbformat.v4.new_code_cell("print(...)", outputs=[
        stream("stream", name="stdout", text="Verdict: EQUI"),
        stream("stream", name="stdout", text="VALENT (6 passed)\n"),
        stream("stream", name="stderr", text="a warning\n"),
        stream("execute_result", data={"text/plain": "42"}, execution_count=1),
        stream("stream", name="stdout", text="after\n")])
    later = nbformat.v4.new_code_cell("print(...)", outputs=[stream("stream", name="stdout", text="next cell\n")])
    text = _text_outputs(nbformat.v4.new_notebook(cells=[cell, later]))
    assert "Verdict: EQUIVALENT (6 passed)" in text
    assert text.split("\n") == ["Verdict: EQUIVALENT (6 passed)", "", "a warning", "", "42", "after", "",
                                 "next cell", ""]


def _image_outputs(path) -> int:
    nb = nbformat.read(path, as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", ()))


def _cells(nb) -> list:
    return [(c.cell_type, c.source) for c in nb.cells]


@pytest.mark.parametrize("name", sorted(make_notebooks.NOTEBOOKS))
def test_committed_notebook_matches_its_source(name):
    committed = nbformat.read(os.path.join(NOTEBOOKS, f"{name}.ipynb"), as_version=4)
    generated = make_notebooks.build(name)
    kinds = {kind for kind, _ in _cells(generated)}
    assert len(generated.cells) > 5 and kinds == {"code", "markdown"}  # a real source was read
    assert _cells(committed) == _cells(generated), \
        f"notebooks/{name}.ipynb is out of date: run notebooks/make_notebooks.py --execute {name}"
    assert [c["id"] for c in committed.cells] == [c["id"] for c in generated.cells]


def test_source_check_finds_an_edited_cell():
    generated = make_notebooks.build("deterministic_xent")
    edited = nbformat.from_dict(generated)
    edited.cells[-1].source += "\nprint('edited')"
    assert _cells(edited) != _cells(make_notebooks.build("deterministic_xent"))


@pytest.mark.parametrize("name", sorted(make_notebooks.NOTEBOOKS))
def test_sources_are_plain_python_in_percent_format(name):
    with open(make_notebooks.source_path(name), encoding="utf-8") as handle:
        text = handle.read()
    compile(text, make_notebooks.source_path(name), "exec")  # the cells are code, not strings
    assert text.count("# %%") == len(make_notebooks.build(name).cells)


def test_build_rejects_an_unknown_name():
    with pytest.raises(ValueError, match="name: expected one of validate_correctness, deterministic_xent"):
        make_notebooks.build("nope")


@pytest.mark.parametrize("name", sorted(make_notebooks.NOTEBOOKS))
def test_committed_notebook_has_outputs_and_no_errors(name):
    nb = nbformat.read(os.path.join(NOTEBOOKS, f"{name}.ipynb"), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs for c in code), f"notebooks/{name}.ipynb has cells without outputs"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not [o for c in code for o in c.outputs if o.get("name") == "stderr"], "stderr in outputs"


@pytest.mark.slow
def test_validate_correctness_notebook_proves_inception_resnet_v2_equivalent(tmp_path):
    text = _run("validate_correctness", tmp_path)
    assert "Inception-ResNet-v2: Verdict: EQUIVALENT (6 passed)" in text
    # the cheap demonstrations show what they claim
    assert "VariableCreationError: Variable broken_layer/dense_two/kernel was about to be created" in text
    assert "second call created no variable; outputs equal: True" in text
    assert "Variable parity: MISMATCH" in text and "Variable parity: OK" in text
    assert re.search(r"fixed_weights\s+FAILED.*end_points/bn1", text)
    assert re.search(r"constant\s+TF1 graph == TF2 eager: True; the two \[3, 3\] draws equal each other: True", text)
    assert re.search(r"num_random_ops\s+TF1 graph == TF2 eager: True; the two \[3, 3\] draws equal each other: False",
                     text)
    assert "Verdict: EQUIVALENT (8 passed)" in text  # the small model, both random modes


def test_deterministic_xent_notebook_shows_determinism_agreement_and_stability(tmp_path):
    text = _run("deterministic_xent", tmp_path)
    assert "5 repeat runs bitwise identical (loss and gradient): True" in text
    assert "batch split 100 + 156 bitwise identical to the whole batch: True" in text
    assert re.search(r"loss .*within rtol=1e-6, atol=1e-5: True", text)
    assert re.search(r"gradient .*within rtol=1e-6, atol=1e-5: True", text)
    assert "stable: True" in text
    assert "inside the block:  ['EquivtoolSparseXent'] ['EquivtoolSparseXent']" in text
    assert "outside the block: ['SparseSoftmaxCrossEntropyWithLogits'] ['SparseSoftmaxCrossEntropyWithLogits']" in text
    assert "after the block:   ['SparseSoftmaxCrossEntropyWithLogits']" in text
    assert _image_outputs(tmp_path / "deterministic_xent.ipynb") == 1  # the timing plot
