"""A small MessagePack reader whose ext payloads are memoryview slices of the message, not copies.

msgpack-python hands every ext payload to its ``ext_hook`` as a fresh ``bytes``: for a 4-megapixel
uint16 frame that is one more 8 MB copy per frame (bench/pyclient_frame.py). This reader walks the
same grammar in Python and passes ``ext_hook`` a read-only memoryview over the message instead, so
an ndarray can be a ``np.frombuffer`` view of the received bytes.

It is meant for messages made of a few large values: walking a message of 15,000 small entries
took 15 times as long as msgpack's C unpacker (bench/pyclient_frame.py), so it stops with
:class:`TooManyItems` after ``max_items`` items (and :class:`TooDeep` past ``max_depth`` nested
containers) and the caller decodes the message with msgpack instead. Whatever it returns equals
what ``msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=...)`` returns for the same
bytes, and what msgpack rejects it rejects (tests/test_pyclient_msgview.py holds both to that).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

__all__ = ["Incomplete", "Malformed", "TooDeep", "TooManyItems", "TrailingBytes", "unpack"]


class Malformed(ValueError):
    """Not MessagePack: a reserved type byte, a map key msgpack refuses, ..."""


class Incomplete(Malformed):
    """The message ends inside a value."""


class TrailingBytes(Malformed):
    def __init__(self, count: int) -> None:
        super().__init__(f"{count} trailing bytes after the message")
        self.count = count


class TooManyItems(Exception):
    """More items than the caller's budget: decode this message some other way."""


class TooDeep(Exception):
    """Containers nested deeper than the caller's bound: decode this message some other way."""


ExtHook = Callable[[int, memoryview], Any]

_U16 = struct.Struct(">H").unpack_from
_U32 = struct.Struct(">I").unpack_from
_U64 = struct.Struct(">Q").unpack_from
_I8 = struct.Struct(">b").unpack_from
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_I64 = struct.Struct(">q").unpack_from
_F32 = struct.Struct(">f").unpack_from
_F64 = struct.Struct(">d").unpack_from
# Type bytes 0xc4-0xdf whose length or value field follows them: (reader, its size).
_SIZED = {
    0xC4: (None, 1), 0xC5: (_U16, 2), 0xC6: (_U32, 4),  # bin 8/16/32
    0xC7: (None, 1), 0xC8: (_U16, 2), 0xC9: (_U32, 4),  # ext 8/16/32
    0xCA: (_F32, 4), 0xCB: (_F64, 8),
    0xCC: (None, 1), 0xCD: (_U16, 2), 0xCE: (_U32, 4), 0xCF: (_U64, 8),
    0xD0: (_I8, 1), 0xD1: (_I16, 2), 0xD2: (_I32, 4), 0xD3: (_I64, 8),
    0xD9: (None, 1), 0xDA: (_U16, 2), 0xDB: (_U32, 4),  # str 8/16/32
    0xDC: (_U16, 2), 0xDD: (_U32, 4),  # array 16/32
    0xDE: (_U16, 2), 0xDF: (_U32, 4),  # map 16/32
}  # fmt: skip
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}


def unpack(
    data: bytes | bytearray | memoryview,
    ext_hook: ExtHook,
    *,
    max_items: int | None = None,
    max_depth: int = 100,
) -> Any:
    """The one MessagePack value ``data`` holds; ext payloads go to ``ext_hook`` as views.

    Raises :class:`Incomplete`, :class:`TrailingBytes` or :class:`Malformed` (all ValueError),
    UnicodeDecodeError for a str that is not UTF-8, whatever ``ext_hook`` raises, and
    :class:`TooManyItems` / :class:`TooDeep` when the message is beyond this reader's budget.
    """
    view = memoryview(data).cast("B").toreadonly()
    walker = _Walker(view, max_items, max_depth, ext_hook)
    value, end = walker.value(0, 0)
    if end != len(view):
        raise TrailingBytes(len(view) - end)
    return value


