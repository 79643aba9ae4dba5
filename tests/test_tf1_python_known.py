"""The variables cross to and from the TensorFlow 1.15 interpreter once (``_old_known``).

Both ends keep, per request kind, the values the last request of that kind
carried; a value whose bits both ends hold crosses as a reference. The first
half needs no TensorFlow 1.15 (both ends' code run here, the program's module
imported in this interpreter); the second runs the contrib example's model
there (``$EQUIVTOOL_TF1_PYTHON``, skips with the reason without it) and shows
that a changed variable is used there and an unchanged one does not cross.
"""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest

from equivtool.engine.options import Options
from equivtool.engine.sides import _old_side_program as program
from equivtool.engine.sides import old_python
from equivtool.engine.sides._old_known import KnownValues, same_bits, value_key

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "contrib_tf1")
sys.path[:0] = [HERE, EXAMPLE]
import contrib_tf1_model as model  # noqa: E402
from options_support import equivalence_arguments  # noqa: E402
from test_tf1_python_side import INPUTS, tf1_python  # noqa: E402,F401 (the fixture: skips without the interpreter)


# --------------------------------------------------------------------------
# both ends, here
# --------------------------------------------------------------------------

def test_same_bits_is_bitwise():
    a = np.array([1.0, np.nan, 0.0], np.float32)
    assert same_bits(a, a.copy())  # a NaN equals its own bits
    assert not same_bits(a, np.array([1.0, np.nan, -0.0], np.float32))  # -0.0 is not 0.0
    assert not same_bits(a, a.astype(np.float64)) and not same_bits(a, a.reshape(3, 1))
    assert not same_bits(np.float32(1.0) * np.ones(()), np.float32(2.0) * np.ones(()))
    assert same_bits(np.ones((), np.float32), np.ones((), np.float32))  # 0-d
    assert program.same_bits(a, a.copy()) and not program.same_bits(a, a + 1)  # the program's is the same rule
    assert value_key("w:0") == value_key("w") == program.value_key("w:0") == "w"


def _answer_and_resolve(tmp_path, there, here, kind, names, values):
    """A read-like answer made by the program's Known (``there``), taken in by this end's (``here``)."""
    answer = there.answer(str(tmp_path), kind, names, values)
    received = {}
    if answer["file"] is not None:
        received = dict(zip(answer["names"], program.load_arrays(str(tmp_path), answer["file"])))
    found = here.resolve(answer["order"], received, answer["same"])
    here.keep(kind, list(found), list(found.values()))
    return answer, found


def test_only_changed_values_cross_and_what_crosses_is_the_new_value(tmp_path):
    there, here = program.Known(), KnownValues()
    w, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros(3, np.float32)
    first, found = _answer_and_resolve(tmp_path, there, here, "read", ["w:0", "b:0"], [w, b])
    assert first["names"] == ["w:0", "b:0"] and first["same"] == {}  # nothing held yet: all cross
    again, found = _answer_and_resolve(tmp_path, there, here, "read", ["w:0", "b:0"], [w.copy(), b.copy()])
    assert again["file"] is None and again["names"] == [] and set(again["same"]) == {"w:0", "b:0"}
    assert list(found) == ["w:0", "b:0"] and same_bits(found["w:0"], w) and same_bits(found["b:0"], b)
    changed = b.copy()
    changed[1] = 5.0
    third, found = _answer_and_resolve(tmp_path, there, here, "global_state", ["w", "b"], [w, changed])
    assert third["names"] == ["b"] and third["same"] == {"w": ["read", "w"]}
    np.testing.assert_array_equal(found["b"], changed)
    assert os.listdir(str(tmp_path)) == []  # every file read was deleted


def test_a_value_changed_in_place_after_it_crossed_is_sent_again():
    here = KnownValues()
    values = [np.ones(4, np.float32)]
    here.keep("assign", ["w:0"], values)
    assert here.split(["w:0"], values) == ([], [], {"w:0": ["assign", "w"]})
    values[0][2] = 7.0  # the caller's array, changed in place: the kept copy is not
    names, sent, same = here.split(["w:0"], values)
    assert names == ["w:0"] and same == {} and sent[0][2] == 7.0
    received = here.resolve(["w:0"], {}, {"w:0": ["assign", "w"]})
    received["w:0"][0] = 3.0  # what a caller gets is a copy
    assert here.kinds["assign"]["w"][0] == 1.0


