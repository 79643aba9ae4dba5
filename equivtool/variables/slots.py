"""TF1 optimizer slot layouts, and how each becomes a tf-keras optimizer's slots.

Facts from ``tensorflow/python/training`` (``adam.py``, ``momentum.py``,
``rmsprop.py``, ``adagrad.py``, ``slot_creator.py``) and tf-keras'
``optimizers`` (``adam.py``, ``sgd.py``, ``rmsprop.py``, ``adagrad.py``):

* a TF1 slot is saved as ``<variable>/<optimizer name>`` for its first slot and
  ``<variable>/<optimizer name>_<N>`` for the later ones, in the order the
  optimizer's ``_create_slots`` makes them (``Adam``: m then v; ``RMSProp``:
  rms, then mg when centered, then momentum); a partitioned variable's slot
  is saved whole under the variable's full name, like the variable;
* a tf-keras (2.11+) optimizer slot is a variable named
  ``<slot>/<variable name>`` (``m``, ``v``; ``velocity``, ``momentum``,
  ``average_gradient``; ``accumulator``) and the step count is ``iterations``;
  a Keras 3 optimizer's slot is named ``<variable path, / as _>_<slot>``, its
  slots the same but for Adam's ``momentum``/``velocity`` (tf-keras ``m``/``v``)
  and SGD's ``momentum`` (tf-keras ``m``) (:func:`slot_name`, :func:`slot_variables`);
* Adam's step count is in ``beta1_power = beta1 ** (t + 1)`` and
  ``beta2_power = beta2 ** (t + 1)`` in TF1, and in ``iterations = t`` in
  tf-keras (its update uses ``iterations + 1``).

What each conversion preserves, and what it cannot, is in :data:`LAYOUTS`'
``notes`` (the README's table shows them).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from equivtool._base.names import strip_output_index
from equivtool.variables.flavour import is_keras3, variable_name

__all__ = ["SlotLayout", "LAYOUTS", "ADAM_WEIGHT_DECAY", "keras_kind", "layout_for", "tf1_family",
           "find_family", "declared_layout", "iterations_from_betas", "slot_name", "slot_variables"]


@dataclass(frozen=True)
class SlotLayout:
    """One TF1 optimizer's slots as one tf-keras optimizer's.

    ``slots``: ``(TF1 slot, its checkpoint suffix, tf-keras slot or None when
    tf-keras keeps no such state, transform)``; ``transform`` is ``"copy"`` or
    ``"times_minus_lr"`` (TF1 Momentum accumulates gradients, tf-keras SGD
    velocities: ``m = -learning_rate * accumulation``). ``keras``: the tf-keras
    optimizer class name it converts to, or a tuple of those it may convert to.

    Pass one as ``slot_layout=`` to declare the layout of an optimizer whose
    state is not saved as slots (BERT's ``AdamWeightDecayOptimizer``:
    :data:`ADAM_WEIGHT_DECAY`); its ``notes`` are printed with the conversion:
    state them, above all how its update differs from the tf-keras one's.
    """

    tf1: str
    keras: "str | tuple"
    slots: tuple
    notes: tuple = ()


_ADAM_NOTES = (
    "m, v copied (TF1 m = Adam, v = Adam_1); iterations from beta1_power/beta2_power and global_step, "
    "checked against each other",
    "epsilon: both add it to sqrt(v) (epsilon hat, not the paper's Algorithm 1), but TF1's default is "
    "1e-08 and Keras' (tf-keras and Keras 3) 1e-07: give the Keras optimizer the TF1 run's value",
    "amsgrad has no TF1 counterpart (refused)",
)
_MOMENTUM_NOTES = (
    "TF1 Momentum accumulates gradients (a = mu*a + g; var -= lr*a, Nesterov: var -= lr*(g + mu*a)); "
    "tf-keras SGD keeps a velocity (m = mu*m - lr*g; var += m, Nesterov: var += mu*m - lr*g): "
    "m = -learning_rate * a, exact only for a constant learning rate equal to the TF1 run's "
    "(a schedule is refused)",
)
_RMSPROP_NOTES = (
    "velocity = rms (RMSProp), momentum = momentum slot, average_gradient = mg when centered: copied",
    "epsilon: both add it inside the square root; TF1's default is 1e-10, Keras' (tf-keras and Keras 3) 1e-07",
    "initial accumulator: TF1 starts rms at 1.0, tf-keras velocity at 0.0: a fresh start differs, a "
    "converted one carries the TF1 value",
    "centered: TF1 centered=True has three slots (rms, mg, momentum): the tf-keras optimizer must be "
    "centered=True too (checked)",
    "momentum=0 in tf-keras keeps no momentum slot: TF1's (its last increment) is not needed",
)
_ADAGRAD_NOTES = (
    "accumulator copied (TF1 Adagrad slot)",
    "epsilon: TF1 Adagrad has none (var -= lr*g/sqrt(acc)); tf-keras adds it inside the square root "
    "(var -= lr*g/sqrt(acc + epsilon)): pass epsilon=0 for identical updates",
    "initial_accumulator_value: both default 0.1; converted accumulators carry the TF1 value",
)
_SGD_NOTES = ("GradientDescent keeps no slots; iterations from global_step",)

LAYOUTS = {
    "Adam": SlotLayout("Adam", "Adam", (("m", "Adam", "m", "copy"), ("v", "Adam_1", "v", "copy")), _ADAM_NOTES),
    "Momentum": SlotLayout("Momentum", "SGD", (("momentum", "Momentum", "m", "times_minus_lr"),),
                           _MOMENTUM_NOTES),
    "RMSProp": SlotLayout("RMSProp", "RMSprop", (("rms", "RMSProp", "velocity", "copy"),
                                                 ("momentum", "RMSProp_1", "momentum", "copy")), _RMSPROP_NOTES),
    "RMSProp (centered)": SlotLayout(
        "RMSProp (centered)", "RMSprop", (("rms", "RMSProp", "velocity", "copy"),
                                          ("mg", "RMSProp_1", "average_gradient", "copy"),
                                          ("momentum", "RMSProp_2", "momentum", "copy")), _RMSPROP_NOTES),
    "Adagrad": SlotLayout("Adagrad", "Adagrad", (("accumulator", "Adagrad", "accumulator", "copy"),),
                          _ADAGRAD_NOTES),
    "GradientDescent": SlotLayout("GradientDescent", "SGD", (), _SGD_NOTES),
}

#: BERT's ``AdamWeightDecayOptimizer`` (``optimization.py`` of google-research/bert): m and v saved
#: as plain variables ``<variable>/adam_m``, ``<variable>/adam_v``; no beta powers, no bias correction.
ADAM_WEIGHT_DECAY = SlotLayout(
    "AdamWeightDecayOptimizer", ("AdamW", "Adam"),
    (("m", "adam_m", "m", "copy"), ("v", "adam_v", "v", "copy")),
    ("m, v copied (adam_m, adam_v); iterations = global_step (the optimizer keeps no beta powers)",
     "bias correction: AdamWeightDecayOptimizer has none (update = m / (sqrt(v) + epsilon)); tf-keras "
     "Adam and AdamW divide m by 1 - beta_1**t and v by 1 - beta_2**t: resumed training differs, most in "
     "the early steps (at step t by sqrt(1 - beta_2**t) / (1 - beta_1**t))",
     "weight decay: AdamWeightDecayOptimizer adds weight_decay_rate * var to the update, so it is scaled "
     "by the learning rate and kept out of m and v (decoupled); tf-keras AdamW subtracts "
     "learning_rate * weight_decay * var: the same form, give it weight_decay=<weight_decay_rate>; tf-keras "
     "Adam without weight_decay decays nothing",
     "exclusion list: AdamWeightDecayOptimizer skips variables whose names match exclude_from_weight_decay "
     "(BERT: 'LayerNorm', 'layer_norm', 'bias'); tf-keras AdamW decays every variable unless told: call "
     "optimizer.exclude_from_weight_decay(var_names=[...]) with the TF2 names' patterns",
     "epsilon: AdamWeightDecayOptimizer's default is 1e-06, Keras' 1e-07: give the TF1 run's value"),
)

_SUFFIX = re.compile(r"^(?P<base>[A-Za-z][A-Za-z0-9]*)(?:_(?P<n>\d+))?$")


_KINDS = ("Adam", "SGD", "RMSprop", "Adagrad")
# A Keras 3 slot's name where it differs from tf-keras', by optimizer kind.
_KERAS3_SLOTS = {"Adam": {"m": "momentum", "v": "velocity"}, "AdamW": {"m": "momentum", "v": "velocity"},
                 "SGD": {"m": "momentum"}}


def keras_kind(optimizer) -> str:
    """``"Adam"``, ``"AdamW"`` (tf-keras), ``"SGD"``, ``"RMSprop"`` or ``"Adagrad"``
    for those tf-keras or Keras 3 optimizers (exactly those classes);
    ``ValueError`` for any other."""
    known = {getattr(tf.keras.optimizers, kind): kind for kind in _KINDS + ("AdamW",)}
    if is_keras3(optimizer):
        import keras  # the optimizer is a Keras 3 object, so Keras 3 is imported
        known = {getattr(keras.optimizers, kind): kind for kind in _KINDS + ("AdamW",)}
    kind = known.get(type(optimizer))
    if kind is None:
        raise ValueError(
            f"optimizer: the slot layout of {type(optimizer).__module__}.{type(optimizer).__name__} is unknown; "
            "supported: Adam, AdamW, SGD (with or without momentum, Nesterov), RMSprop, Adagrad of "
            "tf.keras.optimizers (the tf-keras 2.11+ optimizers, not optimizers.legacy) or of keras.optimizers "
            "(Keras 3)")
    if getattr(optimizer, "use_ema", False):
        raise ValueError(f"optimizer: {kind}(use_ema=True) keeps a moving average of every weight, which no TF1 "
                         "optimizer slot holds; pass use_ema=False (or apply the EMA after converting)")
    return kind


def slot_name(optimizer, kind: str, keras_slot: str) -> str:
    """The optimizer's own name for the tf-keras slot ``keras_slot`` (a layout's name)."""
    return _KERAS3_SLOTS.get(kind, {}).get(keras_slot, keras_slot) if is_keras3(optimizer) else keras_slot


def _slot_key(optimizer, slot: str, variable) -> str:
    if is_keras3(optimizer):
        return f"{variable_name(variable).replace('/', '_')}_{slot}"
    return f"{slot}/{variable_name(variable)}"


def slot_variables(optimizer, variables, slots) -> list:
    """``(slot, variable, slot variable)`` for each of ``slots`` (the optimizer's
    own slot names) the built ``optimizer`` keeps for each of ``variables``, in
    that order; a slot it does not keep is left out."""
    found = optimizer.variables() if callable(optimizer.variables) else optimizer.variables
    by_name = {(v.name if is_keras3(v) else strip_output_index(v.name)): v for v in found}
    out = []
    for variable in variables:
        for slot in slots:
            target = by_name.get(_slot_key(optimizer, slot, variable))
            if target is not None:
                out.append((slot, variable, target))
    return out


def tf1_family(slot_suffixes: dict) -> str:
    """The TF1 optimizer whose slots these are: ``{variable: [suffix, ...]}`` ->
    a key of :data:`LAYOUTS`; ``ValueError`` naming a slot of no known layout."""
    bases = {}
    for variable, suffixes in slot_suffixes.items():
        for suffix in suffixes:
            match = _SUFFIX.match(suffix)
            base = match.group("base") if match else suffix
            if base not in ("Adam", "Momentum", "RMSProp", "Adagrad"):
                raise ValueError(f"tf1_checkpoint: slot {variable}/{suffix}: unknown TF1 optimizer slot layout "
                                 f"{base!r}; known: Adam, Momentum, RMSProp, Adagrad, GradientDescent (under "
                                 "any one optimizer name); declare another layout with slot_layout= "
                                 "(equivtool.ADAM_WEIGHT_DECAY for BERT's AdamWeightDecayOptimizer)")
            bases.setdefault(base, []).append(f"{variable}/{suffix}")
    if len(bases) > 1:
        raise ValueError(f"tf1_checkpoint: slots of several optimizers ({sorted(bases)}): convert one at a time")
    if not bases:
        return "GradientDescent"
    base = next(iter(bases))
    if base == "RMSProp" and any(len(s) == 3 for s in slot_suffixes.values()):
        return "RMSProp (centered)"
    return base


def find_family(slot_suffixes: dict, kind: str | None, non_slot) -> tuple:
    """``(family, layout renamer)``: :func:`tf1_family` for default optimizer
    names; for another name (``AdamOptimizer(name="MyAdam")`` saves
    ``<variable>/MyAdam`` and ``<variable>/MyAdam_1``), the family read from the
    slots' structure: how many each variable has (``NAME``, ``NAME_1``...),
    whether the checkpoint has Adam's beta powers, and, for one slot per
    variable (Momentum or Adagrad), the tf-keras optimizer given (``kind``).
    The renamer maps a default layout's suffixes to the saved ones."""
    bases = {}
    for variable, suffixes in slot_suffixes.items():
        for suffix in suffixes:
            match = _SUFFIX.match(suffix)
            bases.setdefault(match.group("base") if match else suffix, set()).add(variable)
    default = ("Adam", "Momentum", "RMSProp", "Adagrad")
    if len(bases) != 1 or next(iter(bases)) in default:
        return tf1_family(slot_suffixes), lambda layout: layout
    name = next(iter(bases))
    counts = {len(suffixes) for suffixes in slot_suffixes.values()}
    where = f"slots named {name!r} ({next(iter(slot_suffixes))}/{name}...)"
    expected = {n: sorted([name] + [f"{name}_{i}" for i in range(1, n)]) for n in counts}
    if len(counts) != 1 or any(sorted(s) != expected[len(s)] for s in slot_suffixes.values()):
        raise ValueError(f"tf1_checkpoint: {where}: each variable must have the same slots {name}, {name}_1...; "
                         "declare the layout with slot_layout=")
    count = counts.pop()
    betas = "beta1_power" in non_slot and "beta2_power" in non_slot
    if count == 2:
        family = "Adam" if betas else "RMSProp"
    elif count == 3:
        family = "RMSProp (centered)"
    elif count == 1 and kind in ("SGD", "Adagrad"):
        family = "Momentum" if kind == "SGD" else "Adagrad"
    else:
        raise ValueError(f"tf1_checkpoint: {where}, {count} per variable: "
                         + ("Momentum or Adagrad: pass the matching tf-keras optimizer (SGD(momentum=...) or "
                            "Adagrad)" if count == 1 else "no known optimizer has that layout; declare it with "
                            "slot_layout="))
    default_name = {"Adam": "Adam", "RMSProp": "RMSProp", "RMSProp (centered)": "RMSProp",
                    "Momentum": "Momentum", "Adagrad": "Adagrad"}[family]

    def renamed(layout: SlotLayout) -> SlotLayout:
        slots = tuple((s, name + x[len(default_name):] if x.startswith(default_name) else x, k, t)
                      for s, x, k, t in layout.slots)
        return SlotLayout(layout.tf1, layout.keras, slots,
                          (f"the TF1 optimizer was named {name!r}: {family} read from its slots' structure "
                           f"({count} per variable{', beta powers' if betas else ''})",) + layout.notes)
    return family, renamed


