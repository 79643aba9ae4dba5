"""A model's outputs as the steps compare them: end points first, keys renamed and aligned."""

from __future__ import annotations

from typing import Mapping


def split_outputs(expected, actual) -> list[tuple]:
    """Dicts of end points first (they are in forward order), then the other outputs.

    A slim model returns ``(logits, end_points)``; comparing ``end_points``
    first makes the first failing leaf the layer where divergence begins.
    """
    if isinstance(expected, Mapping):
        return [("end_points", expected, actual)]
    if (isinstance(expected, (tuple, list)) and isinstance(actual, (tuple, list))
            and len(expected) == len(actual)
            and any(isinstance(item, Mapping) for item in expected)):
        mappings = [i for i, item in enumerate(expected) if isinstance(item, Mapping)]
        others = [i for i in range(len(expected)) if i not in mappings]
        single = len(mappings) == 1
        parts = [("end_points" if single else f"end_points_{i}", expected[i], actual[i]) for i in mappings]
        parts += [(f"outputs/{i}", expected[i], actual[i]) for i in others]
        return parts
    return [("outputs", expected, actual)]


def _rename_keys(outputs, renamer):
    """``rename`` applied to every str key of the dicts in ``outputs`` (end points)."""
    if isinstance(outputs, Mapping):
        return {(renamer(k) if isinstance(k, str) else k): _rename_keys(v, renamer) for k, v in outputs.items()}
    if isinstance(outputs, (list, tuple)) and not hasattr(outputs, "_fields"):
        return type(outputs)(_rename_keys(v, renamer) for v in outputs)
    return outputs


def align_output_keys(expected, actual, renamer, layer_names) -> tuple:
    """``(expected, actual, stripped prefix or None)`` with ``rename`` applied to
    output keys, and the TF2 layer's own name scope (``<layer name>/``) removed
    from the TF2 end-point keys when that is all that tells them apart."""
    expected, actual = _rename_keys(expected, renamer), _rename_keys(actual, renamer)
    stripped = []

    def walk(exp, act):
        if isinstance(exp, Mapping) and isinstance(act, Mapping):
            if set(exp) != set(act):
                for layer_name in sorted(n for n in layer_names if isinstance(n, str)):
                    prefix = layer_name + "/"
                    renamed = {(k[len(prefix):] if isinstance(k, str) and k.startswith(prefix) else k): v
                               for k, v in act.items()}
                    if len(renamed) == len(act) and set(renamed) == set(exp):
                        stripped.append(prefix)
                        act = renamed
                        break
            return exp, {k: walk(exp[k], v)[1] if k in exp else v for k, v in act.items()}
        if (isinstance(exp, (list, tuple)) and isinstance(act, (list, tuple)) and len(exp) == len(act)
                and not hasattr(act, "_fields")):
            return exp, type(act)(walk(e, a)[1] for e, a in zip(exp, act))
        return exp, act

    expected, actual = walk(expected, actual)
    return expected, actual, (stripped[0] if stripped else None)
