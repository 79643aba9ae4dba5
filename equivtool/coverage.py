"""The coverage ledger: what a check proved, variable by variable and output by output.

A step that passes says its comparisons agreed; it does not say that
everything the verdict speaks for was compared. The ledger adds that up over
the steps that ran. Each step states its evidence in ``data["proves"]``:

``outputs``      ``{leaf: "above_atol" | "below_atol"}``: output leaves it compared
                 and whether some value was at least ``atol`` in magnitude
                 (a leaf below ``atol`` on both sides could not have shown a difference);
``values``       variable keys whose values it compared after a training-mode
                 call or an optimizer step (moving statistics included);
``gradients``    trainable variable keys whose gradients it compared;
``no_gradient``  trainable variable keys with no gradient on either side (they
                 agree: the loss reaches them on neither side; listed);
``trainable``    the keys trainable on both sides (so a gradient is owed);
``variables``    (parity) every variable key with its trainability.

EQUIVALENT then needs, for each kind of evidence whose steps ran (its scope):

* every output leaf compared above ``atol`` in at least one step;
* every variable's value compared after a training-mode call or optimizer step;
* every trainable variable's gradient compared (or None on both sides, listed).

What a scope left out is named in the verdict line ("not covered by the steps
run: ..."), never passed over. What was in scope and never proven makes the
check INCONCLUSIVE, naming it and the remedy. NumPy-free: the ledger reads
step results only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

__all__ = ["Coverage", "output_levels", "VALUE_STEPS", "FORWARD_STEPS", "GRADIENT_STEPS"]

#: Steps that compare variables' values after a training-mode call or an optimizer step.
VALUE_STEPS = ("random/constant/training", "random/num_random_ops/training", "optimizer", "resume")
#: Steps that compare the model's outputs.
FORWARD_STEPS = ("fixed_weights", "random/constant/inference", "random/constant/training",
                 "random/num_random_ops/inference", "random/num_random_ops/training", "checkpoint")
#: Steps that compare gradients.
GRADIENT_STEPS = ("gradients",)

_RAN = ("passed", "failed", "inconclusive")
_REMEDY = {
    "outputs": "make them show a difference: larger inputs, the fixed_weights step (fixed non-random "
               "values), or an rtol-only tolerance for them (Tolerance(rtol=..., atol=0))",
    "values": "run a step that compares them: the training-mode random steps (steps=['random']) or "
              "the optimizer step (optimizers=...)",
    "gradients": "pass a loss_fn that reaches them, or run the gradients step",
}
_SHOWN = 5


def _listed(keys: list) -> str:
    more = f" (+{len(keys) - _SHOWN} more)" if len(keys) > _SHOWN else ""
    return ", ".join(keys[:_SHOWN]) + more


def output_levels(comparisons) -> dict:
    """``{leaf: "above_atol" | "below_atol"}`` over output comparisons: a leaf is
    "above_atol" when it compared values and not every one of them was below
    ``atol`` on both sides (a failed leaf included: it showed a difference)."""
    return {leaf.name: ("above_atol" if leaf.compared and not leaf.below_atol and not leaf.inconclusive
                        else "below_atol")
            for c in comparisons for leaf in c.leaves}


@dataclass(frozen=True)
class Coverage:
    """Which steps proved each variable and each output leaf, and what is owed.

    ``variables``: ``{key: {"trainable": bool | None, "value": [steps],
    "gradient": [steps], "no_gradient": [steps]}}``; ``outputs``:
    ``{leaf: {"above_atol": [steps], "below_atol": [steps]}}``; ``scope``:
    ``{"outputs" | "values" | "gradients": True when a step proving it ran}``;
    ``owed``: the kinds of evidence the check speaks for (an exported model's
    comparison speaks for its outputs only).
    """

    variables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    outputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    scope: Mapping[str, bool] = field(default_factory=dict)
    owed: tuple = ("outputs", "values", "gradients")

    def __post_init__(self) -> None:
        object.__setattr__(self, "variables", MappingProxyType(dict(self.variables)))
        object.__setattr__(self, "outputs", MappingProxyType(dict(self.outputs)))
        object.__setattr__(self, "scope", MappingProxyType(dict(self.scope)))
        object.__setattr__(self, "owed", tuple(self.owed))

    # -- building ------------------------------------------------------------

    @classmethod
    def from_steps(cls, steps: Iterable, owed: tuple = ("outputs", "values", "gradients")) -> "Coverage":
        """The ledger of the steps that ran (passed, failed or inconclusive);
        skipped and errored steps prove nothing."""
        variables: dict = {}
        outputs: dict = {}
        scope = {"outputs": False, "values": False, "gradients": False, "variables_known": False}

        def entry(key: str) -> dict:
            return variables.setdefault(key, {"trainable": None, "value": [], "gradient": [], "no_gradient": []})

        for step in steps:
            if step.status not in _RAN:
                continue
            proves = step.data.get("proves") or {}
            if step.name in FORWARD_STEPS or "outputs" in proves:
                scope["outputs"] = True
            if step.name in VALUE_STEPS:
                scope["values"] = True
            if step.name in GRADIENT_STEPS:
                scope["gradients"] = True
            if "variables" in proves:
                scope["variables_known"] = True
            for key, trainable in (proves.get("variables") or {}).items():
                entry(key)["trainable"] = bool(trainable)
            for key in proves.get("trainable") or ():
                entry(key)["trainable"] = True
            for kind in ("value", "gradient", "no_gradient"):
                for key in proves.get(kind if kind == "no_gradient" else kind + "s") or ():
                    steps_of = entry(key)[kind]
                    if step.name not in steps_of:
                        steps_of.append(step.name)
            for leaf, level in (proves.get("outputs") or {}).items():
                seen = outputs.setdefault(leaf, {"above_atol": [], "below_atol": []})
                seen["above_atol" if level == "above_atol" else "below_atol"].append(step.name)
        return cls(variables, outputs, scope, owed)

    # -- reading -------------------------------------------------------------

    @property
    def unproven_outputs(self) -> list:
        """Output leaves never compared above ``atol`` (in scope only)."""
        if not self.scope.get("outputs"):
            return []
        return [leaf for leaf, seen in self.outputs.items() if not seen["above_atol"]]

    @property
    def unproven_values(self) -> list:
        """Variables whose value no step compared after training (in scope only)."""
        if not self.scope.get("values"):
            return []
        return [key for key, seen in self.variables.items() if not seen["value"]]

    @property
    def unproven_gradients(self) -> list:
        """Trainable variables with neither a compared gradient nor None on both sides (in scope only)."""
        if not self.scope.get("gradients"):
            return []
        return [key for key, seen in self.variables.items()
                if seen["trainable"] and not seen["gradient"] and not seen["no_gradient"]]

    @property
    def in_scope(self) -> bool:
        """A step that proves outputs, values or gradients ran."""
        return any(self.scope.get(kind) for kind in ("outputs", "values", "gradients"))

    @property
    def complete(self) -> bool:
        """Everything in scope was proven, and, where anything was in scope, something
        was proven (a ledger of nothing proves nothing)."""
        if not self.in_scope:
            return True
        proved_any = any(seen["above_atol"] for seen in self.outputs.values()) or any(
            seen["value"] or seen["gradient"] for seen in self.variables.values())
        return proved_any and not (self.unproven_outputs or self.unproven_values or self.unproven_gradients)

    @property
    def not_in_scope(self) -> list:
        """The kinds of evidence no step that ran could give (named in the verdict line);
        variable evidence is not owed by a model the parity step found without variables."""
        stateless = self.scope.get("variables_known") and not self.variables
        wanted = [kind for kind in self.owed if kind == "outputs" or not stateless]
        names = {"outputs": "outputs", "values": "variable values after training", "gradients": "gradients"}
        return [names[kind] for kind in wanted if not self.scope.get(kind)]

    def unproven_text(self) -> str:
        """What was owed and never proven, with the remedy; "" when complete."""
        parts = []
        for kind, keys, what in (("outputs", self.unproven_outputs, "output leaves below atol in every step"),
                                 ("values", self.unproven_values, "variables whose values were never "
                                                                  "compared after training"),
                                 ("gradients", self.unproven_gradients, "trainable variables whose "
                                                                        "gradient was never compared")):
            if keys:
                parts.append(f"{len(keys)} {what}: {_listed(keys)} (remedy: {_REMEDY[kind]})")
        if not parts and not self.complete:
            parts.append("nothing was proven: no step compared an output above atol, a variable's value "
                         "or a gradient")
        return "; ".join(parts)

    def summary(self) -> str:
        """One line: how much of each kind was proven."""
        trainable = [s for s in self.variables.values() if s["trainable"]]
        parts = []
        if self.scope.get("outputs"):
            proven = sum(bool(s["above_atol"]) for s in self.outputs.values())
            parts.append(f"{proven}/{len(self.outputs)} output leaves compared above atol")
        if self.scope.get("values"):
            proven = sum(bool(s["value"]) for s in self.variables.values())
            parts.append(f"{proven}/{len(self.variables)} variables' values compared after training")
        if self.scope.get("gradients"):
            proven = sum(bool(s["gradient"]) for s in trainable)
            neither = sum(bool(s["no_gradient"]) and not s["gradient"] for s in trainable)
            parts.append(f"{proven}/{len(trainable)} trainable variables' gradients compared"
                         + (f" ({neither} with no gradient on either side)" if neither else ""))
        return "coverage: " + ("; ".join(parts) if parts else "no step that proves outputs or variables ran")

    def lines(self) -> list:
        """The text report's ledger: the summary and what is owed (what was out of
        scope is in the verdict line, :attr:`not_in_scope`)."""
        lines = [self.summary()]
        owed = self.unproven_text()
        if owed:
            lines.append("never proven: " + owed)
        below = [leaf for leaf, s in self.outputs.items() if s["above_atol"] and s["below_atol"]]
        if below:
            lines.append(f"below atol in some steps (proven in others): {_listed(below)}")
        return lines

    def rows(self) -> list:
        """The ledger as rows ``(kind, name, proved by)`` (for the HTML report)."""
        rows = []
        for key, s in self.variables.items():
            proved = [f"value: {', '.join(s['value'])}"] if s["value"] else []
            proved += [f"gradient: {', '.join(s['gradient'])}"] if s["gradient"] else []
            proved += [f"no gradient on either side: {', '.join(s['no_gradient'])}"] if s["no_gradient"] else []
            kind = "trainable variable" if s["trainable"] else "variable"
            rows.append((kind, key, "; ".join(proved) or "never proven"))
        for leaf, s in self.outputs.items():
            proved = f"above atol: {', '.join(s['above_atol'])}" if s["above_atol"] else "never above atol"
            rows.append(("output leaf", leaf, proved))
        return rows

    def to_dict(self) -> dict:
        return {"variables": {k: dict(v) for k, v in self.variables.items()},
                "outputs": {k: dict(v) for k, v in self.outputs.items()},
                "scope": dict(self.scope), "owed": list(self.owed), "complete": self.complete,
                "unproven": {"outputs": self.unproven_outputs, "values": self.unproven_values,
                             "gradients": self.unproven_gradients}}

    @classmethod
    def from_dict(cls, d: Mapping | None) -> "Coverage | None":
        if not d:
            return None
        return cls(d.get("variables", {}), d.get("outputs", {}), d.get("scope", {}),
                   tuple(d.get("owed", ("outputs", "values", "gradients"))))
