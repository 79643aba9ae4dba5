"""Keras 3's random numbers, drawn the way the TF1 graph draws them.

Keras 3 (the ``keras`` package) draws every random number through its
backend's stateless ops, seeded per initializer or per ``SeedGenerator`` from
Python's ``random``: not through ``random_seed.get_seed``, so a
:class:`~equivtool.seeding.DeterministicRandomTestTool` scope would leave its
initializers and dropout random, and a stateless op cannot draw the numbers
of TF1's stateful ``RandomUniform`` for any seed.

While a scope is open, :class:`Keras3RandomPatch` replaces the four functions
of Keras 3's TensorFlow backend that initializers and ``Dropout`` use
(``uniform``, ``normal``, ``truncated_normal``, ``dropout``) with the stateful
``tf.random``/``tf.nn.dropout`` ops a TF1 program builds for the same
distribution, with the same arithmetic (``minval + u * (maxval - minval)``,
``mean + n * stddev``, ``x / (1 - rate)`` where kept). Their seeds then come
from the tool, as every other op's do, and a Keras 3 ``GlorotUniform`` draws
bit for bit what ``tf.compat.v1.glorot_uniform_initializer`` draws. The
``seed`` a Keras 3 call passes is ignored inside the scope, as the tool
ignores every op's explicit seed. Other Keras 3 random functions
(``categorical``, ``randint``, ``shuffle``, gamma, binomial, beta) are left
as they are. A call on a thread other than the scope's gets Keras 3's own
function, and so does a call inside Keras 3's stateless scope: the symbolic
run by which a model infers its shapes on its first call reads its
not-yet-created variables' initial values there and throws them away, so a
seed handed out there would shift every later op's in ``num_random_ops``
mode. The originals are put back when the scope ends.
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

from equivtool._platform import tf_internals as _tfi

NAMES = ("uniform", "normal", "truncated_normal", "dropout")


def _dtype(dtype):
    if dtype is not None:
        return dtype
    import keras  # only reached from Keras 3's own functions, so it is imported
    return keras.config.floatx()


def _uniform(shape, minval=0.0, maxval=1.0, dtype=None, seed=None):
    dtype = _dtype(dtype)
    return tf.random.uniform(shape, minval=tf.cast(minval, dtype), maxval=tf.cast(maxval, dtype), dtype=dtype)


def _normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    return tf.random.normal(shape, mean=mean, stddev=stddev, dtype=_dtype(dtype))


def _truncated_normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    return tf.random.truncated_normal(shape, mean=mean, stddev=stddev, dtype=_dtype(dtype))


def _dropout(inputs, rate, noise_shape=None, seed=None):
    if rate == 1.0:
        return tf.zeros_like(inputs)
    if rate == 0.0:
        return inputs
    if noise_shape is not None:  # Keras 3 allows None for "the input's size here"
        dynamic = tf.shape(inputs)
        noise_shape = [dynamic[i] if size is None else size for i, size in enumerate(noise_shape)]
    return tf.nn.dropout(inputs, rate=rate, noise_shape=noise_shape)


_STATEFUL = {"uniform": _uniform, "normal": _normal, "truncated_normal": _truncated_normal, "dropout": _dropout}


class Keras3RandomPatch:
    """The replacement of Keras 3's backend random functions for one scope.

    ``owns()`` says whether the calling thread is the scope's; ``install()``
    and ``restore()`` are called under the tool's lock, ``restore()`` on every
    exit path (it puts back exactly what ``install()`` replaced)."""

    def __init__(self, owns: Callable[[], bool]):
        self._owns = owns
        self._module = None
        self._saved: dict = {}

    def install(self) -> None:
        module = _tfi.keras3_random_backend()
        if module is None:
            return
        self._module = module
        for name in NAMES:
            original = getattr(module, name)
            self._saved[name] = original
            setattr(module, name, self._wrap(_STATEFUL[name], original))

    def _wrap(self, stateful: Callable, original: Callable) -> Callable:
        owns = self._owns

        def draw(*args, **kwargs):
            if owns() and not _tfi.keras3_in_stateless_scope():
                return stateful(*args, **kwargs)
            return original(*args, **kwargs)
        draw.__wrapped__ = original
        draw.__name__ = original.__name__
        return draw

    def restore(self) -> None:
        module, saved = self._module, self._saved
        self._module, self._saved = None, {}
        for name, original in saved.items():
            setattr(module, name, original)
