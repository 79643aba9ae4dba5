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


class DiskFilled(DumpFailed):
    """The disk filled up while the values were written (files empty or cut short)."""


# Free space kept beyond the values themselves: the file system's blocks and
# metadata, tfdbg's event framing, and whatever else writes to the same disk.
MARGIN_BYTES = 16 << 20
PER_FILE_BYTES = 4096
# Less than this free after a dump: the disk filled up (a writer may have cut a file short).
FULL_BYTES = 1 << 20


def _filled(folder: str, files) -> str:
    """Why the dump under ``folder`` looks cut short by a full disk ("" when it does not)."""
    empty = [f for f in files if os.path.isfile(f) and os.path.getsize(f) == 0]
    free = shutil.disk_usage(folder).free
    if empty:
        return f"{len(empty)} of {len(files)} value files are empty ({free / 2**20:.1f} MiB free on {folder!r})"
    if free < FULL_BYTES:
        return f"the disk of {folder!r} filled up ({free / 2**20:.1f} MiB free) while the values were written"
    return ""


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
        if _filled(folder, []):
            raise DiskFilled(f"{_filled(folder, [])}: {short(exc)}") from None
        raise DumpFailed(f"running the model with every node watched failed: {short(exc)}") from None
    dumped = _tf_internals.debug_data.DebugDumpDir(folder, validate=False)
    reason = _filled(folder, [d.file_path for d in dumped.dumped_tensor_data])
    if reason:  # tfdbg leaves empty or short files on a full disk, and says nothing
        raise DiskFilled(reason)
    have = {(d.node_name, d.output_slot) for d in dumped.dumped_tensor_data}
    missing = [t for t in tensors if (t.op.name, t.value_index) not in have]
    saved = save_in_windows(missing, fetch, os.path.join(folder, "fetched"), budget_bytes)

    def read(tensor):
        if tensor.name in saved:
            return np.load(saved[tensor.name], allow_pickle=False)
        try:
            return dumped.get_tensors(tensor.op.name, tensor.value_index, "DebugIdentity")[0]
        except Exception as exc:  # noqa: BLE001 - a file cut short: not the model's fault
            raise DumpFailed(f"the dumped value of {tensor.name} cannot be read back: {short(exc)}") from None

    return read


def save_in_windows(tensors, fetch, folder, budget_bytes) -> dict:
    """``tensors`` fetched in windows of at most ``budget_bytes`` of static size
    (:func:`equivtool.exported._recorder.windows`) and saved as .npy files under
    ``folder``: tensor name -> file."""
    saved = {}
    if tensors:
        os.makedirs(folder, exist_ok=True)
    for window in _recorder.windows(tensors, budget_bytes):
        values = [np.asarray(v) for v in fetch(window)]
        check_room(folder, sum(v.nbytes + PER_FILE_BYTES for v in values))  # the real sizes, before writing
        for tensor, value in zip(window, values):
            saved[tensor.name] = os.path.join(folder, f"{len(saved)}.npy")
            np.save(saved[tensor.name], value, allow_pickle=False)
        del values
    return saved


def function_dump(wrapped, feeds, values, tensors, folder, graph_rewrites):
    """Every tensor of ``tensors`` computed in one call of the inlined function, each
    written to ``folder`` as it is computed: a ``SerializeTensor`` and ``WriteFile``
    per tensor added to the function's own graph (made for this view, no one
    else's), the function pruned to those writes."""
    import tensorflow as tf
    from equivtool._platform import graph_rewrites as _graph_rewrites
    from equivtool._platform import tf_internals as _tf_internals
    files, writes = {}, []
    with wrapped.graph.as_default(), tf.name_scope("equivtool_dump"):
        for tensor in tensors:
            files[tensor.name] = os.path.join(folder, f"{len(files)}.pb")
            writes.append(tf.io.write_file(files[tensor.name], tf.io.serialize_tensor(tensor)))
    try:
        pruned = wrapped.prune(feeds=feeds, fetches=writes)
        with _graph_rewrites.function_rewrites(graph_rewrites):
            pruned(*values)
    except (tf.errors.OpError, ValueError) as exc:
        if _filled(folder, []) or "No space left" in str(exc):
            raise DiskFilled(f"{_filled(folder, []) or 'no space left'}: {short(exc)}") from None
        raise DumpFailed(f"running the model with every node written failed: {short(exc)}") from None
    reason = _filled(folder, list(files.values()))
    if reason:
        raise DiskFilled(reason)

    def read(tensor):
        proto = _tf_internals.TensorProto()
        try:
            with open(files[tensor.name], "rb") as f:
                proto.ParseFromString(f.read())
        except Exception as exc:  # noqa: BLE001 - a file cut short: not the model's fault
            raise DumpFailed(f"the dumped value of {tensor.name} cannot be read back: {short(exc)}") from None
        return tf.make_ndarray(proto)

    return read


