"""benchmarks/check_floor.py: a check's time against its floor (issue 38).

The benchmark is not a test (it times whole checks of large models); these
tests check what would make its figures wrong: the floor's TF1 graph holds
each variable once (the training pass reuses the inference pass's), the TF2
jobs are one per layer the plan builds, a row's ratios are the check over
each floor, and a child that fails stops the benchmark with its error
instead of leaving a row out.
"""

import subprocess
import sys

import pytest
import tensorflow as tf

import equivtool
from benchmarks import check_floor
from tests.test_zoo import X, tiny_arg_scope, tiny_net


def _shim():
    return equivtool.slim_shim(tiny_net, tiny_arg_scope())


def test_the_floor_graph_builds_each_variable_once(monkeypatch):
    graphs = []
    real = tf.Graph

    def recording():
        graphs.append(real())
        return graphs[-1]
    monkeypatch.setattr(tf, "Graph", recording)
    seconds = check_floor.tf1_one_graph(_shim().tf1_fn, X)
    assert seconds > 0 and len(graphs) == 1
    with graphs[0].as_default():
        names = [v.op.name for v in tf.compat.v1.global_variables()]
    assert len(names) == len(set(names)) == 4, names  # conv1 and logits, weights and biases: once


def test_the_plan_times_four_tf1_jobs_and_three_tf2_layers():
    cpu = []
    tf1 = check_floor.tf1_plan(_shim().tf1_fn, X, cpu=cpu)
    tf2 = check_floor.tf2_layer_jobs(_shim, X, layers=3, cpu=cpu)
    assert len(tf1) == 4 and len(tf2) == 3 and all(t > 0 for t in tf1 + tf2)
    assert len(cpu) == 7 and all(c > 0 for c in cpu)  # each job's CPU seconds


def test_the_plan_has_the_fixed_weights_pass_on_each_side(monkeypatch):
    """fixed_weights shares the constant-mode inference build, not its pass: the
    first TF1 job runs the inference fetches twice (after the initialiser), the
    first TF2 layer makes two inference calls before its training call."""
    runs, real_run = [], tf.compat.v1.Session.run

    def counting(self, fetches, *args, **kwargs):
        runs.append(self.graph)
        return real_run(self, fetches, *args, **kwargs)
    monkeypatch.setattr(tf.compat.v1.Session, "run", counting)
    check_floor.tf1_plan(_shim().tf1_fn, X)
    per_graph = [runs.count(graph) for graph in dict.fromkeys(runs)]
    assert per_graph == [3, 2, 2, 2], per_graph  # the initialiser, then the passes

    calls = []

    def make_layer():
        layer = _shim()
        real_call = layer.call

        def call(inputs, training=None):
            calls.append((id(layer), bool(training)))
            return real_call(inputs, training=training)
        layer.call = call
        return layer
    check_floor.tf2_layer_jobs(make_layer, X, layers=3)
    first = [training for layer, training in calls if layer == calls[0][0]]
    assert first == [False, False, True], calls
    assert len({layer for layer, _ in calls}) == 3


def test_the_fast_build_floor_builds_under_the_checks_shortcut():
    from equivtool._platform import graph_building
    from tensorflow.python.framework import ops

    seen = []
    tf1_fn = _shim().tf1_fn
    for fast in (False, True):
        def recording(x, training, _fast=fast):
            seen.append((_fast, ops.executing_eagerly_outside_functions is graph_building.shortcut))
            return tf1_fn(x, training)
        assert len(check_floor.tf1_plan(recording, X, fast=fast)) == 4
    assert seen == [(False, False)] * 4 + [(True, True)] * 4


def test_the_plan_floor_is_the_longest_job_or_half_the_sum():
    assert check_floor.plan_floor([1.0, 1.0, 6.0]) == 6.0
    assert check_floor.plan_floor([3.0, 3.0, 3.0]) == 4.5


def test_a_row_states_the_check_over_each_floor():
    row = check_floor.row({"model": "net", "check": 30.0, "floor": 10.0, "plan_floor": 20.0,
                           "floor_fast": 15.0, "plan_floor_fast": 25.0,
                           "tf1_jobs": [1.0, 2.0, 3.0, 4.0], "tf1_fast_jobs": [1.0, 1.0, 1.0, 1.0],
                           "tf2_jobs": [1.0, 1.0, 1.0],
                           "load": (1.0, 1.5), "verdict": "Verdict: EQUIVALENT (8 passed)",
                           "check_cpu": 45.0, "plan_cpu_fast": 30.0, "side_by_side": 24.0,
                           "side_by_side_cpu": 40.0, "check_cold": 36.0, "check_cold_cpu": 48.0,
                           "verdict_cold": "Verdict: EQUIVALENT (8 passed)"})
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:14] == ["net", "30.0", "10.0", "3.00x", "20.0", "1.50x", "15.0", "2.00x", "25.0", "1.20x",
                          "24.0", "1.25x", "36.0", "1.50x"]
    assert cells[14] == "1.0 + 2.0 + 3.0 + 4.0" and cells[15] == "1.0 + 1.0 + 1.0 + 1.0"
    assert cells[17] == "45.0 / 30.0 (1.50x)" and cells[18] == "45.0 / 40.0 (1.12x)"
    assert cells[-1] == "Verdict: EQUIVALENT (8 passed)"
    assert len(cells) == check_floor.HEADER.splitlines()[0].count("|") - 1


