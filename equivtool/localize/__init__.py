"""Where the numbers part: the first TensorFlow op whose output differs between the sides.

``check_equivalence(..., localize=True)`` (or ``equivtool check --localize``)
re-runs each failing forward-pass step (``fixed_weights``, ``random/*``,
``checkpoint``; ``localize="all"``: passing ones too), from the variables the
step started from, with every op's output captured on both sides: the TF1 graph's
ops fetched from its session, the TF2 layer's ops seen by TensorFlow's op
callbacks (eagerly, or under ``tf.function``). Ops are aligned by name first
(the shim runs the same Python code, so the names under the layer's scope
agree; an outer scope is stripped only when every TF1 op is under it), then by
scope and type in order, then by type and order; a candidate further on whose
values disagree yields to an op of another type at the record's place (a
swapped op). An op that compared nothing that could differ is INCONCLUSIVE,
never a divergence. The first
aligned op in execution order whose output exceeds tolerance is reported with
both sides' op names and types, shapes, error statistics, the first
mismatching index and the source line that created it. The result is a
:class:`Localization`, plain data attached to the step as
``step.data["localization"]``; the step's own numbers and verdict are those of
the run without localization.

This package's ``result`` module is NumPy-only; the capture (TensorFlow) is
imported on first use of :func:`localize_forward`.
"""

from __future__ import annotations

from equivtool.localize.result import LOCALIZATION_STATUSES, Localization, OpError, as_localization

__all__ = ["Localization", "OpError", "LOCALIZATION_STATUSES", "LOCALIZE_CHOICES", "as_localization",
           "check_localize", "localize_forward"]


def __getattr__(name: str):
    if name == "localize_forward":
        from equivtool.localize.forward import localize_forward
        return localize_forward
    raise AttributeError(f"module 'equivtool.localize' has no attribute {name!r}")


#: The values of ``localize``: False (none), True (the failing forward-pass steps), "all" (every one).
LOCALIZE_CHOICES = (False, True, "all")


def check_localize(value) -> None:
    """Raise unless ``value`` is one of :data:`LOCALIZE_CHOICES`."""
    if not (isinstance(value, bool) or value == "all"):
        raise TypeError(f"localize: expected True (the failing forward-pass steps), 'all' (every one, passing "
                        f"ones included) or False, got {value!r}")


def localize_on_step(result, tf1_side, tf1_outputs, call_tf2, tolerance, *, state=None, strategy=None,
                     only_failed=True):
    """``result`` (a forward-pass ``StepResult``) with a :class:`Localization` in
    ``data["localization"]``; the engine's hook for ``localize=True``. With
    ``only_failed`` (``localize=True``) a step that did not fail is returned as it
    is: a passing step has nothing to localize, and a localization attached to it
    would print a "first divergent op" under a pass.

    ``state`` is a zero-argument context-manager factory that puts back what the
    extra TF2 pass changes (batch-norm statistics in training mode). A
    localization that cannot run is attached as "inconclusive" with the reason;
    the step's status and comparisons are never changed.
    """
    import contextlib
    import dataclasses
    import time
    import traceback

    if result.status == "skipped" or (only_failed and result.status != "failed"):
        return result
    started = time.perf_counter()
    if strategy is not None:
        found = Localization("inconclusive", reason="not run under a distribution strategy: replica "
                             "functions run on other threads, outside the op taps")
    else:
        from equivtool.localize.forward import localize_forward
        try:
            with (state() if state is not None else contextlib.nullcontext()):
                # a side in another interpreter has no tf.Graph here: its pass is described
                graph, outputs = (tf1_side.op_graph(tf1_outputs) if hasattr(tf1_side, "op_graph")
                                  else (tf1_side.graph, tf1_outputs))
                found = localize_forward(graph, outputs, tf1_side.op_runner(tf1_outputs), call_tf2, tolerance)
        except Exception as exc:  # the step's verdict stands; say why nothing was localized
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            found = Localization("inconclusive", reason=f"localization failed: {detail[:300]}",
                                 seconds=time.perf_counter() - started)
    data = {**dict(result.data), "localization": found}
    return dataclasses.replace(result, data=data)
