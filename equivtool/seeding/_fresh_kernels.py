"""The random tool's eager random ops, drawn without clearing TensorFlow's kernel cache.

In ``constant`` mode the tool (as the guide's) calls ``tf.random.set_seed``
before every random op. Eagerly that also clears the eager context's kernel
cache, and it must: a stateful random op's kernel keeps its Philox state
between calls, so a second ``RandomUniform`` with the same ``(seed, seed2)``
would continue the first one's stream instead of drawing the same values. But
the clear drops *every* cached kernel, so each op after it builds its kernel
again: a model created eagerly in constant mode ran at about half the speed it
runs in ``num_random_ops`` mode (Inception-ResNet-v2, 8.7 s against 4.6 s for
one training call of a fresh layer).

A stateful op's first call from a fresh kernel draws from
``PhiloxRandom(key=seed, counter=(0, seed2))``, which is what the stateless V2
op of the same distribution draws given that key and counter, with the same
sampling code. So while a constant-mode scope is open, the four TensorFlow
kernels behind ``tf.random.uniform``, ``tf.random.normal`` and
``tf.random.truncated_normal`` (``RandomUniform``, ``RandomUniformInt``,
``RandomStandardNormal``, ``TruncatedNormal``) run as their stateless V2 twins
for exactly the call the tool has just handed seeds to, when that call runs
eagerly on the scope's thread with no op callback installed (localization's
taps see the stateful op the TF1 graph has): the same bits as a fresh kernel
(``tests/test_seeding_fresh_kernels.py`` compares them with the kernel-cache
clear for every dtype, shape and seed drawn), and no clear. Any other random
op (``tf.random.shuffle``, gamma, multinomial, a raw op called directly), and
every op in a graph or ``tf.function`` trace, takes the tool's ordinary path,
the clear included.

``num_random_ops`` mode gives every op seeds of its own, so it clears the cache
only once, as its scope opens (a kernel cached by an earlier scope with the
same seeds would continue that one's stream). Served draws need no such
clear, so eagerly the scope owes it until the first draw that is not served
and makes it then (``tf.random.shuffle``, a trace): a fresh layer built in that
mode no longer rebuilds every kernel it runs. Raw ops called with seeds of
their own never ask the tool for seeds, in either mode, and keep their cached
kernels' streams as they do between calls.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

from equivtool._platform import tf_internals as _tfi

#: gen_random_ops function -> (its stateless V2 twin in gen_stateless_random_ops_v2, the op type it creates).
TWINS = {
    "random_uniform": ("stateless_random_uniform_v2", "RandomUniform"),
    "random_uniform_int": ("stateless_random_uniform_int_v2", "RandomUniformInt"),
    "random_standard_normal": ("stateless_random_normal_v2", "RandomStandardNormal"),
    "truncated_normal": ("stateless_truncated_normal_v2", "TruncatedNormal"),
}
#: The public wrappers whose kernel call is one of TWINS (the frames that may skip the clear).
WRAPPERS = ("random_uniform", "random_normal", "truncated_normal")
_PHILOX = 1  # the stateless ops' algorithm number for Philox
_UINT64 = 2**64


@functools.lru_cache(maxsize=None)
def wrapper_codes() -> frozenset:
    """The code objects of :data:`WRAPPERS` (their decorators unwrapped)."""
    import inspect

    module = _tfi.random_ops
    return frozenset(inspect.unwrap(getattr(module, name)).__code__ for name in WRAPPERS)


def philox_state(seed: int, seed2: int) -> tuple:
    """The stateless ops' ``(key, counter)`` tensors for a stateful kernel's first
    draw with attributes ``seed`` and ``seed2`` (both int64, read as uint64)."""
    import tensorflow as tf

    return (tf.constant([seed % _UINT64], tf.uint64), tf.constant([0, seed2 % _UINT64], tf.uint64))


class FreshKernels:
    """The replacement of :data:`TWINS` for one scope.

    :meth:`expect` arms it for one call with the given seeds (the tool asks
    :meth:`can_serve` first, and skips the cache clear only then); the next call
    of a replaced function with exactly those seeds is served by the twin, and
    any call disarms it. ``install()`` and
    ``restore()`` run under the tool's lock, ``restore()`` on every exit path."""

    def __init__(self, owns: Callable[[], bool]):
        self._owns = owns
        self._saved: dict = {}
        self._armed: Optional[tuple] = None

    def can_serve(self, caller) -> bool:
        """Whether a draw made now by the wrapper whose code is ``caller`` can be served: one
        of :data:`WRAPPERS`, eagerly, on the scope's thread, with no op callback installed
        (localization's taps see the stateful op the TF1 graph has)."""
        import tensorflow as tf

        return (caller in wrapper_codes() and tf.executing_eagerly() and self._owns()
                and not _tfi.op_callbacks.should_invoke_op_callbacks())

    def expect(self, seeds: tuple) -> None:
        """The next draw with ``seeds`` is served (the tool has skipped its cache clear)."""
        self._armed = seeds

    def install(self) -> None:
        module = _tfi.gen_random_ops
        twins = _tfi.gen_stateless_random_ops_v2
        for name, (twin, op_type) in TWINS.items():
            original = getattr(module, name)
            self._saved[name] = original
            setattr(module, name, self._wrap(original, getattr(twins, twin), name == "random_uniform_int", op_type))

    def _wrap(self, original: Callable, twin: Callable, integer: bool, op_name: str) -> Callable:
        """``op_name``: the stateful op's type, the twin's default name (as a profile names it)."""
        def served(seed, seed2) -> bool:
            if not self._owns():  # another thread's draw: neither served nor disarming
                return False
            # Armed means the tool skipped the cache clear for this call: it must be served.
            armed, self._armed = self._armed, None
            return armed == (seed, seed2)

        if integer:
            def draw(shape, minval, maxval, seed=0, seed2=0, name=None):
                if not served(seed, seed2):
                    return original(shape, minval, maxval, seed=seed, seed2=seed2, name=name)
                key, counter = philox_state(seed, seed2)
                return twin(shape=shape, key=key, counter=counter, alg=_PHILOX, minval=minval, maxval=maxval,
                            name=name or op_name)
        else:
            def draw(shape, dtype, seed=0, seed2=0, name=None):
                if not served(seed, seed2):
                    return original(shape, dtype, seed=seed, seed2=seed2, name=name)
                key, counter = philox_state(seed, seed2)
                return twin(shape=shape, key=key, counter=counter, alg=_PHILOX, dtype=dtype, name=name or op_name)
        draw.__wrapped__ = original
        draw.__name__ = original.__name__
        return draw

    def restore(self) -> None:
        module, saved = _tfi.gen_random_ops, self._saved
        self._saved, self._armed = {}, None
        for name, original in saved.items():
            setattr(module, name, original)
