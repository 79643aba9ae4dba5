"""TensorFlow names as plain strings (no TensorFlow needed)."""

from __future__ import annotations

import re

_OUTPUT_INDEX = re.compile(r":\d+$")


def strip_output_index(name: str) -> str:
    """A tensor or variable name without its ``:N`` output index (``net/w:0`` -> ``net/w``)."""
    return _OUTPUT_INDEX.sub("", name)
