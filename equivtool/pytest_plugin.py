"""equivtool's pytest fixtures, for suites that name the plugin explicitly.

The installed plugin is the top-level module ``_equivtool_pytest_plugin``
(registered through the ``pytest11`` entry point), which imports nothing of
equivtool until a test requests one of its fixtures. Importing this module
instead imports the ``equivtool`` package and so applies its environment fix
(legacy Keras, the tf-slim import alias) at once; use it as
``pytest_plugins = ["equivtool.pytest_plugin"]`` where that is wanted, or
where equivtool is on the path without being installed.
"""

from __future__ import annotations

from _equivtool_pytest_plugin import random_tool, tf1_session  # noqa: F401

__all__ = ["random_tool", "tf1_session"]
