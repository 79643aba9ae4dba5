"""Exported models compared: a TF1 SavedModel against its TF2 shim export (export.py)."""