def test_a_row_says_when_the_two_checks_verdicts_differ():
    fields = {"model": "net", "check": 30.0, "floor": 10.0, "plan_floor": 20.0, "floor_fast": 15.0,
              "plan_floor_fast": 25.0, "tf1_jobs": [1.0], "tf1_fast_jobs": [1.0], "tf2_jobs": [1.0],
              "load": (1.0, 1.5), "verdict": "Verdict: EQUIVALENT (8 passed)", "check_cpu": 45.0,
              "plan_cpu_fast": 30.0, "side_by_side": 24.0, "side_by_side_cpu": 40.0, "check_cold": 36.0,
              "check_cold_cpu": 48.0, "verdict_cold": "Verdict: NOT EQUIVALENT: gradients"}
    cells = [c.strip() for c in check_floor.row(fields).strip("|").split("|")]
    assert cells[-1] == "Verdict: EQUIVALENT (8 passed) (started inside: Verdict: NOT EQUIVALENT: gradients)"


def test_a_failing_child_stops_the_benchmark_with_its_error():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit('no such model')"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match="the check of x failed .exit 1.:\nno such model"):
        check_floor._result(proc, "the check of x")


# A stand-in for a side-by-side floor process: ready at once; a job named
# "wait" ends only once the file the job named "signal" writes is there.
_FAKE_SERVER = (
    "import os, sys, time\n"
    "flag = sys.argv[1]\n"
    "print('READY', flush=True)\n"
    "for line in sys.stdin:\n"
    "    job = line.strip()\n"
    "    if job == 'signal':\n"
    "        open(flag, 'w').close()\n"
    "    while job == 'wait' and not os.path.exists(flag):\n"
    "        time.sleep(0.01)\n"
    "    print('DONE 0.5 0.25', flush=True)\n")


def _fake_servers(count: int, flag) -> list:
    return [subprocess.Popen([sys.executable, "-c", _FAKE_SERVER, str(flag)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
            for _ in range(count)]


def test_side_by_side_hands_each_job_in_order_to_whichever_process_is_free(tmp_path):
    """Jobs go in order, each to the first process free: while the first process
    runs the first job (which cannot end before the last job has run), the second
    takes every other one; each job's time and CPU seconds are the process's."""
    result = check_floor.side_by_side(_fake_servers(2, tmp_path / "flag"), jobs=("wait", "b", "c", "signal"))
    assert sorted(result["jobs"]) == [("b", 1, 0.5), ("c", 1, 0.5), ("signal", 1, 0.5), ("wait", 0, 0.5)]
    assert [job for job, _, _ in result["jobs"]][-1] == "wait" and result["cpu"] == 1.0


def test_side_by_side_stops_with_the_error_of_a_process_that_ends():
    dead = subprocess.Popen([sys.executable, "-c", "import sys; print('READY', flush=True); sys.exit('broken')"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            bufsize=1)
    with pytest.raises(RuntimeError, match="a side-by-side floor process ended .exit 1.:\nbroken"):
        check_floor.side_by_side([dead], jobs=("a_0.1",))


def test_a_serving_process_runs_each_named_job_of_the_check(monkeypatch):
    """The six jobs are the check's: the pair's TF1 half builds two graphs (its
    inference graph run twice), each num_random_ops TF1 pass one graph; the
    pair's TF2 half one layer, each num_random_ops TF2 pass one more."""
    import io

    graphs, layers, real_graph = [], [], tf.Graph

    def recording_graph():
        graphs.append(real_graph())
        return graphs[-1]

    def recording_layer():
        layers.append(_shim())
        return layers[-1]
    monkeypatch.setattr(tf, "Graph", recording_graph)
    out = io.StringIO()
    check_floor.serve_jobs(_shim().tf1_fn, recording_layer, X, stdin=io.StringIO(
        "\n".join(check_floor.SIDE_BY_SIDE_JOBS) + "\n"), stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "READY" and len(lines) == 7
    assert all(line.startswith("DONE ") and float(line.split()[1]) > 0 for line in lines[1:])
    assert len(graphs) == 4 and len(layers) == 3
    with pytest.raises(ValueError, match="job: expected one of"):
        check_floor.run_job("tf3_pair", _shim().tf1_fn, _shim, X)
