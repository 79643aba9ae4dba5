"""Errors raised by the user's model, reported so that they point at the cause.

TensorFlow and tf-keras shorten tracebacks by default (``tf.debugging``'s
traceback filtering): the frames of TensorFlow, Keras and everything they call
are cut, and with them tf-slim's frames and often the user's own failing line.
A step runs with filtering off (:func:`unfiltered_tracebacks`), and its error
is summed up in one line naming the innermost frame of the user's code
(:func:`one_line`).
"""

from __future__ import annotations

import contextlib
import re
import traceback
from typing import Iterator, Optional

from equivtool._base.stack import innermost_user_frame, is_library_frame

# A frame line of TensorFlow's "in user code:" error messages (autograph).
_FRAME_LINE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_KERAS_WRAPPER = re.compile(r"^Exception encountered when calling layer .*$")
_LONG_MESSAGE = 200
# TensorFlow's error for a graph-only attribute read eagerly (Tensor.name, .graph, .op ...).
_GRAPH_ONLY = re.compile(
    r"\b(Tensor\.\w+|\w+) is (undefined|meaningless|not supported) when eager execution is enabled")
GRAPH_MODE_HINT = "this code needs graph mode: pass tf_function=True (CLI: --tf-function)"
# tf.function's error for a variable created on a retrace, as a scope renamed on every call gives.
_SINGLETON = "tf.function only supports singleton tf.Variables created on the first call"
SINGLETON_HINT = ("a variable scope that gets a new name on every call (variable_scope(None, default_name=...)) "
                  "does this: pass an explicit scope, or reuse")


@contextlib.contextmanager
def unfiltered_tracebacks() -> Iterator[None]:
    """Turn TensorFlow's and tf-keras' traceback filtering off for the block.

    The setting is per thread; the thread's own setting is put back on every
    exit path.
    """
    import tensorflow as tf

    was_enabled = tf.debugging.is_traceback_filtering_enabled()
    tf.debugging.disable_traceback_filtering()
    try:
        yield
    finally:
        if was_enabled:
            tf.debugging.enable_traceback_filtering()
        else:
            tf.debugging.disable_traceback_filtering()


def _chain(exc: BaseException) -> list:
    """``exc`` and the exceptions it was raised from or during, innermost cause last."""
    seen, chain = set(), []
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return chain


def user_location(exc: BaseException) -> Optional[str]:
    """``"path:line in function"`` of the innermost frame of the user's code behind ``exc``.

    Looks at the traceback of ``exc`` and of the exceptions it was raised from,
    then at the frames TensorFlow lists in an "in user code:" message (code
    that autograph converted runs from generated files, not the user's).
    """
    for item in _chain(exc):
        location = innermost_user_frame(traceback.extract_tb(item.__traceback__))
        if location:
            return location
    for item in _chain(exc):
        frames = [m for m in map(_FRAME_LINE.match, str(item).splitlines()) if m]
        for match in reversed(frames):
            if not is_library_frame(match["file"]):
                return f"{match['file']}:{match['line']} in {match['func']}"
    return None


def _summary(exc: BaseException) -> str:
    """The informative first line of an exception's message.

    Skips the frame listing of autograph's "in user code:" messages and the
    "Exception encountered when calling layer" line tf-keras puts first.
    """
    lines = [line.strip() for line in str(exc).splitlines()]
    name = type(exc).__name__
    if lines and lines[0] == "in user code:":
        # The message proper follows the frame listing, as "Name: text".
        starts = [i for i, line in enumerate(lines) if line.startswith(name + ":")]
        if starts:
            lines = [lines[starts[-1]][len(name) + 1:].strip()] + lines[starts[-1] + 1:]
    text = [line for line in lines if line]
    if text and _KERAS_WRAPPER.match(text[0]) and len(text) > 1:
        text = text[1:]
    return text[0] if text else ""


def short(exc: BaseException | str, limit: Optional[int] = 300) -> str:
    """``exc``'s message on one line (white space folded), at most ``limit`` characters (None: all)."""
    text = " ".join(str(exc).split())
    return text if limit is None or len(text) <= limit else text[:limit] + "..."


def one_line(exc: BaseException) -> str:
    """``"Name: first line of the message (at path:line in function)"``."""
    summary = _summary(exc)
    if len(summary) > _LONG_MESSAGE:  # its first sentence; the traceback keeps the rest
        sentence = re.match(r"(.+?[.!?])(\s|$)", summary)
        if sentence is not None:
            summary = sentence.group(1)
    if len(summary) > _LONG_MESSAGE:
        summary = summary[:_LONG_MESSAGE - 3] + "..."
    head = f"{type(exc).__name__}: {summary}" if summary else type(exc).__name__
    location = user_location(exc)
    line = head if location is None else f"{head} (at {location})"
    if needs_graph_mode(exc):
        line += f"; {GRAPH_MODE_HINT}"
    elif any(_SINGLETON in str(item) for item in _chain(exc)):
        line += f"; {SINGLETON_HINT}"
    return line


def needs_graph_mode(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is an eager read of a graph-only
    attribute, such as ``Tensor.name``, ``Tensor.graph`` or ``Tensor.op``."""
    return any(_GRAPH_ONLY.search(str(item)) for item in _chain(exc))


def full_traceback(exc: BaseException) -> str:
    """The whole traceback of ``exc``, chained exceptions included."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
