"""A converted model and its optimizer written as a ``.keras`` file (Keras 3 or tf-keras).

``convert_checkpoint(..., format="keras")`` (``convert-checkpoint --format
keras``) ends where a Keras user starts: ``keras.saving.load_model(path)``
(Keras 3) or ``tf_keras.models.load_model(path)`` (tf-keras, whose native
``.keras`` format is the same zip of config and weights) gives the model
with the TF1 weights and ``model.optimizer`` with the TF1 slots and step
count. Either Keras saves an optimizer in a ``.keras`` file only as the
model's compiled optimizer, so the converted optimizer is attached with
``model.compile(optimizer=...)`` (which keeps its variables) before saving.

The file is written as every equivtool output is: checked before any work
(a ``.keras`` name, a writable folder, no symlink, an existing file replaced
only with ``overwrite``), saved to a hidden temporary file in the same folder
(named so that a later run can remove it when its owner was killed, see
:mod:`equivtool._base.scratch`), then renamed over the destination: a reader
sees the old file or the new one, never a part. The temporary file is removed
on every exit: an error, Ctrl-C or SIGTERM (``convert`` turns SIGTERM into an
unwinding exception, :mod:`equivtool.engine.signals`).
"""

from __future__ import annotations

import os
import tempfile

from equivtool._base import scratch
from equivtool._base.errors import short
from equivtool.checkpoints import _paths
from equivtool.engine import signals as _signals
from equivtool.variables.flavour import is_keras3

__all__ = ["FORMATS", "check_format", "check_keras_output", "check_keras_model", "write_keras"]

#: What ``format=`` accepts: a TF2 object-based checkpoint (a prefix), or a ``.keras`` file (Keras 3 or tf-keras).
FORMATS = ("checkpoint", "keras")


def check_format(value) -> str:
    if value not in FORMATS:
        raise ValueError(f"format: expected one of {', '.join(repr(f) for f in FORMATS)}, got {value!r}")
    return value


def check_keras_output(output, overwrite: bool) -> str:
    """``output`` as an absolute ``.keras`` path, refused (``ValueError``) when it
    does not end in ``.keras``, is a folder or a symlink, exists (unless
    ``overwrite``), or its nearest existing folder is not a writable folder."""
    path = _paths.output_path(output, overwrite, "path of the .keras file")
    if not path.endswith(".keras"):
        raise ValueError(f"output: {path!r}: with format='keras' (--format keras) expected a file name ending "
                         "in .keras (Keras 3 saves nothing else)")
    _paths.check_folder(path, "a .keras file")
    if os.path.islink(path):
        raise ValueError(f"output: {path!r} is a symlink; refusing to write through it")
    if os.path.isdir(path):
        raise ValueError(f"output: {path!r} is a folder; expected a .keras file name")
    if os.path.lexists(path) and not overwrite:
        raise ValueError(f"output: {path!r} exists; pass overwrite=True (--overwrite) to replace it")
    return path


def _model_class(layer):
    """``keras.Model`` for a Keras 3 ``layer``, else tf-keras' ``Model``."""
    if is_keras3(layer):
        import keras  # the layer is a Keras 3 object: Keras 3 is imported
        return keras.Model
    import tensorflow as tf  # under equivtool, tf.keras is tf-keras
    return tf.keras.Model


def check_keras_model(layer, optimizer) -> None:
    """Refuse (one line) what a ``.keras`` file cannot hold: a TF2 side that is
    not a ``Model`` (a bare layer), or an optimizer of the other Keras. Keras 3
    and tf-keras (2.13+, its native ``.keras`` format) each save their own
    model with its compiled optimizer, slots and ``iterations`` included."""
    if not isinstance(layer, _model_class(layer)):
        raise ValueError(f"format='keras': the TF2 side is a {type(layer).__module__}.{type(layer).__name__}; "
                         "a .keras file with the optimizer needs a Keras 3 keras.Model or a tf-keras "
                         "tf.keras.Model (a bare layer: write format='checkpoint')")
    if optimizer is not None and is_keras3(optimizer) != is_keras3(layer):
        model_keras, other = (("Keras 3", "keras.optimizers") if is_keras3(layer)
                              else ("tf-keras", "tf.keras.optimizers"))
        raise ValueError(f"format='keras': the optimizer is a {type(optimizer).__module__}."
                         f"{type(optimizer).__name__}; a {model_keras} model saves a {other} optimizer")


def write_keras(model, optimizer, output: str) -> str:
    """Save ``model`` (with ``optimizer`` as its compiled optimizer, when given) to
    ``output`` atomically; returns ``output``. Its folder exists (``convert``
    creates missing ones, and removes them again on failure)."""
    folder = os.path.dirname(output)
    temporary = None
    try:
        scratch.remove_stale(folder, "keras", hidden=True)  # temporary files of killed runs
        if optimizer is not None:
            model.compile(optimizer=optimizer)  # Keras saves the compiled optimizer, and only that one
        descriptor, temporary = tempfile.mkstemp(prefix=scratch.prefix("keras", hidden=True), suffix=".keras",
                                                 dir=folder)
        os.close(descriptor)
        try:
            model.save(temporary)
        except Exception as exc:  # noqa: BLE001 - Keras raises many kinds (an unserializable layer ...)
            raise ValueError(f"output: {'Keras 3' if is_keras3(model) else 'tf-keras'} could not save the "
                             "converted model to a .keras file: "
                             f"{short(exc)}") from None
        with _signals.shielded():  # a SIGTERM now waits until the rename is done
            if os.path.islink(output):
                raise ValueError(f"output: {output!r} became a symlink; refusing to write through it")
            os.replace(temporary, output)
            temporary = None
    except OSError as exc:
        raise ValueError(f"output: cannot write {output!r}: {short(exc)}") from None
    finally:
        with _signals.shielded():
            if temporary is not None:
                try:
                    os.unlink(temporary)
                except OSError:
                    pass
    return output
