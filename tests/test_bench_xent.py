"""benchmarks/bench_xent.py's issue-38 summary: the step / exp verdicts and
the 1 -> 2 thread scaling are computed from the rows of one run, per dtype
target, and say "missed" when a ratio is over (or under) its target."""

import equivtool  # noqa: F401  (must precede TensorFlow)

import pytest

from benchmarks import bench_xent


def _row(threads, dtype, step, exp):
    return {"threads": threads, "shape": "[8192, 1000]", "dtype": dtype,
            "ours_step": step, "exp": exp}


def test_floor_summary_applies_each_dtypes_target_and_the_scaling_target():
    rows = [_row(1, "float32", 14.0, 10.0), _row(2, "float32", 7.0, 5.0),
            _row(1, "float16", 19.0, 10.0), _row(2, "float16", 12.0, 5.0)]
    f32, f16 = bench_xent.floor_summary(rows)
    assert "float32 step/exp 1.40x (met <= 1.5x), 1->2 threads 2.00x (met >= 1.8x)" in f32
    assert "float16 step/exp 1.90x (met <= 2x), 1->2 threads 1.58x (missed >= 1.8x)" in f16


def test_floor_summary_says_missed_over_the_target():
    # the planted fault: a float32 step just over 1.5x the floor
    (text,) = bench_xent.floor_summary([_row(1, "float32", 15.1, 10.0)])
    assert "step/exp 1.51x (missed <= 1.5x)" in text and "threads" not in text


def test_floor_summary_of_no_one_thread_rows_is_empty():
    assert bench_xent.floor_summary([_row(2, "float32", 7.0, 5.0)]) == []


def test_cpu_text_names_the_model_and_its_vector_extensions():
    machine = {"cpu": "Intel(R) Xeon(R) Processor", "avx512f": True,
               "amx": ["amx_bf16", "amx_int8", "amx_tile"]}
    assert bench_xent._cpu_text(machine) == (
        "Intel(R) Xeon(R) Processor (avx512f: yes; amx: amx_bf16, amx_int8, amx_tile)")
    assert bench_xent._cpu_text({"cpu": "AMD EPYC", "avx512f": False, "amx": []}) == (
        "AMD EPYC (avx512f: no; amx: no AMX)")


def test_floor_summary_adds_the_cpu_time_ratio_when_measured():
    row = dict(_row(1, "float32", 14.0, 10.0), cpu_ours_step=9.0, cpu_exp=6.0)
    (text,) = bench_xent.floor_summary([row])
    assert "step/exp 1.40x (met <= 1.5x) (CPU time 1.50x)" in text
    # rows without CPU times (an older run's JSON) say nothing about it
    (text,) = bench_xent.floor_summary([_row(1, "float32", 14.0, 10.0)])
    assert "CPU time" not in text


def test_interleaved_medians_time_wall_and_cpu():
    calls = []
    medians = bench_xent._interleaved_medians({"a": lambda: calls.append(1)}, repeats=3, inner=2)
    assert set(medians) == {"a", "cpu_a"} and len(calls) == 1 + 3 * 2
    assert medians["a"] >= 0 and medians["cpu_a"] >= 0


def test_render_reads_this_librarys_machine_description():
    # the table's text is built from _machine() as it is now (a key the op's status no
    # longer has once broke the whole run after its timings)
    machine = bench_xent._machine()
    row = {"threads": 1, "shape": "[8192, 1000]", "dtype": "float32", "tf_fwd": 2.0, "ours_fwd": 1.0,
           "tf_step": 6.0, "ours_step": 2.0, "copy": 1.0, "exp": 1.5}
    memory = {"tf": 3 * 2**20, "ours": 2**20}
    text = bench_xent.render([row], memory, machine, (0.1, 0.2, 0.3))
    assert f"GPU kernels: {machine['op']['gpu_kernels']}" in text and "| 1 | [8192, 1000] | float32 |" in text


def test_rounds_combine_into_medians_and_each_rounds_scaling_is_shown():
    rounds = [[_row(1, "float32", 14.0, 10.0), _row(2, "float32", 7.0, 5.0)],
              [_row(1, "float32", 16.0, 10.0), _row(2, "float32", 10.0, 6.0)],
              [_row(1, "float32", 15.0, 11.0), _row(2, "float32", 8.0, 5.0)]]
    one, two = bench_xent.combine_rounds(rounds)
    assert (one["ours_step"], one["exp"], two["ours_step"], two["exp"]) == (15.0, 10.0, 8.0, 5.0)
    assert one["round_ours_step"] == [14.0, 16.0, 15.0]
    (text,) = bench_xent.floor_summary([one, two])
    # the ratio of the medians decides; each round's own ratio is shown beside it
    assert "1->2 threads 1.88x (met >= 1.8x) (rounds: 2.00x, 1.60x, 1.88x)" in text


def test_a_single_round_shows_no_rounds():
    one, two = bench_xent.combine_rounds([[_row(1, "float32", 14.0, 10.0),
                                           _row(2, "float32", 8.0, 5.0)]])
    (text,) = bench_xent.floor_summary([one, two])
    assert "1->2 threads 1.75x (missed >= 1.8x)" in text and "rounds" not in text