class _Walker:
    __slots__ = ("buf", "ext_hook", "items", "max_depth", "n")

    def __init__(
        self, buf: memoryview, max_items: int | None, max_depth: int, ext_hook: ExtHook
    ) -> None:
        self.buf = buf
        self.n = len(buf)
        # Items left before giving up (counted down: one compare per item).
        self.items = max_items if max_items is not None else -1
        self.max_depth = max_depth
        self.ext_hook = ext_hook

    def _need(self, pos: int, size: int) -> None:
        if pos + size > self.n:
            raise Incomplete(f"the message ends inside a value at byte {pos}")

    def value(self, pos: int, depth: int) -> tuple[Any, int]:
        """The value starting at ``pos``, and the position after it."""
        if self.items == 0:
            raise TooManyItems
        self.items -= 1
        if pos >= self.n:
            raise Incomplete(f"the message ends at byte {pos}, where a value should start")
        buf = self.buf
        b = buf[pos]
        pos += 1
        if b <= 0x7F:
            return b, pos
        if b >= 0xE0:
            return b - 0x100, pos
        if b <= 0x8F:
            return self._map(b & 0x0F, pos, depth)
        if b <= 0x9F:
            return self._array(b & 0x0F, pos, depth)
        if b <= 0xBF:
            return self._str(b & 0x1F, pos)
        if b == 0xC0:
            return None, pos
        if b == 0xC2:
            return False, pos
        if b == 0xC3:
            return True, pos
        fixext = _FIXEXT.get(b)
        if fixext is not None:
            return self._ext(fixext, pos)
        sized = _SIZED.get(b)
        if sized is None:  # 0xc1, never used
            raise Malformed(f"reserved type byte 0x{b:02x} at byte {pos - 1}")
        read, size = sized
        self._need(pos, size)
        x = buf[pos] if read is None else read(buf, pos)[0]
        pos += size
        if b >= 0xCA and b <= 0xD3:  # numbers
            return x, pos
        if b <= 0xC6:
            self._need(pos, x)
            return bytes(buf[pos : pos + x]), pos + x
        if b <= 0xC9:
            return self._ext(x, pos)
        if b <= 0xDB:
            return self._str(x, pos)
        if b <= 0xDD:
            return self._array(x, pos, depth)
        return self._map(x, pos, depth)

    def _str(self, size: int, pos: int) -> tuple[str, int]:
        self._need(pos, size)
        return str(self.buf[pos : pos + size], "utf-8"), pos + size

    def _ext(self, size: int, pos: int) -> tuple[Any, int]:
        # The type byte, then `size` payload bytes.
        self._need(pos, 1 + size)
        code = _I8(self.buf, pos)[0]
        pos += 1
        return self.ext_hook(code, self.buf[pos : pos + size]), pos + size

    def _array(self, count: int, pos: int, depth: int) -> tuple[list[Any], int]:
        if count and depth >= self.max_depth:
            raise TooDeep
        if count > self.n - pos:  # every item takes at least one byte
            raise Incomplete(f"an array of {count} items does not fit in the message")
        out = []
        item = self.value
        for _ in range(count):
            x, pos = item(pos, depth + 1)
            out.append(x)
        return out, pos

    def _map(self, count: int, pos: int, depth: int) -> tuple[dict[Any, Any], int]:
        if count and depth >= self.max_depth:
            raise TooDeep
        if 2 * count > self.n - pos:
            raise Incomplete(f"a map of {count} pairs does not fit in the message")
        out = {}
        item = self.value
        for _ in range(count):
            k, pos = item(pos, depth + 1)
            if type(k) is not str and type(k) is not bytes:
                # msgpack's strict_map_key: str and bin keys only.
                raise Malformed(f"{type(k).__name__} is not allowed for map key")
            out[k], pos = item(pos, depth + 1)
        return out, pos
