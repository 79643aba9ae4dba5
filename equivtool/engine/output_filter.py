"""``outputs=``: which output leaves a check compares, as include and exclude patterns.

A pattern is matched (``fnmatch``, case-sensitive; ``*`` also crosses ``/``)
against a leaf's name as the report shows it: ``end_points/<key>`` for a dict
of end points, ``outputs`` or ``outputs/<i>`` otherwise. A pattern starting
with ``!`` excludes. A leaf is compared when it matches an include pattern (or
there is none) and no exclude pattern. The same patterns apply to both sides,
before they are compared, so a left-out key is neither missing nor extra.

Published TF1 code sometimes adds end points by scanning its graph
(``net.graph.get_operations()``): such keys exist where a graph does (the TF1
side, and the TF2 side under ``tf_function=True``) and nowhere else.
:func:`one_side_note` says so when the only difference is keys on one side.
"""

from __future__ import annotations

import fnmatch
from typing import Any, Mapping, Sequence

from equivtool._base.slices import SlicesArrays

_DROPPED = object()


def check_patterns(outputs: Any) -> tuple:
    """``outputs`` as a tuple of patterns; raises naming the argument and the expected form."""
    if outputs is None:
        return ()
    if isinstance(outputs, str):
        outputs = (outputs,)
    if not isinstance(outputs, (list, tuple)) or not all(isinstance(p, str) for p in outputs):
        raise TypeError("outputs: expected a pattern or a sequence of patterns (str: 'end_points/*' includes, "
                        f"'!end_points/*depthwise_output' excludes), got {outputs!r}")
    bad = [p for p in outputs if not p.lstrip("!")]
    if bad:
        raise ValueError(f"outputs: empty pattern {bad[0]!r}; give a leaf name pattern such as 'end_points/*' "
                         "or '!end_points/*_output'")
    return tuple(outputs)


def kept(name: str, patterns: Sequence[str]) -> bool:
    """Whether the leaf called ``name`` is compared under ``patterns``."""
    includes = [p for p in patterns if not p.startswith("!")]
    excludes = [p[1:] for p in patterns if p.startswith("!")]
    if includes and not any(fnmatch.fnmatchcase(name, p) for p in includes):
        return False
    return not any(fnmatch.fnmatchcase(name, p) for p in excludes)


def _select(value: Any, name: str, patterns: Sequence[str]) -> Any:
    if isinstance(value, Mapping):
        chosen = {}
        for key, item in value.items():
            selected = _select(item, f"{name}/{key}", patterns)
            if selected is not _DROPPED:
                chosen[key] = selected
        return chosen if chosen or not value else _DROPPED
    names = _names(value, name)
    includes = [p for p in patterns if not p.startswith("!")]
    excludes = [p for p in patterns if p.startswith("!")]
    chosen = any(kept(n, includes) for n in names) and all(kept(n, excludes) for n in names)
    return value if chosen else _DROPPED


def _names(value: Any, name: str) -> list:
    """The names a leaf answers to: a tf.IndexedSlices its own and its compared leaf's
    (``<name>/dense``, see equivtool.comparison._slices)."""
    return [name, f"{name}/dense"] if isinstance(value, SlicesArrays) else [name]


def select(expected: Any, actual: Any, label: str, patterns: Sequence[str]) -> tuple | None:
    """``(expected, actual)`` with the leaves the patterns leave out removed from
    both (dict entries; a list or array is kept or dropped whole); ``None`` when
    nothing of this part is left."""
    if not patterns:
        return expected, actual
    expected, actual = _select(expected, label, patterns), _select(actual, label, patterns)
    if expected is _DROPPED and actual is _DROPPED:
        return None
    return ({} if expected is _DROPPED else expected), ({} if actual is _DROPPED else actual)


def leaf_names(value: Any, name: str) -> list:
    """The leaf names the patterns are matched against (as :func:`select` walks ``value``)."""
    if isinstance(value, Mapping):
        return [leaf for key, item in value.items() for leaf in leaf_names(item, f"{name}/{key}")]
    return _names(value, name)


def unmatched_note(names: Sequence[str], patterns: Sequence[str]) -> str | None:
    """A note naming the patterns that match none of ``names`` (a typo, or a name
    the report spells otherwise); ``None`` when each matches some leaf."""
    unmatched = [p for p in patterns if not any(kept(n, (p.lstrip("!"),)) for n in names)]
    if not unmatched:
        return None
    shown = ", ".join(sorted(set(names))[:6]) + (", ..." if len(set(names)) > 6 else "")
    return (f"outputs: pattern{'s' if len(unmatched) > 1 else ''} {', '.join(repr(p) for p in unmatched)} "
            f"match{'' if len(unmatched) > 1 else 'es'} no output leaf, so {'they select' if len(unmatched) > 1 else 'it selects'} "
            f"nothing; the leaves are named {shown} (CLI: --outputs)")


def one_side_note(leaves: Sequence, tf_function: bool) -> str | None:
    """A note when keys are missing on one side: they may be end points one side
    collects by scanning its graph."""
    missing = [leaf.name for leaf in leaves if leaf.missing_in_actual]
    extra = [leaf.name for leaf in leaves if leaf.missing_in_expected]
    if not missing and not extra:
        return None
    names = (missing or extra)[:3]
    side, other = ("TF1", "TF2") if missing else ("TF2", "TF1")
    mode = ("" if tf_function else
            "; eagerly the TF2 side has no graph to scan: pass tf_function=True (CLI: --tf-function)")
    tail = names[0].rsplit("/", 1)[-1]
    return (f"keys only on the {side} side ({len(missing or extra)}, e.g. {', '.join(names)}): if the model "
            f"collects these end points by scanning its graph (graph.get_operations()), they exist only where "
            f"a graph is built{mode}; or leave them out on both sides with outputs=['!*/{tail}'] "
            f"(CLI: --outputs '!*/{tail}')")
