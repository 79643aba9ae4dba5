"""equivtool: prove that a TF1 model migrated to TF2 computes the same numbers.

Importing equivtool applies one documented environment fix (see
``equivtool._platform.env``): it selects legacy Keras (``TF_USE_LEGACY_KERAS=1``) when
TensorFlow is not imported yet, and lets tf-slim find tf-keras' moved legacy
layer modules. Public names are loaded lazily, so ``import equivtool`` itself
does not import TensorFlow.
"""

from __future__ import annotations

from equivtool._base.lazy import lazy_exports
from equivtool._platform import env as _env

_env.apply()

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "EquivtoolEnvironmentError": "_platform.env",
    # step 1 and 2: variables
    "VariableCreationError": "variables",
    "assert_no_variable_creations": "variables",
    "catch_and_raise_created_variables": "variables",
    "creates_variables_once": "variables",
    "VariableInfo": "variables",
    "VariableSet": "variables",
    "VariableParity": "variables",
    "tf1_variables": "variables",
    "tf2_variables": "variables",
    "compare_variables": "variables",
    "assert_variable_parity": "variables",
    # random numbers
    "DeterministicRandomTestTool": "seeding",
    "RandomOpRecord": "seeding",
    "TraceDivergence": "seeding",
    "compare_random_traces": "seeding",
    # comparison and report
    "Tolerance": "comparison",
    "Comparison": "comparison",
    "LeafComparison": "comparison",
    "compare": "comparison",
    "StepResult": "report",
    "EquivalenceReport": "report",
    # the engine
    "check_equivalence": "equivalence",
    "start_workers": "engine.workers",
    "UnmatchedToleranceKeys": "equivalence",
    "slim_shim": "slim",
    "STEPS": "engine.registry",
    "DEFAULT_STEPS": "engine.registry",
    "MODES": "engine.registry",
    "Localization": "localize",
    # the native TF2 end state: mapping, checkpoint conversion
    "VariableMapping": "variables.mapping",
    "map_variables": "variables.mapping",
    "map_checkpoint": "checkpoints.checkpoint_map",
    "convert_checkpoint": "checkpoints.convert",
    "SlotLayout": "variables.slots",
    "ADAM_WEIGHT_DECAY": "variables.slots",
    # reproducibility
    "audit_determinism": "determinism",
    # exported models and golden records
    "compare_models": "exported",
    "load_side": "exported",
    "ModelLoadError": "exported",
    "DeterminismReport": "determinism",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
