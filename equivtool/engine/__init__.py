"""The engine: what runs :func:`equivtool.check_equivalence`, step by step.

Internal (not API). A newcomer follows the names:

* :mod:`~equivtool.engine.registry`: every step, defined once (TensorFlow-free);
* :mod:`~equivtool.engine.steps`: the step bodies, one ``_<step>_tf1`` /
  ``_<step>_tf2`` / ``_<step>_judge`` trio per step;
* :mod:`~equivtool.engine.pair`: the two halves (TF1 graph, TF2 layer) a step runs on;
* :mod:`~equivtool.engine.sides`: the sides, which alone execute TensorFlow;
* :mod:`~equivtool.engine.workers` and :mod:`~equivtool.engine.send`: the
  sides in worker processes, and what may cross a process.
"""
