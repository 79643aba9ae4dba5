"""The one error of equivtool's exported-model comparison, and how its messages are kept to one line."""

from __future__ import annotations

from equivtool._base.errors import short  # noqa: F401 - the exported modules' one-line form

__all__ = ["ModelLoadError", "short"]


class ModelLoadError(ValueError):
    """A path, model, signature or input that cannot be used: one line (exit code 2)."""
