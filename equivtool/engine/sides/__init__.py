"""The sides: the only code that executes TensorFlow (graph building, sessions, optimizers, checkpoints)."""
