"""The pytest plugin changes nothing in a test suite that does not use it.

Each case runs pytest in a fresh subprocess on a small suite written to a
temporary folder, with plugin autoloading off and the plugin named with ``-p``
exactly as the ``pytest11`` entry point in setup.cfg names it. The child tests
write what they observe to a JSON file; the assertions are made here.
"""

import configparser
import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _entry_point_module() -> str:
    config = configparser.ConfigParser()
    config.read(os.path.join(REPO, "setup.cfg"))
    entries = config["options.entry_points"]["pytest11"].strip().splitlines()
    (entry,) = [line for line in entries if line.strip()]
    name, module = (part.strip() for part in entry.split("="))
    assert name == "equivtool"
    return module


PROBE = '''
import json, os, sys

def observe(path):
    finders = [type(f).__module__ + "." + type(f).__qualname__ for f in sys.meta_path]
    heavy = sorted(m for m in sys.modules
                   if m.split(".")[0] in ("tensorflow", "tf_keras", "keras", "tf_slim")
                   or (m.split(".")[0] == "equivtool"))
    with open(path, "w") as f:
        json.dump({"legacy_keras": os.environ.get("TF_USE_LEGACY_KERAS"),
                   "finders": finders, "heavy": heavy}, f)
'''


def _run_suite(tmp_path, plugin: str, test_source: str, *extra_args: str):
    (tmp_path / "probe.py").write_text(PROBE)
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(test_source))
    env = dict(os.environ)
    env.pop("TF_USE_LEGACY_KERAS", None)  # this process imported equivtool
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # only the plugin named below
    env["PYTHONPATH"] = REPO
    env["OBSERVED"] = str(tmp_path / "observed.json")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", plugin, "-p", "no:cacheprovider", "-q",
         "test_suite.py", *extra_args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    observed = None
    if (tmp_path / "observed.json").exists():
        observed = json.loads((tmp_path / "observed.json").read_text())
    return result, observed


UNRELATED = '''
import os
from probe import observe

def test_unrelated():
    observe(os.environ["OBSERVED"])
'''


def test_entry_point_names_a_module_outside_the_package():
    assert not _entry_point_module().startswith("equivtool")


def test_unrelated_suite_sees_no_trace_of_equivtool(tmp_path):
    result, observed = _run_suite(tmp_path, _entry_point_module(), UNRELATED)
    assert result.returncode == 0, result.stdout + result.stderr
    assert observed["legacy_keras"] is None
    assert not [f for f in observed["finders"] if "equivtool" in f]
    assert observed["heavy"] == []


def test_probe_sees_what_importing_equivtool_changes(tmp_path):
    # The control: the same probe in a suite that imports equivtool itself.
    result, observed = _run_suite(tmp_path, _entry_point_module(), '''
        import os
        import equivtool
        from probe import observe

        def test_imports_equivtool():
            observe(os.environ["OBSERVED"])
    ''')
    assert result.returncode == 0, result.stdout + result.stderr
    assert observed["legacy_keras"] == "1"
    assert "equivtool._platform.env._LegacyLayersAliasFinder" in observed["finders"]
    assert "equivtool" in observed["heavy"]


def test_plugin_registers_no_markers(tmp_path):
    # With --strict-markers an unregistered marker is an error, with or without the plugin.
    result, _ = _run_suite(tmp_path, _entry_point_module(), '''
        import pytest

        @pytest.mark.slow
        def test_marked():
            pass
    ''', "--strict-markers")
    assert result.returncode != 0
    assert "'slow' not found in `markers` configuration option" in result.stdout + result.stderr


FIXTURE_USER = '''
import os
import numpy as np
from probe import observe

def test_fixtures_work(random_tool, tf1_session):
    import tensorflow as tf
    import tf_keras
    assert tf.keras.layers.Dense is tf_keras.layers.Dense  # legacy Keras was selected
    assert tf.compat.v1.get_default_graph() is tf1_session.graph
    first, second = random_tool(mode="num_random_ops"), random_tool(mode="num_random_ops")
    assert first is not second and first.mode == "num_random_ops" and first.seed == 42
    with first.scope():
        graph_value = tf1_session.run(tf.random.uniform([3]))
    with second.scope(), tf.Graph().as_default(), tf.compat.v1.Session() as other:
        other_value = other.run(tf.random.uniform([3]))
    np.testing.assert_array_equal(graph_value, other_value)
    observe(os.environ["OBSERVED"])
'''


@pytest.mark.parametrize("plugin", ["entry point", "equivtool.pytest_plugin"])
def test_requesting_a_fixture_imports_equivtool_and_works(tmp_path, plugin):
    plugin = _entry_point_module() if plugin == "entry point" else plugin
    result, observed = _run_suite(tmp_path, plugin, FIXTURE_USER)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout
    assert observed["legacy_keras"] == "1"
    assert "equivtool.seeding" in observed["heavy"] and "tensorflow" in observed["heavy"]


def test_tf1_session_fixture_closes_its_session(tmp_path):
    result, _ = _run_suite(tmp_path, _entry_point_module(), '''
        import pytest

        SESSIONS = []

        def test_open(tf1_session):
            SESSIONS.append(tf1_session)
            assert not tf1_session._closed

        def test_closed_after():
            assert SESSIONS and SESSIONS[0]._closed
    ''')
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout
