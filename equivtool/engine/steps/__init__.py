"""How each registered step runs (see :mod:`equivtool.engine.registry`), one module per
what a step proves: ``variables``, ``forward``, ``training``, ``checkpoint``; ``common``
holds what they share.

A step is three functions (:class:`SplitStep`): what the TF1 side computes,
what the TF2 side computes, and the judgement that compares them. The sides
are independent until their captures are judged (the one exception: the
``checkpoint`` step's TF2 side loads the file its TF1 side names), so with
``workers=2`` each side runs in a process of its own and only its picklable
capture (NumPy arrays, names, flags) comes back; with ``workers=1`` the same
functions run one after the other in this process.

A side function takes the engine (its options and the lazily built pair
halves) and the step's parameters and returns a dict; a key starting with
``_`` holds in-process objects (for localization) and never crosses a process.
A side raises :class:`~equivtool.engine.registry.SkipStep` with the reason it cannot run.
"""