def estimated_bytes(tensors, batch: int) -> int:
    """What writing ``tensors`` takes, from their static shapes with an unknown first
    dimension as ``batch`` and any other unknown dimension as 1 (a lower bound)."""
    return sum(_recorder.static_size(tensor, batch) for tensor in tensors)


def shapes_known(tensors) -> bool:
    """Every tensor's static shape is known but for its first dimension (the batch):
    the static estimate is then the size. Otherwise a dimension counted as 1 may
    hold thousands (an image of unknown height and width)."""
    return all(t.shape.rank is not None and all(d is not None for d in t.shape.as_list()[1:]) for t in tensors)


def needed_bytes(view, tensors, batch: int) -> int:
    """What writing ``tensors`` takes on disk: their sizes from the static shapes
    when those are known (:func:`shapes_known`), else as measured by one run of the
    view that keeps no value (``view.measure``; a tensor it could not measure: its
    static estimate), plus a block per file."""
    sizes = None
    if not shapes_known(tensors) and view.measure is not None:
        sizes = view.measure(tensors)
    if sizes is None:
        sizes = [None] * len(tensors)
    return sum((_recorder.static_size(t, batch) if size is None else size) + PER_FILE_BYTES
               for t, size in zip(tensors, sizes))


def session_sizes(session, feed_dict, tensors) -> list:
    """The byte size of each tensor of ``tensors`` in one run of ``session`` that
    keeps no value (the run's step statistics name every output's shape); None
    for a tensor the executed graph no longer has (a node Grappler rewrote)."""
    import tensorflow as tf
    metadata = tf.compat.v1.RunMetadata()
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    targets = list({t.op.name: t.op for t in tensors}.values())
    try:
        session.run(targets, feed_dict=feed_dict, options=options, run_metadata=metadata)
    except (tf.errors.OpError, ValueError) as exc:
        raise DumpFailed(f"running the model to measure its nodes failed: {short(exc)}") from None
    shapes = {}
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            for out in node.output:
                shapes[(node.node_name, out.slot)] = [d.size for d in out.tensor_description.shape.dim]
    found = []
    for tensor in tensors:
        shape = shapes.get((tensor.op.name, tensor.value_index))
        found.append(None if shape is None or any(d < 0 for d in shape) else
                     int(np.prod(shape, dtype=np.int64)) * tensor.dtype.size)
    return found


def function_sizes(wrapped, feeds, values, tensors, graph_rewrites) -> list:
    """The byte size of each tensor of ``tensors`` in one call of the inlined
    function pruned to their shapes (``tf.shape`` ops added to the view's own graph)."""
    import tensorflow as tf
    from equivtool._platform import graph_rewrites as _graph_rewrites
    with wrapped.graph.as_default(), tf.name_scope("equivtool_shapes"):
        shapes = [tf.shape(t, out_type=tf.int64) for t in tensors]
    try:
        pruned = wrapped.prune(feeds=feeds, fetches=shapes)
        with _graph_rewrites.function_rewrites(graph_rewrites):
            found = pruned(*values)
    except (tf.errors.OpError, ValueError) as exc:
        raise DumpFailed(f"running the model to measure its nodes failed: {short(exc)}") from None
    return [int(np.prod(s.numpy(), dtype=np.int64)) * t.dtype.size for t, s in zip(tensors, found)]


class NotEnoughDisk(Exception):
    """The folder's disk cannot hold the values (the localization is then inconclusive)."""


def check_room(folder: str, needed: int) -> None:
    """Refuse, before anything is written, when ``folder``'s disk cannot hold ``needed``
    bytes and keep :data:`MARGIN_BYTES` free."""
    free = shutil.disk_usage(folder).free
    if needed + MARGIN_BYTES > free:
        raise NotEnoughDisk(
            f"--localize: the node values need about {needed / 2**20:.1f} MiB of disk (plus "
            f"{MARGIN_BYTES >> 20} MiB kept free), and {folder!r} has {free / 2**20:.1f} MiB free; "
            "point TMPDIR at a larger disk")
