"""The random tool's modes, defined once and without TensorFlow: the step registry,
the command line's ``--mode`` choices and the tool itself read them here.

``constant``: every random op returns the same values for the same shape, on
both sides. ``num_random_ops``: each random op gets a seed from the number of
random ops made before it, so successive ops draw different values.
"""

MODES = ("constant", "num_random_ops")
