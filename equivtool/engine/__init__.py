"""The engine: what runs :func:`equivtool.check_equivalence`, step by step.

Internal (not API). A newcomer follows the names:

* :mod:`~equivtool.engine.registry`: every step, defined once (TensorFlow-free);
* :mod:`~equivtool.engine.steps`: the step bodies, one ``_<step>_tf1`` /
  ``_<step>_tf2`` / ``_<step>_judge`` trio per step, one module per what a step
  proves (``variables``, ``forward``, ``training``, ``checkpoint``);
* :mod:`~equivtool.engine.options`: the arguments, checked before any work;
* :mod:`~equivtool.engine.pair`: the two halves (TF1 graph, TF2 layer) a step runs on,
  and :mod:`~equivtool.engine.align`: their weights aligned for a native rewrite;
* :mod:`~equivtool.engine.sides`: the sides, which alone execute TensorFlow;
* :mod:`~equivtool.engine.workers` and :mod:`~equivtool.engine.send`: the
  sides in worker processes, and what may cross a process.
* :mod:`~equivtool.engine.signals`: SIGTERM as an orderly stop, and workers
  that end with their parent, whatever kills it.
"""