def test_a_reference_the_other_end_does_not_hold_is_an_error_never_a_guess(tmp_path):
    with pytest.raises(KeyError, match="does not hold"):
        KnownValues().resolve(["w:0"], {}, {"w:0": ["read", "w"]})
    with pytest.raises(program.ProtocolError, match="does not hold"):
        program.Known().received(str(tmp_path), {"op": "assign", "names": [], "file": None,
                                                 "same": {"w:0": ["read", "w"]}, "order": ["w:0"]})


# --------------------------------------------------------------------------
# there: the contrib example's model in TensorFlow 1.15
# --------------------------------------------------------------------------

@pytest.fixture
def side(tf1_python, monkeypatch):
    """An old side of the contrib model with its variables created, and every ``.npz`` sent or
    received counted (``side.crossed``: ``(way, names)``)."""
    options = Options.build("contrib_tf1_model:model", lambda: None, INPUTS, **equivalence_arguments(
        seed=42, tf1_python=tf1_python, tf1_path=[HERE, EXAMPLE]))
    engine = types.SimpleNamespace(options=options, old_program=None)
    crossed = []
    send, receive = old_python.OldProgram.send, old_python.OldProgram.receive

    def counted_send(self, name, arrays):
        crossed.append(("sent", len(arrays)))
        return send(self, name, arrays)

    def counted_receive(self, answer):
        if answer.get("file") is not None:
            crossed.append(("received", len(answer["names"])))
        return receive(self, answer)

    monkeypatch.setattr(old_python.OldProgram, "send", counted_send)
    monkeypatch.setattr(old_python.OldProgram, "receive", counted_receive)
    try:
        found = old_python.OldTF1Side(engine, "constant")
        found.pass_ = found.forward(training=False)
        del crossed[:]  # the inputs, sent at open
        found.crossed = crossed
        yield found
    finally:
        if engine.old_program is not None:
            engine.old_program.close()


def _changed_value_is_used_there(side) -> bool:
    """Plants a change in one variable between two assigns (in place, in the array assigned
    before) and says whether the old side then holds and computes with the new value."""
    values = side.read_variables()
    side.assign_variables(values)
    before = side.run(side.pass_)["outputs"]
    key = next(k for k in values if k.endswith("weights"))
    values[key] += 0.5  # in place: the very array assigned before
    side.assign_variables(values)
    after = side.read_variables()
    outputs = side.run(side.pass_)["outputs"]
    return bool(np.array_equal(after[key], values[key]) and not np.allclose(outputs, before))


def test_a_variable_changed_between_two_steps_is_used_there(side):
    assert _changed_value_is_used_there(side)


def test_the_check_catches_a_stale_value_planted_in_what_both_ends_hold(side, monkeypatch):
    """The fault: this end claims the other holds every value it has ever seen (a stale reference)."""
    side.read_variables()
    monkeypatch.setattr(KnownValues, "find", lambda self, name, value: ["read", value_key(name)])
    assert not _changed_value_is_used_there(side)


def test_what_both_ends_hold_does_not_cross_again(side):
    values = side.read_variables()
    assert side.crossed == [("received", len(values))]  # the first read: every variable
    side.assign_variables(values)
    assert side.read_variables().keys() == values.keys()
    start = side.global_state()
    side.load_global_state(start)
    assert side.crossed == [("received", len(values))]  # nothing more crossed: no file either way
    values = side.read_variables()
    key = next(k for k in values if k.endswith("weights"))
    values[key] = values[key] * 2.0
    side.assign_variables(values)  # one changed variable: it alone crosses
    assert side.crossed[1:] == [("sent", 1)]
    assert np.array_equal(side.read_variables()[key], values[key]) and side.crossed[2:] == []
    side.load_global_state(start)  # the start put back: held at both ends, nothing crosses
    assert not np.array_equal(side.read_variables()[key], values[key]) and side.crossed[2:] == []
