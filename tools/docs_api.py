"""mkdocs hook: the API reference page, written from ``equivtool``'s public names.

``docs/api.md`` holds a marker line; at build time it is replaced by one
mkdocstrings directive per name of ``equivtool.__all__``, pointing at the module
that defines it (``equivtool._EXPORTS``, the lazy facade's own table), grouped
by that module. The page therefore follows the facade: a name added to
``__all__`` appears without editing the page, and a name whose module or
docstring cannot be found fails the strict build instead of being left out.
Importing ``equivtool`` does not import TensorFlow, so the hook costs nothing.
"""

from __future__ import annotations

MARKER = "<!-- api: equivtool.__all__ -->"


def api_markdown() -> str:
    """The directives for every public name, one section per defining module."""
    import equivtool

    by_module: dict = {}
    for name in equivtool.__all__:
        if name.startswith("__"):
            continue  # __version__: a string, stated on the page
        module = equivtool._EXPORTS.get(name)
        if module is None:
            raise ValueError(f"equivtool.__all__: {name!r} has no module in equivtool._EXPORTS")
        by_module.setdefault(module, []).append(name)
    parts = []
    for module in sorted(by_module):
        parts.append(f"## `equivtool.{module}`\n")
        for name in by_module[module]:
            parts.append(f"::: equivtool.{_defining(module, name)}.{name}\n")
    return "\n".join(parts)


def _defining(module: str, name: str) -> str:
    """Where ``name`` is defined: ``module``, or, for a package that is itself a lazy
    facade (its own ``_EXPORTS``, read without importing what it names), the
    module that table names, so the reference reads the code without running it."""
    import importlib
    package = importlib.import_module(f"equivtool.{module}")
    inner = getattr(package, "_EXPORTS", {}).get(name) if hasattr(package, "__path__") else None
    return f"{module}.{inner}" if inner else module


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, api_markdown())
