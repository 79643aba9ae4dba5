"""benchmarks/bench_xent.py's issue-38 summary: the step / exp verdicts and
the 1 -> 2 thread scaling are computed from the rows of one run, per dtype
target, and say "missed" when a ratio is over (or under) its target."""

import equivtool  # noqa: F401  (must precede TensorFlow)

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
