"""Captures coming back from a worker: arrays' data sent out of band (engine/send.py),
every value as it was sent, and a sender gone part way is an EOFError, never a short array."""

import socket
import threading
from multiprocessing.connection import Connection

import numpy as np
import pytest

from equivtool.engine.send import receive, send_with_buffers


def _pair():
    a, b = socket.socketpair()
    return Connection(a.detach()), Connection(b.detach())


def _sent(message):
    sender, receiver = _pair()
    # a thread: a message larger than the socket's buffer waits for its reader
    thread = threading.Thread(target=send_with_buffers, args=(sender, message))
    thread.start()
    try:
        return receive(receiver)
    finally:
        thread.join()
        sender.close()
        receiver.close()


def test_every_array_comes_back_equal_contiguous_or_not():
    rng = np.random.RandomState(0)
    big = rng.rand(3_000_000).astype(np.float32)  # 12 MB: many socket buffers
    message = ("capture", "gradients", "tf2", ("ok", {
        "big": big, "strided": rng.rand(6, 8)[:, ::2], "empty": np.zeros([0, 3], np.float16),
        "objects": np.array(["a", None], dtype=object), "scalar": np.float32(2.5),
        "ints": np.arange(7, dtype=np.int64).reshape(7, 1)}, 1.5), ["layer"])
    back = _sent(message)
    assert back[:3] == message[:3] and back[4] == message[4]
    got, want = back[3][1], message[3][1]
    assert got.keys() == want.keys()
    for key in want:
        assert np.asarray(got[key]).dtype == np.asarray(want[key]).dtype, key
        assert np.array_equal(got[key], want[key]) if key != "objects" else list(got[key]) == list(want[key])
    assert not np.shares_memory(got["big"], big)  # a copy that arrived, not the sender's array
    got["big"][0] = 7.0  # and the receiver's own to change


def test_a_message_without_arrays_and_a_plain_send_are_received_alike():
    assert _sent(("done", 2.0)) == ("done", 2.0)
    sender, receiver = _pair()
    sender.send(("done", 3.0))
    assert receive(receiver) == ("done", 3.0)
    sender.close()
    receiver.close()


def test_a_sender_gone_part_way_is_an_eof_not_a_short_array():
    sender, receiver = _pair()
    sender.send(("equivtool.raw_buffers", b"", [1024]))  # a header promising 1 KiB that never comes
    sender.close()
    with pytest.raises(EOFError, match="1024 bytes short"):
        receive(receiver)
    receiver.close()
