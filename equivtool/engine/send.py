"""Sending a check's arguments to a worker process (see ``equivtool.engine.workers``;
:func:`equivtool.engine.options.check_sendable` refuses, up front, what cannot cross).

cloudpickle sends lambdas, closures and functions of ``__main__`` by value and
importable functions by reference. Two things in TF1 code need more:

* **Library functions that misname themselves.** TensorFlow's dispatch
  wrappers copy the wrapped op's names (``tf.nn.relu`` says it is
  ``gen_nn_ops.relu``, which is another object), so cloudpickle would copy them
  by value and fail on the dispatcher they hold. They are looked up in the
  loaded TensorFlow/Keras/tf-slim modules and sent by reference.
* **tf-slim arg scopes.** An arg scope is a dict keyed by ``str(op)``, e.g.
  ``"<function convolution2d at 0x7f...>"``: the address is this process's.
  Unpickled elsewhere, no op would find its defaults and the network would
  be built without them, silently (both sides alike, if both carry the
  dict). Such a dict is sent as ``[(op reference, defaults)]`` and keyed
  again with the receiving process's ops; a key whose op cannot be found by
  reference is refused, never sent as is.
"""

from __future__ import annotations

import collections
import importlib
import io
import os
import pickle
import re
import socket
import sys
import types
from collections.abc import Mapping

_LIBRARIES = ("tensorflow", "tf_keras", "tf_slim", "keras")
_ARG_SCOPE_KEY = re.compile(r"<function [\w.<>]+ at 0x[0-9a-f]+>")
_index: dict = {}


class UnsendableArgScope(TypeError):
    pass


def _indexed(kind: str, modules, key) -> dict:
    """``{key(value): (module, attribute)}`` over the callables of ``modules``, built once per kind."""
    if kind not in _index:
        found: dict = {}
        for name, module in list(sys.modules.items()):
            if module is None or not modules(name):
                continue
            for attribute, value in list(getattr(module, "__dict__", {}).items()):
                if callable(value) and not isinstance(value, type):
                    try:
                        found.setdefault(key(value), (name, attribute))
                    except Exception:  # an object whose attributes raise
                        continue
        _index[kind] = found
    return _index[kind]


def _library_reference(function) -> tuple | None:
    index = _indexed("library", lambda name: name.split(".")[0] in _LIBRARIES, id)
    return index.get(id(function))


def _arg_scope_op(key: str) -> tuple | None:
    """Where the op whose arg-scope key is ``key`` lives (any loaded module)."""
    def op_key(value):
        return getattr(value, "_key_op", None) if isinstance(value, types.FunctionType) else None
    index = _indexed("arg_scope", lambda name: True, op_key)
    found = index.get(key)
    if found is None:  # an op defined (or loaded) since the index was built
        _index.pop("arg_scope", None)
        found = _indexed("arg_scope", lambda name: True, op_key).get(key)
    return found


def resolve(module: str, attribute: str):
    return getattr(importlib.import_module(module), attribute)


def _is_arg_scope(value) -> bool:
    """A dict (or a Keras-tracked ``_DictWrapper``) keyed by ``str(op)``, of keyword defaults."""
    return (isinstance(value, Mapping) and bool(value)
            and all(isinstance(k, str) and _ARG_SCOPE_KEY.fullmatch(k) for k in value)
            and all(isinstance(v, Mapping) for v in value.values()))


def _code_with_its_file(code: types.CodeType):
    """cloudpickle's reduction of a code object, keeping the file it was defined in.

    cloudpickle 3.1.3 sends every function it copies by value with its file
    replaced by ``<dynamic-code>`` (for deterministic payloads), so an error
    raised in a worker by a function defined in ``__main__``, a test or a closure
    would name no file, where the same check in one process names the user's.
    """
    import cloudpickle
    constructor, args = cloudpickle.Pickler.dispatch_table[types.CodeType](code)
    return constructor, tuple(code.co_filename if arg == "<dynamic-code>" else arg for arg in args)


def dumps(value) -> bytes:
    import cloudpickle

    class Pickler(cloudpickle.Pickler):
        dispatch_table = collections.ChainMap({types.CodeType: _code_with_its_file},
                                              cloudpickle.Pickler.dispatch_table)

        def reducer_override(self, obj):
            if isinstance(obj, types.FunctionType) and \
                    str(getattr(obj, "__module__", "")).split(".")[0] in _LIBRARIES:
                try:
                    named = resolve(obj.__module__, obj.__qualname__) is obj
                except (ImportError, AttributeError):
                    named = False
                reference = None if named else _library_reference(obj)
                if reference is not None:
                    return resolve, reference
            return super().reducer_override(obj)

        def persistent_id(self, obj):
            if not _is_arg_scope(obj):
                return None
            ops = []
            for key, defaults in obj.items():
                where = _arg_scope_op(key)
                if where is None:
                    raise UnsendableArgScope(
                        f"it holds a tf-slim arg scope for {key}, an op that another process cannot find "
                        "by module and name (arg scopes are keyed by this process's addresses)")
                ops.append((where, dict(defaults)))
            return ("equivtool.arg_scope", ops)

    buffer = io.BytesIO()
    Pickler(buffer).dump(value)
    return buffer.getvalue()


def loads(payload: bytes):
    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid):
            kind, ops = pid
            if kind != "equivtool.arg_scope":
                raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
            from tf_slim.ops.arg_scope import arg_scope_func_key
            return {arg_scope_func_key(resolve(*where)): defaults for where, defaults in ops}

    return Unpickler(io.BytesIO(payload)).load()


# --------------------------------------------------------------------------
# Captures coming back: arrays' data out of band
# --------------------------------------------------------------------------

# A capture holds a model's worth of arrays (a training step's variable values, the
# gradients). Pickled whole, each array's data is copied into the pickle, read back a
# piece at a time into another buffer and copied again into the unpickled array:
# about 1 s per 200 MB for alexnet_v2 with both cores busy, on the worker's last job.
# Pickle protocol 5 hands the data of contiguous arrays out of band instead: the
# message goes as before, each buffer straight from the array into the socket and
# from the socket into the array the receiver keeps.
_RAW = "equivtool.raw_buffers"


def send_with_buffers(conn, message) -> None:
    """``conn.send(message)`` (``conn`` a ``multiprocessing`` connection over a
    socket), the data of the arrays in it written raw after it; read it with
    :func:`receive`."""
    buffers: list = []
    head = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    conn.send((_RAW, head, [raw.nbytes for raw in raws]))
    if raws:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            for raw in raws:
                sock.sendall(raw)


def receive(conn):
    """The next message on ``conn``, whether sent by ``conn.send`` or by
    :func:`send_with_buffers`; ``EOFError`` when the sender is gone part way."""
    message = conn.recv()
    if not (isinstance(message, tuple) and len(message) == 3 and message[0] == _RAW):
        return message
    _, head, sizes = message
    buffers = [bytearray(size) for size in sizes]
    if buffers:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            for buffer in buffers:
                view, got = memoryview(buffer), 0
                while got < len(buffer):
                    count = sock.recv_into(view[got:])
                    if count == 0:
                        raise EOFError(f"the sender closed the connection {len(buffer) - got} bytes short")
                    got += count
    return pickle.loads(head, buffers=buffers)
