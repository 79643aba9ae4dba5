"""The tf_slim.nets model zoo, each network proven equivalent to its TF2 shim."""
