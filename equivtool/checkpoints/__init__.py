"""The native TF2 end state: a variable mapping proposed, TF1 checkpoints converted, training resumed.

* :mod:`equivtool.checkpoints.mapping`: :func:`map_variables` proposes which
  TF2 variable is which TF1 variable (:class:`VariableMapping`), with the
  ``rename=`` rules that say so, printed as Python to commit;
* :mod:`equivtool.checkpoints.convert`: :func:`convert_checkpoint` writes a TF2
  object-based checkpoint (model and tf-keras optimizer slots) from a TF1
  name-based one;
* ``equivtool.checkpoints._slots``: the TF1 optimizers' slot layouts and how each
  becomes a tf-keras optimizer's;
* ``equivtool.checkpoints._resume``: the ``resume`` step of ``check_equivalence``.

The public names are exported from :mod:`equivtool` itself.
"""
