"""The parity benchmark's harness: option checks, process-tree memory, and the guide baseline.

The benchmark itself is not a test (it prints timings); these tests check the
parts whose failure would make its figures wrong: bad options are refused
before any run, the memory of worker processes is counted, and the guide's
code fails when a comparison fails or when it compared less than it should.
"""

import os
import subprocess
import sys

import pytest

from benchmarks import _guide_steps, bench_parity

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _args(*argv):
    return bench_parity.build_parser().parse_args(list(argv))


@pytest.mark.parametrize("argv, message", [
    (["--variants", "guide,nope"], "--variants: expected distinct comma-separated names"),
    (["--variants", "guide,guide"], "--variants: expected distinct comma-separated names"),
    (["--steps", "parity,nope"], "--steps: expected distinct comma-separated names"),
    (["--image-size", "75"], "--image-size: expected an int >= 107, got 75"),
    (["--batch-size", "0"], "--batch-size: expected an int >= 1, got 0"),
    (["--repeats", "0"], "--repeats: expected an int >= 1, got 0"),
    (["--workers", "0"], "--workers: expected an int >= 1 or distinct comma-separated ints, got 0"),
    (["--workers", "2", "--variants", "guide,plain"], "--workers: applies to the equivtool variant"),
])
def test_bad_options_are_refused_naming_the_option(argv, message):
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        bench_parity.check_args(_args(*argv))


def test_defaults_run_three_variants_on_the_guides_steps():
    args = _args()
    assert bench_parity.check_args(args) == ("guide", "equivtool", "plain")
    assert tuple(args.steps.split(",")) == ("variables_once", "parity", "fixed_weights", "random")
    assert "--workers" not in bench_parity.child_argv("equivtool", args)


def test_workers_is_passed_only_where_parity_run_takes_it(monkeypatch):
    from examples.inception_resnet_v2 import parity

    def run_without_workers(image_size=299, batch_size=1, num_classes=1000, steps=(), modes=(), progress=None):
        raise AssertionError("not called")

    def run_with_workers(image_size=299, batch_size=1, num_classes=1000, steps=(), modes=(), progress=None,
                         workers=1):
        raise AssertionError("not called")

    monkeypatch.setattr(parity, "run", run_without_workers)
    with pytest.raises(ValueError, match="--workers: this equivtool has no workers="):
        bench_parity.check_args(_args("--workers", "2"))
    monkeypatch.setattr(parity, "run", run_with_workers)
    args = _args("--workers", "2")
    assert bench_parity.check_args(args) == ("guide", "equivtool", "plain")
    argv = bench_parity.child_argv("equivtool", args)
    assert argv[argv.index("--workers") + 1] == "2"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the tree sampler reads /proc (Linux)")
def test_tree_memory_adds_every_descendants_peak():
    mib = 64
    code = (f"import sys; x = bytearray({mib} * 2**20); x[::4096] = b'1' * len(x[::4096]); "
            "print('ready', flush=True); sys.stdin.read()")
    with bench_parity.TreeMemory(interval=60) as tree:  # sampled by hand below, while both children hold memory
        children = [subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True) for _ in range(2)]
        try:
            for child in children:
                assert child.stdout.readline().strip() == "ready"
            tree.sample()
        finally:
            for child in children:
                child.stdin.close()
                child.wait()
                child.stdout.close()
    peaks = [tree.peak_kib.get(child.pid, 0) / 1024 for child in children]
    assert all(peak >= mib for peak in peaks), peaks
    assert tree.peak_total_kib / 1024 >= 2 * mib
    if tree.smaps:  # beside RSS: each child's own pages are private, and in the summed PSS
        private = [tree.peak_private_kib.get(child.pid, 0) / 1024 for child in children]
        assert all(p >= mib for p in private), private
        assert tree.peak_total_pss_kib / 1024 >= 2 * mib
        assert tree.peak_total_private_kib / 1024 >= 2 * mib


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="PSS is read from smaps_rollup (Linux 4.14+)")
def test_tree_memory_counts_pages_two_processes_share_once_in_pss():
    """A process that fills 64 MiB then forks: both map the same pages (copy on
    write), so each one's RSS counts them whole and their PSS only half each."""
    mib = 64
    code = (f"import os, sys; x = bytearray({mib} * 2**20); x[::4096] = b'1' * len(x[::4096]); "
            "pid = os.fork()\n"
            "if pid == 0:\n    sys.stdin.read(); os._exit(0)\n"
            "print('ready', pid, flush=True); os.waitpid(pid, 0)")
    with bench_parity.TreeMemory(interval=60) as tree:
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        try:
            ready, forked = child.stdout.readline().split()
            assert ready == "ready"
            tree.sample()
        finally:
            child.stdin.close()
            child.wait()
            child.stdout.close()
    pair = (child.pid, int(forked))
    rss = sum(tree.peak_kib[pid] for pid in pair) / 1024
    pss = sum(tree.peak_pss_kib[pid] for pid in pair) / 1024
    private = sum(tree.peak_private_kib[pid] for pid in pair) / 1024
    assert rss >= 2 * mib, rss
    assert pss <= rss - mib / 2, (pss, rss)  # the shared 64 MiB counted once, not twice
    assert pss >= mib, pss
    assert private < mib, private  # neither holds them alone


