"""The arguments of ``check_equivalence`` as ``Options.build`` receives them: its
signature's defaults (declared there once), with a test's overrides."""

import inspect

import equivtool


def equivalence_arguments(**overrides) -> dict:
    """Every keyword argument of :func:`equivtool.check_equivalence` at its default,
    updated with ``overrides`` (a name it does not have is a ``TypeError``)."""
    parameters = inspect.signature(equivtool.check_equivalence).parameters
    defaults = {name: p.default for name, p in parameters.items() if p.kind is p.KEYWORD_ONLY}
    unknown = set(overrides) - set(defaults)
    if unknown:
        raise TypeError(f"check_equivalence has no argument(s) {sorted(unknown)}")
    return {**defaults, **overrides}
