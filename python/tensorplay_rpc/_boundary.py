"""Moving bytes across the Go boundary as (address, length) pairs, without extra copies.

Outgoing, Python hands Go a table of uint64 pairs naming its buffers, and Go copies them before
the call returns, so the buffers only need to live for the call. Incoming, Python allocates one
buffer of the size Go announces and Go copies into it.
"""

from __future__ import annotations

import array
import ctypes
from typing import List, Sequence, Tuple, Union

BufferLike = Union[bytes, bytearray, memoryview]


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer``: what ``PyObject_GetBuffer`` fills in."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None
_PyBUF_SIMPLE = 0
_PyBUF_WRITABLE = 1

# A bytes object's data sits at a fixed offset from the object in CPython; the offset is
# checked once here and the general buffer protocol is used if it does not hold.
_BYTES_DATA_OFFSET = bytes.__basicsize__ - 1
if ctypes.string_at(id(b"tensorplay") + _BYTES_DATA_OFFSET, 10) != b"tensorplay":
    _BYTES_DATA_OFFSET = -1


class SegmentTable:
    """The (address, length) table of a message's segments, valid until :meth:`release`."""

    __slots__ = ("_table", "_views", "count")

    def __init__(self, segments: Sequence[BufferLike]) -> None:
        pairs = array.array("Q")
        views: List[_PyBuffer] = []
        for seg in segments:
            if type(seg) is bytes and _BYTES_DATA_OFFSET >= 0:
                pairs.append(id(seg) + _BYTES_DATA_OFFSET)
                pairs.append(len(seg))
                continue
            view = _PyBuffer()
            # Contiguity is required: non-contiguous data never reaches here as a raw segment.
            if _get_buffer(seg, ctypes.byref(view), _PyBUF_SIMPLE) != 0:
                raise BufferError(f"cannot read a buffer from {type(seg).__name__}")
            views.append(view)
            pairs.append(view.buf or 0)
            pairs.append(view.len)
        self._table = pairs
        self._views = views
        self.count = len(segments)

    @property
    def address(self) -> int:
        """Address of the first pair."""
        return self._table.buffer_info()[0] if self.count else 0

    def release(self) -> None:
        """Release the buffer views the table holds."""
        for view in self._views:
            _release_buffer(ctypes.byref(view))
        self._views = []


def writable_address(buf: bytearray) -> int:
    """Address of a bytearray's data, for Go to copy into."""
    if not buf:
        return 0
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def read_segments(native) -> Tuple[BufferLike, List[memoryview]]:
    """Copy a received message out of Go: one allocation for all of its segments.

    Returns the payload and views of the out-of-band buffers; all are writable, so arrays
    rebuilt on them are writable too.
    """
    count = native.NumSegments()
    sizes = [native.SegmentSize(i) for i in range(count)]
    if count == 1:
        payload = bytearray(sizes[0])
        if sizes[0]:
            native.CopySegment(0, writable_address(payload))
        return payload, []
    whole = bytearray(sum(sizes))
    base = writable_address(whole)
    view = memoryview(whole)
    parts: List[memoryview] = []
    offset = 0
    for i, size in enumerate(sizes):
        if size:
            native.CopySegment(i, base + offset)
        parts.append(view[offset : offset + size])
        offset += size
    return parts[0], parts[1:]
