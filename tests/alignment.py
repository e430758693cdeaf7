"""Where ndarray data lies in a server message (PROTOCOL.md sections 3 and 4.1: padding)."""

from __future__ import annotations

from typing import Any

import numpy as np
from pvwire_client import msgview


def ndarray_data_offsets(message: bytes | bytearray) -> list[int]:
    """The offset from the message's start of the data of every ndarray with data in it."""
    base = np.frombuffer(message, np.uint8).ctypes.data
    offsets: list[int] = []

    def hook(code: int, payload: memoryview) -> Any:
        head = 2 + 4 * payload[1]
        if code == 1 and len(payload) > head:
            offsets.append(np.frombuffer(payload, np.uint8).ctypes.data + head - base)

    msgview.unpack(message, hook)
    return offsets


def message_of(a: np.ndarray[Any, Any]) -> bytearray:
    """The buffer a numpy view ends in: for a large frame, the buffer the transport received the
    WebSocket message into."""
    base: object = a
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, memoryview), f"the array owns its memory ({type(base).__name__})"
    assert isinstance(base.obj, bytearray)
    return base.obj
