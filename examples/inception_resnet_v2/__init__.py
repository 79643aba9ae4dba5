"""Inception-ResNet-v2: the TF1 tf-slim model (tf1_model) and its TF2 shim layer (keras_shim)."""
