"""The one error of equivtool's exported-model comparison, and how its messages are kept to one line."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """A path, model, signature or input that cannot be used: one line (exit code 2)."""


def short(exc: BaseException, limit: int = 300) -> str:
    """``exc``'s message on one line, at most ``limit`` characters."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."
