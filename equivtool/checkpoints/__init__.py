"""The native TF2 end state: TF1 checkpoints converted, training resumed from them.

* :mod:`equivtool.variables.mapping` (a vocabulary the engine uses too):
  :func:`map_variables` proposes which TF2 variable is which TF1 variable
  (:class:`VariableMapping`), with the ``rename=`` rules that say so;
* :mod:`equivtool.checkpoints.convert`: :func:`convert_checkpoint` writes a TF2
  object-based checkpoint (model and tf-keras optimizer slots) from a TF1
  name-based one;
* ``equivtool.variables.slots``: the TF1 optimizers' slot layouts and how each
  becomes a tf-keras optimizer's;
* ``equivtool.checkpoints._resume``: the ``resume`` step of ``check_equivalence``
  (registered in the engine's step registry by name: a feature's own step).

The public names are exported from :mod:`equivtool` itself.
"""
