"""The platform: the environment fix, the compatibility repairs, TensorFlow internals, quiet imports, the self-check."""