def test_tree_memory_without_descendants_records_none():
    with bench_parity.TreeMemory(interval=60) as tree:
        pass
    assert tree.peak_kib == {}
    assert set(tree.peak_pss_kib) <= {os.getpid()}


def test_a_guide_run_that_compared_less_fails():
    _guide_steps.require_all_assertions(_guide_steps.expected_assertions(False), False)
    _guide_steps.require_all_assertions(14, True)
    with pytest.raises(AssertionError, match="made 6 assertions, expected 12"):
        _guide_steps.require_all_assertions(6, False)
    with pytest.raises(AssertionError, match="made 12 assertions, expected 14"):
        _guide_steps.require_all_assertions(12, True)


def _run(argv):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env)


# The guide baseline is the benchmark's, not the product's: each run builds the model
# 5 times (about 2.5 min here), and every benchmark run exercises it again.
_BENCH = pytest.mark.skipif(os.environ.get("EQUIVTOOL_BENCH_TESTS") != "1",
                            reason="benchmark baseline runs only with EQUIVTOOL_BENCH_TESTS=1 (minutes each; "
                                   "benchmarks/bench_parity.py runs the same code)")


@pytest.mark.slow
@_BENCH
def test_guide_variant_passes_with_every_assertion():
    # A process of its own: the guide sets Grappler options process-wide.
    proc = _run([sys.executable, "benchmarks/bench_parity.py", "--image-size", "107", "--variants", "guide"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    row = next(line.split() for line in proc.stdout.splitlines() if line.split()[:2] == ["1", "guide"])
    assert row[11] == str(_guide_steps.NOTEBOOK_ASSERTIONS)  # the checks column


@pytest.mark.slow
@_BENCH
def test_guide_fails_when_the_tf2_side_differs():
    # Planted fault: the TF2 layer's weight decay differs, so step 3's regularization
    # losses differ (its assert_allclose with rtol=1e-06 is the only one with that tolerance).
    code = ("import equivtool\n"
            "from examples.inception_resnet_v2 import keras_shim\n"
            "real = keras_shim.make_shim\n"
            "keras_shim.make_shim = lambda n, **kw: real(n, **dict(kw, weight_decay=4e-4))\n"
            "from benchmarks._guide_steps import run_guide\n"
            "print('RESULT', run_guide(107, 1))\n")
    proc = _run([sys.executable, "-c", code])
    assert proc.returncode != 0 and "RESULT" not in proc.stdout, proc.stdout[-2000:]
    assert "AssertionError" in proc.stderr and "rtol=1e-06" in proc.stderr, proc.stderr[-4000:]


def test_a_list_of_worker_counts_runs_equivtool_once_per_count():
    args = _args("--workers", "1,2")
    assert bench_parity.check_args(args) == ("guide", "equivtool@1", "equivtool@2", "plain")
    argv = bench_parity.child_argv("equivtool@2", args)
    assert argv[argv.index("--child") + 1] == "equivtool" and argv[argv.index("--workers") + 1] == "2"
    single = _args("--workers", "2")
    assert bench_parity.check_args(single) == ("guide", "equivtool", "plain")
    assert "2" == bench_parity.child_argv("equivtool", single)[-1]


def test_scaling_prediction_reads_the_critical_path_off_the_jobs():
    jobs = [{"side": "tf1", "steps": ["variables_once"], "seconds": 30.0},
            {"side": "tf2", "steps": ["variables_once"], "seconds": 20.0},
            {"side": "tf1", "steps": ["random/num_random_ops/inference"], "seconds": 10.0},
            {"side": "tf2", "steps": ["random/num_random_ops/inference"], "seconds": 10.0}]
    runs = {"equivtool@1": [{"seconds": 75.0}], "equivtool@2": [{"seconds": 40.0, "jobs": jobs}]}
    lines = bench_parity.scaling_lines(runs, ["equivtool@1", "equivtool@2"])
    assert lines[0] == "scaling: workers=1: 75.0 s, workers=2: 40.0 s"
    # 2 workers: max(30, 70 / 2) = 35 s of jobs, so 5 s do not shrink; 4 cores: 5 + max(30, 17.5)
    assert "critical path: 30.0 s (tf1 side of variables_once); sum of 4 jobs: 70.0 s" in lines[1]
    assert "predicted on  4 cores (workers=4): 35.0 s" in lines
    assert bench_parity.scaling_lines({"equivtool": [{"seconds": 75.0}]}, ["equivtool"]) == \
        ["scaling: workers=1: 75.0 s"]
