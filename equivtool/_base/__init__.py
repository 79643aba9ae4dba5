"""Shared helpers with no TensorFlow model of their own: structures, errors, stack frames, rendering."""
