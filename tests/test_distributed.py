"""check_equivalence with the TF2 side under tf.distribute strategies.

Each run is a separate process: logical devices and the multi-worker cluster
must be configured before TensorFlow initialises its runtime, which the test
process has already done.
"""

import json
import os
import socket
import subprocess
import sys
import time


HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "distributed_worker.py")
TIMEOUT = 300


def free_ports(count: int) -> list:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def worker_env(tf_config=None) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def load_report(path) -> dict:
    with open(path) as handle:
        return json.load(handle)


def assert_distributed_report(report: dict) -> None:
    status = {step["name"]: step["status"] for step in report["steps"]}
    for name in ("variables_once", "parity", "fixed_weights", "random/constant/inference",
                 "gradients", "optimizer"):
        assert status[name] == "passed", (name, status)
    assert status["random/constant/training"] == "skipped"  # per-replica batch statistics, by design
    assert "2 replicas" in report["meta"]["strategy"]


def test_mirrored_strategy_on_two_logical_cpus_matches_single_device_tf1(tmp_path):
    out = tmp_path / "mirrored.json"
    result = subprocess.run([sys.executable, WORKER, "mirrored", str(out)], env=worker_env(),
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = load_report(out)
    assert_distributed_report(report)
    assert "MirroredStrategy" in report["meta"]["strategy"]


def test_multi_worker_mirrored_strategy_over_two_processes_matches_single_process_tf1(tmp_path):
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes, outputs = [], []
    started = time.monotonic()
    try:
        for index in range(2):
            out = tmp_path / f"worker{index}.json"
            outputs.append(out)
            config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            processes.append(subprocess.Popen(
                [sys.executable, WORKER, "multiworker", str(out)], env=worker_env(config),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = []
        for process in processes:
            remaining = max(1.0, TIMEOUT - (time.monotonic() - started))
            log, _ = process.communicate(timeout=remaining)
            logs.append(log)
    finally:
        for process in processes:  # never leave a worker behind, whatever happened
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, log in zip(processes, logs):
        assert process.returncode == 0, log[-4000:]
    for out in outputs:
        report = load_report(out)
        assert_distributed_report(report)
        # tf.distribute.MultiWorkerMirroredStrategy's class is CollectiveAllReduceStrategy
        assert report["meta"]["strategy"].startswith("CollectiveAllReduceStrategy")
    print(f"multi-worker check took {time.monotonic() - started:.1f}s")
