"""Python's side of moving bytes to and from Go as (address, length) pairs, without extra
copies: tables naming Python buffers, uninitialised objects for Go to fill, and views of
memory Go lends. Nothing here calls Go; the agent module (``_agent``) does.

Outgoing, Python hands Go a table of uint64 pairs naming its buffers. The agent decides, from
the table's ``size``, whether Go copies the message before the call returns or (at least
``BorrowThreshold`` bytes) sends it from Python's memory in place; then Python keeps the table,
and with it the buffers, until Go is done.

Incoming, a big message arrives in one Go buffer that Go lends to Python: Python's buffers are
views of that memory, handed back when the last view dies. A small message is copied into
objects Python allocates, of the type the sender's pickler recorded for each buffer.
"""

from __future__ import annotations

import array
import ctypes
import threading
import weakref
from typing import Any, Callable, List, Sequence, Tuple, Union

BufferLike = Union[bytes, bytearray, memoryview]

# One byte per out-of-band buffer, sent as the last segment of a message that has buffers.
KIND_BYTES = ord("b")  # rebuild as bytes
KIND_WRITABLE = ord("w")  # rebuild on writable memory


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


_api = ctypes.pythonapi
_api.PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_api.PyObject_GetBuffer.restype = ctypes.c_int
_api.PyBuffer_Release.argtypes = [ctypes.POINTER(_PyBuffer)]
_api.PyBuffer_Release.restype = None
# Uninitialised bytes and bytearrays: Go fills them, so zeroing them first would be waste.
_api.PyBytes_FromStringAndSize.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_api.PyBytes_FromStringAndSize.restype = ctypes.py_object
_api.PyByteArray_FromStringAndSize.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_api.PyByteArray_FromStringAndSize.restype = ctypes.py_object
_api.PyByteArray_AsString.argtypes = [ctypes.py_object]
_api.PyByteArray_AsString.restype = ctypes.c_void_p
_PyBUF_SIMPLE = 0

# A bytes object's data sits at a fixed offset from the object in CPython; the offset is
# checked once here and the general buffer protocol is used if it does not hold.
_BYTES_DATA_OFFSET = bytes.__basicsize__ - 1
if ctypes.string_at(id(b"tensorplay") + _BYTES_DATA_OFFSET, 10) != b"tensorplay":
    _BYTES_DATA_OFFSET = -1


def _bytes_address(b: bytes) -> int:
    if _BYTES_DATA_OFFSET >= 0:
        return id(b) + _BYTES_DATA_OFFSET
    return ctypes.cast(ctypes.c_char_p(b), ctypes.c_void_p).value or 0


class SegmentTable:
    """The (address, length) table of a message's segments; it keeps them alive and readable
    until :meth:`release`."""

    __slots__ = ("_table", "_views", "_keep", "count", "size")

    def __init__(self, segments: Sequence[Any]) -> None:
        pairs = array.array("Q")
        views: List[_PyBuffer] = []
        size = 0
        for seg in segments:
            if type(seg) is bytes:
                pairs.append(_bytes_address(seg))
                pairs.append(len(seg))
                size += len(seg)
                continue
            view = _PyBuffer()
            # Contiguity is required: the pickler makes every out-of-band buffer contiguous.
            if _api.PyObject_GetBuffer(seg, ctypes.byref(view), _PyBUF_SIMPLE) != 0:
                raise BufferError(f"cannot read a buffer from {type(seg).__name__}")
            views.append(view)
            pairs.append(view.buf or 0)
            pairs.append(view.len)
            size += view.len
        self._table = pairs
        self._views = views
        self._keep = segments
        self.count = len(segments)
        self.size = size

    @property
    def address(self) -> int:
        """Address of the first pair."""
        return self._table.buffer_info()[0] if self.count else 0

    def release(self) -> None:
        """Release the buffer views the table holds."""
        for view in self._views:
            _api.PyBuffer_Release(ctypes.byref(view))
        self._views = []
        self._keep = ()


def new_bytearray(size: int) -> Tuple[bytearray, int]:
    """A bytearray of ``size`` uninitialised bytes, and the address of its data."""
    buf = _api.PyByteArray_FromStringAndSize(None, size)
    return buf, (_api.PyByteArray_AsString(buf) or 0) if size else 0


def new_bytes(size: int) -> Tuple[bytes, int]:
    """A bytes object of ``size`` uninitialised bytes, and the address of its data (bytes are
    immutable to Python code, but nothing holds this one yet, so Go may fill it)."""
    buf = _api.PyBytes_FromStringAndSize(None, size)
    return buf, _bytes_address(buf)


def lent_view(address: int, size: int, on_release: Callable[[], None]) -> memoryview:
    """A view of ``size`` bytes of memory another owner lent at ``address``;
    ``on_release()`` runs once the view and every slice of it are gone."""
    region = (ctypes.c_char * size).from_address(address)
    weakref.finalize(region, on_release)
    return memoryview(region).cast("B")


class Scratch:
    """Memory one thread takes small messages into with a single call to Go (``Take``): a
    table (the status, then each segment's size) and a buffer holding the segments back to
    back. Messages that do not fit, and big ones Go lends in place, go the long way."""

    TABLE_LEN = 65
    BUF_LEN = 64 << 10

    def __init__(self) -> None:
        self.table = (ctypes.c_int64 * self.TABLE_LEN)()
        self.table_address = ctypes.addressof(self.table)
        self.buf, self.buf_address = new_bytearray(self.BUF_LEN)

    def unpack(self, count: int, pickled: bool = True) -> Tuple[int, BufferLike, List[BufferLike]]:
        """The status, payload and buffers of a message of ``count`` segments just taken.
        Each is copied out of the scratch memory, which the thread's next message reuses. The
        last segment of a ``pickled`` message records each buffer's kind (internal.serialize);
        other messages (crosslang) have none, and all their buffers are writable."""
        status = self.table[0]
        if count == 0:
            return status, b"", []
        sizes = list(self.table[1 : count + 1])
        view = memoryview(self.buf)
        if count == 1:
            return status, bytes(view[: sizes[0]]), []
        total = sum(sizes)
        kinds, data_sizes = (bytes(view[total - sizes[-1] : total]), sizes[:-1]) if pickled else (b"", sizes)
        parts: List[BufferLike] = []
        offset = 0
        for i, size in enumerate(data_sizes):
            piece = view[offset : offset + size]
            offset += size
            parts.append(bytes(piece) if came_as_bytes(kinds, i) else bytearray(piece))
        return status, parts[0], parts[1:]


def came_as_bytes(kinds: bytes, i: int) -> bool:
    """Whether segment ``i`` of a message (0 is the payload) was sent as a bytes object, by
    the kinds segment of a pickled message (internal.serialize); ``b""`` for other messages,
    whose buffers are all writable."""
    return 0 < i <= len(kinds) and kinds[i - 1] == KIND_BYTES


_scratch = threading.local()


def scratch() -> Scratch:
    """This thread's :class:`Scratch`."""
    s = getattr(_scratch, "value", None)
    if s is None:
        s = _scratch.value = Scratch()
    return s
