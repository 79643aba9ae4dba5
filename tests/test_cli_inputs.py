"""Issue 23, item 7: ``equivtool check`` inputs beyond one float32 array:
``--inputs file.npz`` (a dict or a list) and ``--input NAME:SHAPE:DTYPE[:LO,HI]``
(repeatable, integers included), one structure passed to both sides; and ``--outputs``."""

import numpy as np
import pytest

from equivtool import cli
from equivtool._base.inputs import InputError, inputs_from_options, load_npz, parse_input

ENCODER = ["check", "published_models:encoder", "published_models:EncoderShim", "--tf-function"]


@pytest.fixture(autouse=True)
def _in_tests_dir(monkeypatch):
    import os
    monkeypatch.chdir(os.path.dirname(os.path.abspath(__file__)))


def test_input_specs_give_a_dict_with_integer_ranges():
    inputs, described = inputs_from_options(None, None, ["ids:2,5:int32:3,7", "mask:2,5:bool", "x:3:float16:-1,1"], 0, 100)
    assert set(inputs) == {"ids", "mask", "x"}
    assert inputs["ids"].dtype == np.int32 and inputs["ids"].shape == (2, 5)
    assert inputs["ids"].min() >= 3 and inputs["ids"].max() <= 7  # integers: HI included
    assert inputs["mask"].dtype == bool and inputs["x"].dtype == np.float16 and np.abs(inputs["x"]).max() <= 1
    assert "ids[2, 5] int32" in described


@pytest.mark.parametrize("spec, words", [
    ("ids:2,5", "--input: expected NAME:SHAPE:DTYPE"),
    ("ids:2,x:int32", "SHAPE must be comma-separated positive integers"),
    ("ids:2,5:str", "DTYPE must be a float, integer or bool dtype"),
    ("ids:2,5:int32:5,1", "LO,HI must be two numbers with LO <= HI"),
    ("ids:2,5:int32:0.5,3", "integer DTYPE needs integer LO,HI"),
    ("ids:1000,1000:int32", "at most 100 per input"),
])
def test_bad_input_specs_name_the_option_and_the_form(spec, words):
    with pytest.raises(InputError, match=words):
        parse_input(spec, 100)


def test_exactly_one_inputs_option():
    with pytest.raises(InputError, match="exactly one of --input-shape"):
        inputs_from_options("1,2", None, ["a:1:int32"], 0, 100)
    with pytest.raises(InputError, match="got none"):
        inputs_from_options(None, None, None, 0, 100)


def test_npz_numbered_keys_give_a_list_other_keys_a_dict(tmp_path):
    a, b = np.arange(3), np.ones((2, 2), np.int32)
    np.savez(tmp_path / "l.npz", a, b)
    loaded = load_npz(str(tmp_path / "l.npz"))
    assert isinstance(loaded, list) and [x.tolist() for x in loaded] == [a.tolist(), b.tolist()]
    np.savez(tmp_path / "one.npz", a)
    assert isinstance(load_npz(str(tmp_path / "one.npz")), np.ndarray)
    np.savez(tmp_path / "d.npz", input_ids=a, arr_0=b)
    assert set(load_npz(str(tmp_path / "d.npz"))) == {"input_ids", "arr_0"}
    with pytest.raises(InputError, match="--inputs: expected a .npz file"):
        load_npz(str(tmp_path / "missing.npz"))
    (tmp_path / "bad.npz").write_text("not a zip")
    with pytest.raises(InputError, match="cannot read"):
        load_npz(str(tmp_path / "bad.npz"))


def test_check_a_dict_of_int32_inputs_from_the_command_line(capsys):
    code = cli.main(ENCODER + ["--input", "input_ids:2,5:int32:0,11", "--input", "input_mask:2,5:int32:1,1",
                               "--steps", "fixed_weights"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK, out
    assert "Verdict: EQUIVALENT" in out


def test_check_npz_inputs_and_outputs_patterns(tmp_path, capsys):
    from published_models import token_inputs
    np.savez(tmp_path / "tokens.npz", **token_inputs())
    code = cli.main(ENCODER + ["--inputs", str(tmp_path / "tokens.npz"), "--steps", "fixed_weights",
                               "--outputs", "nothing*"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_DIFFERENT and "INCONCLUSIVE" in out, out  # nothing compared is not a pass
    code = cli.main(ENCODER + ["--inputs", str(tmp_path / "tokens.npz"), "--steps", "fixed_weights",
                               "--outputs", "end_points/*"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK and "Verdict: EQUIVALENT" in out, out


def test_bad_input_is_a_usage_error(capsys):
    code = cli.main(ENCODER + ["--input", "input_ids:2,5:text"])
    assert code == cli.EXIT_USAGE
    assert "DTYPE must be" in capsys.readouterr().err
