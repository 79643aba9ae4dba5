"""A graph's node values computed in one run and written to a folder as they are computed.

``--localize`` compares every node of two exported models; holding them all
would take the memory of every activation twice, and fetching them in windows
re-runs the model per window. Instead each side runs once with every compared
tensor written out as it is computed, and the values are read back one at a
time (:func:`equivtool.exported._localize.localize`):

* a TF1 session: tfdbg v1's file watches (``DebugIdentity``, added by
  TensorFlow to the executed copy of the graph; the loaded graph is unchanged);
* a TF2 signature inlined into its own graph: a ``SerializeTensor`` and
  ``WriteFile`` per tensor, the function pruned to those writes.
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from equivtool.exported import _recorder
from equivtool.exported._errors import short


class DumpFailed(Exception):
    """The dumping run failed (the localization is then inconclusive; the outputs' verdict stands)."""


def session_dump(session, graph, feed_dict, tensors, folder, budget_bytes, fetch):
    """Every tensor of ``tensors`` computed in one ``session.run``, each written to
    ``folder`` as it is computed, by tfdbg's ``DebugIdentity`` watches
    (``debug_utils.watch_graph``: TensorFlow adds them to the executed copy of the
    graph, the loaded graph is not changed). A tensor the executed graph no longer
    has (a node Grappler rewrote, under ``graph_rewrites="tensorflow_default"``) is
    fetched by name instead, in windows of ``budget_bytes``, and saved there too."""
    import re

    import tensorflow as tf
    from equivtool._platform import tf_internals as _tf_internals
    nodes = sorted({t.op.name for t in tensors})
    options = tf.compat.v1.RunOptions()
    _tf_internals.debug_utils.watch_graph(
        options, graph, debug_ops=["DebugIdentity"], debug_urls=["file://" + os.path.abspath(folder)],
        node_name_regex_allowlist="^(" + "|".join(re.escape(n) for n in nodes) + ")$")
    targets = list({t.op.name: t.op for t in tensors}.values())
    try:
        session.run(targets, feed_dict=feed_dict, options=options)
    except (tf.errors.OpError, ValueError) as exc:
        raise DumpFailed(f"running the model with every node watched failed: {short(exc)}") from None
    dumped = _tf_internals.debug_data.DebugDumpDir(folder, validate=False)
    have = {(d.node_name, d.output_slot) for d in dumped.dumped_tensor_data}
    missing = [t for t in tensors if (t.op.name, t.value_index) not in have]
    saved = save_in_windows(missing, fetch, os.path.join(folder, "fetched"), budget_bytes)

    def read(tensor):
        if tensor.name in saved:
            return np.load(saved[tensor.name], allow_pickle=False)
        return dumped.get_tensors(tensor.op.name, tensor.value_index, "DebugIdentity")[0]

    return read


def save_in_windows(tensors, fetch, folder, budget_bytes) -> dict:
    """``tensors`` fetched in windows of at most ``budget_bytes`` of static size
    (:func:`equivtool.exported._recorder.windows`) and saved as .npy files under
    ``folder``: tensor name -> file."""
    saved = {}
    if tensors:
        os.makedirs(folder, exist_ok=True)
    for window in _recorder.windows(tensors, budget_bytes):
        for tensor, value in zip(window, fetch(window)):
            saved[tensor.name] = os.path.join(folder, f"{len(saved)}.npy")
            np.save(saved[tensor.name], np.asarray(value), allow_pickle=False)
    return saved


def function_dump(wrapped, feeds, values, tensors, folder, graph_rewrites):
    """Every tensor of ``tensors`` computed in one call of the inlined function, each
    written to ``folder`` as it is computed: a ``SerializeTensor`` and ``WriteFile``
    per tensor added to the function's own graph (made for this view, no one
    else's), the function pruned to those writes."""
    import tensorflow as tf
    from equivtool._platform import execution as _execution
    from equivtool._platform import tf_internals as _tf_internals
    files, writes = {}, []
    with wrapped.graph.as_default(), tf.name_scope("equivtool_dump"):
        for tensor in tensors:
            files[tensor.name] = os.path.join(folder, f"{len(files)}.pb")
            writes.append(tf.io.write_file(files[tensor.name], tf.io.serialize_tensor(tensor)))
    try:
        pruned = wrapped.prune(feeds=feeds, fetches=writes)
        with _execution.function_rewrites(graph_rewrites):
            pruned(*values)
    except (tf.errors.OpError, ValueError) as exc:
        raise DumpFailed(f"running the model with every node written failed: {short(exc)}") from None

    def read(tensor):
        proto = _tf_internals.TensorProto()
        with open(files[tensor.name], "rb") as f:
            proto.ParseFromString(f.read())
        return tf.make_ndarray(proto)

    return read


def estimated_bytes(tensors, batch: int) -> int:
    """What writing ``tensors`` takes, from their static shapes with an unknown first
    dimension as ``batch`` and any other unknown dimension as 1 (a lower bound)."""
    return sum(_recorder.static_size(tensor, batch) for tensor in tensors)


class NotEnoughDisk(Exception):
    """The folder's disk cannot hold the values (the localization is then inconclusive)."""


def check_room(folder: str, needed: int) -> None:
    """Refuse, before anything is written, when ``folder``'s disk cannot hold ``needed`` bytes."""
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise NotEnoughDisk(
            f"--localize: the node values need about {needed / 2**20:.0f} MiB of disk, and {folder!r} has "
            f"{free / 2**20:.0f} MiB free; point TMPDIR at a larger disk")