def test_kernel_scaling_is_shown_beside_the_whole_steps():
    one = dict(_row(1, "float32", 6.5, 4.7), kernel_ours_step=5.9, kernel_exp=4.2)
    two = dict(_row(2, "float32", 3.7, 2.7), kernel_ours_step=3.1, kernel_exp=2.3)
    (text,) = bench_xent.floor_summary([one, two])
    assert ("1->2 threads 1.76x (missed >= 1.8x); its kernels alone 1.90x (met >= 1.8x; "
            "Exp's kernel 1.83x)") in text


def _space(events):
    """An XSpace holding one line of (name, duration in ms) events."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add()
    line = plane.lines.add()
    for i, (name, ms) in enumerate(events):
        plane.event_metadata[i + 1].name = name
        line.events.add(metadata_id=i + 1, duration_ps=int(ms * 1e9))
    return space


def test_trace_kernels_sum_each_op_types_median_and_need_one_event_per_call():
    step = [("xent/EquivtoolSparseXentStep:EquivtoolSparseXentStep", ms) for ms in (5.0, 6.0, 9.0)]
    grad = [("EquivtoolSparseXentStepGrad:EquivtoolSparseXentStepGrad", 0.01)] * 3
    exp = [("Exp:Exp", ms) for ms in (4.0, 4.5, 4.2)]
    other = [("ExecutorState::Process", 50.0)] * 3
    got = bench_xent._trace_kernel_ms(_space(step + grad + exp + other), ["ours_step", "exp"], 3)
    assert got == pytest.approx({"ours_step": 6.01, "exp": 4.2})
    # an event missing (or one too many) for a call: no figure, not a wrong one
    got = bench_xent._trace_kernel_ms(_space(step[:2] + grad + exp), ["ours_step", "exp"], 3)
    assert set(got) == {"exp"}
    assert bench_xent._trace_kernel_ms(_space(other), ["ours_step", "exp"], 3) == {}


def test_a_round_without_kernel_figures_leaves_the_others_to_decide():
    # the profiler wrote no trace in one round: its kernel figure is missing, not a KeyError
    rounds = [[dict(_row(1, "float32", 14.0, 10.0), kernel_ours_step=5.0)],
              [_row(1, "float32", 16.0, 10.0)],
              [dict(_row(1, "float32", 15.0, 11.0), kernel_ours_step=7.0)]]
    (one,) = bench_xent.combine_rounds(rounds)
    assert one["ours_step"] == 15.0 and one["kernel_ours_step"] == 6.0


def test_graph_loop_scaling_is_shown_per_step_against_the_target():
    one = dict(_row(1, "float32", 6.5, 4.7), ours_loop=5.9, exp_loop=4.4)
    two = dict(_row(2, "float32", 3.7, 2.7), ours_loop=3.2, exp_loop=2.4)
    (text,) = bench_xent.floor_summary([one, two])
    assert ("10 steps per call in a graph loop 5.90 -> 3.20 ms a step, 1.84x (met >= 1.8x; "
            "exp's 1.83x)") in text
    # the planted fault: a loop that scales less says so
    two["ours_loop"] = 3.4
    (text,) = bench_xent.floor_summary([one, two])
    assert "1.74x (missed >= 1.8x" in text
    # rows from a run without the loop timings say nothing about them
    (text,) = bench_xent.floor_summary([_row(1, "float32", 6.5, 4.7), _row(2, "float32", 3.7, 2.7)])
    assert "graph loop" not in text


def test_loop_timings_are_per_step():
    got = bench_xent._per_step({"ours_loop": 60.0, "cpu_ours_loop": 50.0, "exp_loop": 40.0,
                                "ours_step": 6.5, "cpu_ours_step": 6.0})
    n = bench_xent.LOOP_STEPS
    assert got == {"ours_loop": 60.0 / n, "cpu_ours_loop": 50.0 / n, "exp_loop": 40.0 / n,
                   "ours_step": 6.5, "cpu_ours_step": 6.0}


def test_the_graph_loop_runs_every_step_with_the_fused_gradient():
    # each of the loop's steps runs the op's gradient (the forward's buffer
    # handed on, as in the Python-called step), not one step for all
    import numpy as np
    import tensorflow as tf

    from equivtool import ops
    from equivtool.ops._cpu_path import step_calls

    x = tf.constant(np.random.default_rng(0).standard_normal((16, 5)), tf.float32)
    y = tf.constant([1, 2, 3, 4] * 4)
    _, step, steps = bench_xent._functions(tf, ops.sparse_softmax_cross_entropy_with_logits, x, y)
    want = step()
    before = step_calls().handed_on
    loss, grad = steps()
    assert step_calls().handed_on - before == bench_xent.LOOP_STEPS
    assert loss.numpy() == want[0].numpy() and np.array_equal(grad.numpy(), want[1].numpy())
    exp = bench_xent._exp_steps(tf, x)()
    assert np.array_equal(exp.numpy(), tf.exp(x).numpy())