def declared_layout(layout: SlotLayout, kind: str) -> SlotLayout:
    """``layout`` (``slot_layout=``) checked: its fields' forms and that ``kind``
    is a tf-keras optimizer it converts to; ``ValueError`` names what is not."""
    if not isinstance(layout, SlotLayout):
        raise TypeError(f"slot_layout: expected an equivtool.SlotLayout (e.g. equivtool.ADAM_WEIGHT_DECAY), "
                        f"got {type(layout).__name__}")
    for slot in layout.slots:
        if not (isinstance(slot, tuple) and len(slot) == 4 and isinstance(slot[1], str)
                and slot[3] in ("copy", "times_minus_lr")):
            raise ValueError(f"slot_layout: slot {slot!r}: expected (TF1 slot, checkpoint suffix, tf-keras slot "
                             "or None, 'copy' | 'times_minus_lr')")
    kinds = layout.keras if isinstance(layout.keras, tuple) else (layout.keras,)
    if kind not in kinds:
        raise ValueError(f"optimizer: the declared layout {layout.tf1} converts to "
                         f"{' or '.join('tf.keras.optimizers.' + k for k in kinds)}, not {kind}")
    return layout


def layout_for(family: str, kind: str, optimizer) -> SlotLayout:
    """The layout from TF1 ``family`` to the tf-keras ``kind``, checking the
    hyperparameters that change which slots exist; ``ValueError`` names them."""
    layout = LAYOUTS[family]
    wanted = {"Adam": "Adam", "Momentum": "SGD", "GradientDescent": "SGD", "Adagrad": "Adagrad",
              "RMSProp": "RMSprop", "RMSProp (centered)": "RMSprop"}[family]
    if kind != wanted and not (wanted == "Adam" and kind == "AdamW"):
        raise ValueError(f"optimizer: the checkpoint holds {family} state; it converts to "
                         f"tf.keras.optimizers.{wanted}, not {kind}" + (" (or to AdamW)" if wanted == "Adam" else ""))
    if kind == "AdamW":  # m and v are Adam's; the decay is AdamW's own
        decay = float(optimizer.weight_decay or 0.0)
        layout = SlotLayout(layout.tf1, layout.keras, layout.slots, layout.notes + (
            f"AdamW: m, v and iterations as Adam's; it also decays each weight by learning_rate * weight_decay "
            f"(weight_decay={decay:.6g}), which TF1 Adam does not: resumed training matches only with "
            "weight_decay=0",))
    if kind in ("Adam", "AdamW") and getattr(optimizer, "amsgrad", False):
        raise ValueError(f"optimizer: {kind}(amsgrad=True) keeps a vhat slot that TF1 Adam has no counterpart for")
    if kind == "SGD":
        momentum = float(optimizer.momentum)
        if family == "Momentum" and momentum == 0:
            raise ValueError("optimizer: the checkpoint holds Momentum slots but SGD has momentum=0; "
                             "pass SGD(momentum=<the TF1 momentum>)")
        if family == "GradientDescent" and momentum != 0:
            raise ValueError(f"optimizer: the checkpoint is GradientDescent (no slots) but SGD has "
                             f"momentum={momentum}; pass SGD(momentum=0.0)")
    if kind == "RMSprop":
        centered = family == "RMSProp (centered)"
        if bool(optimizer.centered) != centered:
            raise ValueError(f"optimizer: centered={bool(optimizer.centered)} but the TF1 checkpoint is "
                             f"{'centered (rms, mg, momentum slots)' if centered else 'not centered'}; "
                             f"pass RMSprop(centered={centered})")
        if float(optimizer.momentum) == 0:
            layout = SlotLayout(layout.tf1, layout.keras,
                                tuple((s, x, None if k == "momentum" else k, t) for s, x, k, t in layout.slots),
                                layout.notes)
    return layout


