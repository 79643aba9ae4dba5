"""A tf-slim network as a TF2 shim layer, in one call.

The guide's first migration step runs the TF1 code unchanged inside a Keras
layer whose ``call`` is decorated with ``track_tf1_style_variables``.
:func:`slim_shim` does that for a slim network function (anything shaped like
``tf_slim.nets``: ``fn(inputs, <num_classes ...>, is_training=..., scope=...)``
returning ``(net, end_points)``), under the slim ``arg_scope`` the network is
meant to be built in::

    from tf_slim.nets import vgg
    make = lambda: equivtool.slim_shim(vgg.vgg_16, vgg.vgg_arg_scope(), num_classes=10)
    report = equivtool.check_equivalence(make().tf1_fn, make, images)

The layer:

* passes ``training`` as the network's ``is_training`` (``training_arg``);
* removes its own name scope (the layer's name, added by Keras around ``call``)
  from the end-point keys, so they read as the TF1 graph's
  (``vgg_16/pool1``, not ``vgg_16_shim/vgg_16/pool1``);
* empties, after each eager call, the ``*_end_points`` collections the network
  filled in TensorFlow's global eager graph (slim nets collect end points
  there; left alone, every eager call would keep its activations alive);
* offers :attr:`SlimShim.tf1_fn`, the same network built in a TF1 graph,
  in the form ``check_equivalence`` takes.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import equivtool  # noqa: F401  (environment fix before TensorFlow)
import tensorflow as tf
import tf_slim

__all__ = ["slim_shim", "SlimShim", "SlimNet"]

ArgScope = Mapping | Callable[[], Mapping] | None


def _check(fn, arg_scope, training_arg, name) -> None:
    if not callable(fn):
        raise TypeError(f"fn: expected a slim network function such as tf_slim.nets.vgg.vgg_16, "
                        f"got {type(fn).__name__}")
    if arg_scope is not None and not (isinstance(arg_scope, Mapping) or callable(arg_scope)):
        raise TypeError("arg_scope: expected a slim arg scope (the dict an *_arg_scope() function returns), "
                        f"a zero-argument callable returning one, or None; got {type(arg_scope).__name__}")
    if training_arg is not None:
        if not isinstance(training_arg, str):
            raise TypeError(f"training_arg: expected the name of fn's training flag (a str) or None, "
                            f"got {type(training_arg).__name__}")
        try:
            parameters = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            parameters = None
        if parameters is not None and training_arg not in parameters and not any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            raise ValueError(f"training_arg: {fn.__name__} has no parameter {training_arg!r}; pass the name "
                             "of its training flag, or training_arg=None if it has none")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name: expected a str or None, got {type(name).__name__}")


def _strip_prefix(outputs, prefix: str):
    """End-point dicts (anywhere in the outputs) with ``prefix`` removed from their keys."""
    if not prefix:
        return outputs
    if isinstance(outputs, Mapping):
        return type(outputs)((k[len(prefix):] if isinstance(k, str) and k.startswith(prefix) else k,
                              _strip_prefix(v, prefix)) for k, v in outputs.items())
    if isinstance(outputs, tuple) and not hasattr(outputs, "_fields"):
        return tuple(_strip_prefix(v, prefix) for v in outputs)
    if isinstance(outputs, list):
        return [_strip_prefix(v, prefix) for v in outputs]
    return outputs


class SlimNet:
    """``net(inputs, training)``: ``fn`` built in the current graph under its arg scope,
    ``training`` passed as ``training_arg``."""

    def __init__(self, fn: Callable, arg_scope: ArgScope, training_arg: str | None, kwargs: Mapping):
        self.fn, self.arg_scope, self.training_arg, self.kwargs = fn, arg_scope, training_arg, dict(kwargs)

    def __call__(self, inputs, training):
        kwargs = dict(self.kwargs)
        if self.training_arg is not None:
            kwargs[self.training_arg] = bool(training)
        scope = self.arg_scope() if callable(self.arg_scope) else self.arg_scope
        if scope is None:
            return self.fn(inputs, **kwargs)
        with tf_slim.arg_scope(scope):
            return self.fn(inputs, **kwargs)

    def __repr__(self) -> str:
        return f"SlimNet({getattr(self.fn, '__name__', self.fn)!r})"


class SlimShim(tf.keras.layers.Layer):
    """A slim network run as TF1 code inside a Keras layer (see :func:`slim_shim`)."""

    def __init__(self, fn: Callable, arg_scope: ArgScope = None, *, training_arg: str | None = "is_training",
                 name: str | None = None, **kwargs: Any):
        _check(fn, arg_scope, training_arg, name)
        super().__init__(name=name or f"{getattr(fn, '__name__', 'slim_net')}_shim")
        # Set past Keras' attribute tracking, which would wrap the user's arg-scope
        # dict's values in trackable _DictWrappers, in place.
        for attribute, value in (("fn", fn), ("arg_scope", arg_scope), ("training_arg", training_arg),
                                 ("fn_kwargs", dict(kwargs))):
            object.__setattr__(self, attribute, value)
        object.__setattr__(self, "_net", SlimNet(fn, arg_scope, training_arg, self.fn_kwargs))

    def _build_net(self, inputs, training: bool):
        return self._net(inputs, training)

    @tf.compat.v1.keras.utils.track_tf1_style_variables
    def call(self, inputs, training=None):
        prefix = tf.get_current_name_scope()
        graph = tf.compat.v1.get_default_graph()
        eager = tf.executing_eagerly()
        sizes = {key: len(graph.get_collection(key)) for key in graph.get_all_collection_keys()} if eager else {}
        try:
            outputs = self._build_net(inputs, bool(training))
        finally:
            if eager:
                for key in graph.get_all_collection_keys():
                    if isinstance(key, str) and key.endswith("_end_points"):
                        del graph.get_collection_ref(key)[sizes.get(key, 0):]
        return _strip_prefix(outputs, prefix + "/" if prefix else "")

    @property
    def tf1_fn(self) -> "SlimNet":
        """The same network built in the current TF1 graph: ``check_equivalence``'s
        ``tf1_fn`` (a plain picklable object, so it travels to worker processes)."""
        return self._net


def slim_shim(fn: Callable, arg_scope: ArgScope = None, *, training_arg: str | None = "is_training",
              name: str | None = None, **kwargs: Any) -> SlimShim:
    """Wrap a tf-slim network function as a TF2 shim layer.

    Args:
      fn: the network, e.g. ``tf_slim.nets.inception.inception_v3``.
      arg_scope: the slim arg scope to build it in (e.g.
        ``inception.inception_v3_arg_scope()``), a zero-argument callable
        returning one (called at every build), or ``None``.
      training_arg: the name of ``fn``'s training flag, given the layer's
        ``training`` (``None``: ``fn`` takes none).
      name: the layer's name (default ``<fn name>_shim``).
      **kwargs: passed to ``fn`` on every call (``num_classes=10``,
        ``spatial_squeeze=False``, ...).

    Returns:
      A new layer; ``layer(inputs, training=...)`` returns what ``fn`` returns,
      with the layer's own name scope removed from end-point keys, and
      ``layer.tf1_fn`` builds the same network in a TF1 graph.
    """
    return SlimShim(fn, arg_scope, training_arg=training_arg, name=name, **kwargs)
