"""Tolerances given on a command line: ``--atol [OUTPUT:]VALUE`` and ``--rtol [OUTPUT:]VALUE``,
each repeatable, as one tolerance spec (``equivtool check`` and ``equivtool compare``)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from equivtool.comparison import Tolerance


def tolerance_spec(atol, rtol) -> dict:
    """``--atol [OUT:]V`` / ``--rtol [OUT:]V`` (floats, lists of strings or mappings) ->
    a tolerance spec: output name or pattern -> Tolerance, ``"*"`` the default (the
    guide's, where no ``*`` value is given). A value that is not a finite number >= 0
    is a ``ValueError`` naming the argument."""
    def collect(value, argument):
        if value is None:
            return {}
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = {"*": value}
        elif isinstance(value, str):
            value = [value]
        if isinstance(value, Mapping):
            items = [(str(k), v) for k, v in value.items()]
        else:
            items = []
            for text in value:
                name, _, number = str(text).rpartition(":")
                items.append((name or "*", number))
        result = {}
        for name, text in items:
            where = name + ":" if name != "*" else ""
            try:
                number = float(text)
            except (TypeError, ValueError):
                raise ValueError(f"{argument}: not a number: {str(text)!r}" + (f" (in {where}{text})" if where
                                 else "") + "; expected [OUTPUT:]VALUE with VALUE a finite number >= 0") from None
            if not np.isfinite(number) or number < 0:
                raise ValueError(f"{argument}: expected [OUTPUT:]VALUE with VALUE a finite number >= 0, "
                                 f"got {where}{number}")
            result[name] = number
        return result

    atols, rtols = collect(atol, "--atol"), collect(rtol, "--rtol")
    default = Tolerance(rtol=rtols.get("*", Tolerance().rtol), atol=atols.get("*", Tolerance().atol))
    spec = {name: Tolerance(rtol=rtols.get(name, default.rtol), atol=atols.get(name, default.atol))
            for name in (set(atols) | set(rtols)) - {"*"}}
    spec["*"] = default
    return spec