def _steps_from_power(power: float, beta: float):
    """``t`` with ``power == beta ** (t + 1)``: ``(t, exact)``, or ``None`` when
    ``power`` underflowed (then it says nothing)."""
    if not 0 < beta < 1:
        return None
    if power <= np.finfo(np.float32).tiny:
        return None
    t = math.log(power) / math.log(beta) - 1
    # float32 rounding of a running product: about 6e-8 relative per step.
    slack = 0.01 + 2e-7 * max(t, 1) / abs(math.log(beta))
    return round(t), abs(t - round(t)) <= slack


def iterations_from_betas(beta1_power: float, beta2_power: float, beta_1: float, beta_2: float,
                          global_step: int | None) -> int:
    """Adam's step count from its beta powers, checked against each other and
    against ``global_step`` (when the checkpoint has one); ``ValueError`` says
    which disagree."""
    found = {}
    for name, power, beta in (("beta1_power", beta1_power, beta_1), ("beta2_power", beta2_power, beta_2)):
        power = np.asarray(power)
        if power.size != 1:
            raise ValueError(f"tf1_checkpoint: {name} has shape {list(power.shape)}; expected a scalar")
        power = float(power.reshape(()))
        if not (math.isfinite(power) and 0 <= power <= 1):
            raise ValueError(f"tf1_checkpoint: {name} = {power:.9g}; Adam's beta power is beta ** (step + 1), "
                             "a number in [0, 1]: the checkpoint holds another value")
        got = _steps_from_power(power, float(beta))
        if got is None:
            continue
        t, exact = got
        if not exact or t < 0:
            raise ValueError(f"tf1_checkpoint: {name} = {float(power):.9g} is not a power of the optimizer's "
                             f"beta ({beta}): the TF1 run used another beta, or the value was changed; pass the "
                             "TF1 run's beta_1/beta_2 to the tf-keras Adam")
        found[name] = t
    if len(set(found.values())) > 1:
        raise ValueError(f"tf1_checkpoint: the beta powers disagree on the step count: {found}")
    if global_step is not None and found and next(iter(found.values())) != global_step:
        raise ValueError(f"tf1_checkpoint: beta powers say {next(iter(found.values()))} steps "
                         f"({found}), global_step says {global_step}: they must agree (was global_step "
                         "incremented elsewhere, or the beta powers restored from another run?)")
    if found:
        return next(iter(found.values()))
    if global_step is not None:
        return global_step
    raise ValueError("tf1_checkpoint: both beta powers underflowed and there is no global_step: the step count "
                     "cannot be recovered")
