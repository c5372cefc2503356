"""Pickling of calls and results, and remote errors.

Everything a call carries is pickled with protocol 5: buffers that support it travel out of
band, beside the pickle, never copied into it. Module-level functions and classes go by
reference, ``__main__``'s too (resolved in the callee's own ``__main__``, as torch does); lambdas,
closures and nested functions go by value (cloudpickle).
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import threading
import time
import traceback
import types
from typing import IO, Any, Callable, Dict, Iterable, List, Optional, Tuple, cast

import cloudpickle

from ._buffers import KIND_BYTES, KIND_WRITABLE, BufferLike
from ._dist_autograd import abandon_receive, received_requiring_grad

__all__ = [
    "FrameworkError",
    "OUT_OF_BAND_MIN",
    "PROTOCOL",
    "RemoteException",
    "SendContext",
    "current_send_context",
    "deserialize",
    "exception_text",
    "serialize",
]

PROTOCOL = 5

# Smaller buffers stay inside the pickle: a separate segment costs more than the copy.
OUT_OF_BAND_MIN = 1024


class SendContext:
    """What pickling a message collects besides bytes: the RRef forks it creates, which must be
    registered with their owners before the message is sent, and for a message sent in a
    distributed autograd context, the tensors it carries that require grad, in order."""

    __slots__ = ("forks", "grad_tensors")

    def __init__(self, record_grads: bool = False) -> None:
        # (owner id, rref id, fork id) per fork, ids as (creator, local) pairs
        self.forks: List[Tuple[int, Tuple[int, int], Tuple[int, int]]] = []
        self.grad_tensors: Optional[List[Any]] = [] if record_grads else None


_sending = threading.local()


def current_send_context() -> Optional[SendContext]:
    """The context of the message being pickled on this thread, if any."""
    return getattr(_sending, "context", None)


def _rebuild_bytearray(buf: BufferLike) -> bytearray:
    return buf if type(buf) is bytearray else bytearray(buf)


def _rebuild_memoryview(buf: BufferLike, fmt: str, shape: Tuple[int, ...]) -> memoryview:
    view = buf if type(buf) is memoryview else memoryview(buf)
    return view.cast("B").cast(fmt, shape) if shape else view.cast("B").cast(fmt)


def _reduce_memoryview(obj: memoryview) -> Tuple[Callable[..., memoryview], Tuple[Any, ...]]:
    if not obj.contiguous:
        # `or ()` for typeshed, whose shape may be None: a non-contiguous view has one.
        obj = memoryview(obj.tobytes()).cast(obj.format, obj.shape or ())
    return _rebuild_memoryview, (pickle.PickleBuffer(obj), obj.format, obj.shape)


def _reduce_ndarray(obj: Any) -> Any:
    if obj.dtype.hasobject:
        return obj.__reduce_ex__(PROTOCOL)
    if obj.nbytes < OUT_OF_BAND_MIN:
        return obj.__reduce_ex__(4)
    if not (obj.flags.c_contiguous or obj.flags.f_contiguous):
        obj = sys.modules["numpy"].ascontiguousarray(obj)
    return obj.__reduce_ex__(PROTOCOL)


def _rebuild_empty_tensor(dtype_name: str, shape: Tuple[int, ...], requires_grad: bool) -> Any:
    # torch is optional and slow to import: only a worker that receives a tensor needs it.
    import torch

    tensor = torch.empty(shape, dtype=getattr(torch, dtype_name))
    return received_requiring_grad(tensor) if requires_grad else tensor


class _TensorBytes:
    """The bytes one or more tensors of a message view (see _Pickler.reduce_tensor). Pickled
    once per message however many tensors use it (the pickle's memo), so views that share
    storage on the sender share it on the receiver."""

    __slots__ = ("data", "start", "end")

    def __init__(self, data: Any, start: int, end: int) -> None:
        self.data = data  # a 1-D uint8 tensor over the bytes [start, end) of a storage
        self.start = start
        self.end = end

    def holds(self, start: int, end: int, item: int) -> bool:
        """Whether a tensor of item-byte elements spanning [start, end) can be a view of these
        bytes: within them, at a whole number of its elements."""
        return self.start <= start and end <= self.end and (start - self.start) % item == 0 and (self.end - self.start) % item == 0

    def __reduce__(self) -> Tuple[Callable[..., Any], Tuple[Any, ...]]:
        if self.end - self.start < OUT_OF_BAND_MIN:
            # Small ones stay inside the pickle, as other buffers do: a message of one segment
            # takes the transports' fast path for small messages.
            return _rebuild_tensor_bytes, (bytearray(self.data.numpy()),)
        return _rebuild_tensor_bytes, (pickle.PickleBuffer(self.data.numpy()),)


def _rebuild_tensor_bytes(buf: BufferLike) -> Any:
    import torch

    return torch.frombuffer(buf, dtype=torch.uint8)


def _rebuild_tensor_view(base: Any, dtype_name: str, offset: int, shape: Tuple[int, ...], stride: Tuple[int, ...], requires_grad: bool) -> Any:
    import torch

    tensor = base.view(getattr(torch, dtype_name)).as_strided(shape, stride, offset)
    return received_requiring_grad(tensor) if requires_grad else tensor


def _reduce_layout(layout: Any) -> Tuple[Callable[..., Any], Tuple[str]]:
    return _torch_attribute, (str(layout).rsplit(".", 1)[-1],)


def _torch_attribute(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _storage_address(tensor: Any) -> int:
    """Where the storage of tensor starts (untyped_storage from torch 2, storage before)."""
    storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    return int(storage.data_ptr())


def _torch_strided() -> Any:
    return sys.modules["torch"].strided


def _torch_uint8() -> Any:
    return sys.modules["torch"].uint8


def _by_value(obj: Any) -> bool:
    """Whether a function or class has no name to be found by on the callee: lambdas and
    whatever is defined inside a function travel by value (cloudpickle). Module-level ones,
    ``__main__``'s included, go by reference, as torch sends them: every rank runs the same
    script, and the callee must use its own object (its globals, locks, class identity)."""
    qualname = getattr(obj, "__qualname__", "")
    return "<lambda>" in qualname or "<locals>" in qualname


def _worker_name() -> str:
    """This worker's name, for errors raised while unpickling (or the process's, outside RPC)."""
    agent = sys.modules.get("tensorplay_rpc._agent")
    current = getattr(agent, "_current", None) if agent is not None else None
    info = getattr(current, "info", None)
    return f"worker {info.name}" if info is not None else f"process {os.getpid()}"


class MissingMainNameError(AttributeError):
    """A function or class the sender named in its ``__main__`` is not in this worker's
    ``__main__`` (this worker runs another script)."""


def _reducers(pickler: "_Pickler") -> Dict[type, Callable[[Any], Any]]:
    """The out-of-band reducers, by type, for the libraries loaded now."""
    table: Dict[type, Callable[[Any], Any]] = {memoryview: _reduce_memoryview}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        table[numpy.ndarray] = _reduce_ndarray
    torch = sys.modules.get("torch")
    if torch is not None:
        table[torch.Tensor] = pickler.reduce_tensor
        # torch's own reduction of a sparse tensor holds its layout, which pickle cannot save.
        table[type(torch.strided)] = _reduce_layout
    return table


_FUNCTION_TYPES = (types.FunctionType, type)


class _Pickler(pickle.Pickler):
    """The C pickler with out-of-band buffers for bytes, bytearray, memoryview, numpy arrays
    (contiguous or not) and torch CPU tensors. Functions and classes that cannot be imported
    on the callee go by value through cloudpickle; the rest stays on the C fast path."""

    def __init__(self, file: IO[bytes], buffer_callback: Callable[[pickle.PickleBuffer], object]) -> None:
        super().__init__(file, protocol=PROTOCOL, buffer_callback=buffer_callback)
        self.dispatch_table = _reducers(self)
        self.modules = len(sys.modules)
        # The bytes sent so far for this message's tensors, by storage address.
        self.tensor_bytes: Dict[int, List[_TensorBytes]] = {}

    def reduce_tensor(self, obj: Any) -> Any:
        """A CPU tensor goes as the bytes its elements span, out of band, and its shape,
        strides and offset into them. The bytes of a view that lies within a tensor sent earlier
        in the same message are not sent again: on arrival the two share storage, as on the
        sender. (torch's agent sends a view's whole storage, so its views always share; this
        sends what each view spans, and a view sent before the tensor it lies in, or
        overlapping one partly, arrives with bytes of its own.)"""
        if obj.device.type != "cpu" or obj.layout is not _torch_strided() or obj.is_quantized or getattr(obj, "is_nested", False):
            return obj.__reduce_ex__(PROTOCOL)
        data = obj.detach()
        if data.is_conj() or data.is_neg():  # lazy conjugation or negation: its bytes are not its values
            data = data.resolve_conj().resolve_neg()
        dtype_name = str(data.dtype).rsplit(".", 1)[-1]
        if obj.requires_grad:
            # In the order the receiver rebuilds them (received_requiring_grad): the pickle's
            # memo sends each tensor once.
            context = current_send_context()
            if context is not None and context.grad_tensors is not None:
                context.grad_tensors.append(obj)
        if data.numel() == 0:
            return _rebuild_empty_tensor, (dtype_name, tuple(data.shape), obj.requires_grad)
        item = data.element_size()
        # The elements the view spans: from its offset to its last element (strides >= 0).
        last = data.storage_offset() + sum((n - 1) * st for n, st in zip(data.shape, data.stride()))
        start, end = data.storage_offset() * item, (last + 1) * item
        address = _storage_address(data)
        spans = self.tensor_bytes.setdefault(address, [])
        sent = next((b for b in spans if b.holds(start, end, item)), None)
        if sent is None:
            span = data.as_strided((last + 1 - data.storage_offset(),), (1,), data.storage_offset())
            sent = _TensorBytes(span.view(_torch_uint8()), start, end)
            spans.append(sent)
        offset = (start - sent.start) // item
        return _rebuild_tensor_view, (sent, dtype_name, offset, tuple(data.shape), tuple(data.stride()), obj.requires_grad)

    def persistent_id(self, obj: Any) -> Any:
        # bytes and bytearray never reach the dispatch table (the pickler saves them itself);
        # a persistent id holding a PickleBuffer sends them out of band.
        kind = type(obj)
        if kind is bytes or kind is bytearray:
            if len(obj) >= OUT_OF_BAND_MIN:
                return (_PID_BUFFER, kind is bytes, pickle.PickleBuffer(obj))
        elif kind in _FUNCTION_TYPES and _by_value(obj):
            return (_PID_BY_VALUE, cloudpickle.dumps(obj, protocol=PROTOCOL))
        return None


_PID_BUFFER = 0
_PID_BY_VALUE = 1


_MISSING = object()
# How long a call waits for a __main__ name its callee's script has not defined yet.
_MAIN_NAME_WAIT_S = 2.0


def _main_attribute(qualname: str) -> Any:
    """What ``qualname`` names in this process's ``__main__``, or _MISSING."""
    found: Any = sys.modules["__main__"]
    for part in qualname.split("."):
        found = getattr(found, part, _MISSING)
        if found is _MISSING:
            break
    return found


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module != "__main__":
            return super().find_class(module, name)
        found = _main_attribute(name)
        # The callee's script may still be on its way to the definition (the reference page's
        # example defines its function after init_rpc): give it a moment, then say what is wrong.
        deadline = time.monotonic() + _MAIN_NAME_WAIT_S
        while found is _MISSING and time.monotonic() < deadline:
            time.sleep(0.01)
            found = _main_attribute(name)
        if found is _MISSING:
            script = getattr(sys.modules["__main__"], "__file__", None) or "an interactive session"
            raise MissingMainNameError(
                f"{name!r} is defined in the sender's __main__ but not in the __main__ of {_worker_name()} "
                f"(which runs {script}): every worker must run the script that defines it, or define it "
                f"in a module both can import"
            ) from None
        return found

    def persistent_load(self, pid: Any) -> Any:
        if pid[0] == _PID_BY_VALUE:
            return pickle.loads(pid[1])
        _, is_bytes, buf = pid
        if is_bytes:
            return buf if type(buf) is bytes else bytes(buf)
        return _rebuild_bytearray(buf)


class _Out:
    """One thread's reusable pickler: building one per message costs more than pickling a
    small call. Rebuilt when new modules (numpy, torch) may have brought new reducers."""

    def __init__(self) -> None:
        self.file = io.BytesIO()
        self.buffers: List[pickle.PickleBuffer] = []
        self.pickler = _Pickler(self.file, self.buffers.append)


_out = threading.local()


def _dump(obj: Any) -> Tuple[bytes, List[pickle.PickleBuffer]]:
    out = getattr(_out, "state", None)
    if out is None or out.pickler.modules != len(sys.modules):
        out = _out.state = _Out()
    try:
        out.pickler.dump(obj)
        return out.file.getvalue(), list(out.buffers)
    finally:
        out.file.seek(0)
        out.file.truncate()
        out.pickler.clear_memo()
        out.pickler.tensor_bytes.clear()
        out.buffers.clear()


def serialize(obj: Any, record_grads: bool = False) -> Tuple[List[Any], SendContext]:
    """Pickle ``obj``: the message's segments (the pickle, its out-of-band buffers, and if there
    are any, their kinds) and the context holding the RRef forks it made (and with
    ``record_grads``, the tensors requiring grad it carries)."""
    context = SendContext(record_grads)
    _sending.context = context
    try:
        try:
            data, buffers = _dump(obj)
        except (pickle.PicklingError, AttributeError) as fast_path_error:
            # Something only cloudpickle can send (a function of a module the callee lacks,
            # say); forks made by the failed attempt are dropped with it. Its tensors go by
            # torch's own pickling, which the receiver records nothing for either.
            context.forks.clear()
            if context.grad_tensors is not None:
                context.grad_tensors.clear()
            buffers = []
            try:
                data = cloudpickle.dumps(obj, protocol=PROTOCOL, buffer_callback=buffers.append)
            except Exception:
                raise fast_path_error
    finally:
        _sending.context = None
    if not buffers:
        return [data], context
    raws = [b.raw() for b in buffers]
    kinds = bytes(KIND_BYTES if type(r.obj) is bytes else KIND_WRITABLE for r in raws)
    return [data, *raws, kinds], context


def deserialize(payload: BufferLike, buffers: Iterable[BufferLike]) -> Any:
    """Unpickle what :func:`serialize` made, given the received payload and buffers."""
    try:
        return _Unpickler(io.BytesIO(payload), buffers=buffers).load()
    except BaseException:
        abandon_receive()
        raise


class FrameworkError(RuntimeError):
    """An error this library raises on a callee about the call itself (a result that cannot be
    pickled, an async_execution function that returned no Future): it reaches the caller as a
    RuntimeError with this message, as torch reports its own, not as a user's exception."""


def _unescape(text: str) -> str:
    """Turn the escapes of a repr back into characters, as torch does to a remote error's
    message (its newlines and tabs come out as such); characters beyond ASCII are kept, where
    torch garbles them (it decodes the UTF-8 bytes as Latin-1)."""
    try:
        return text.encode("ascii", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:  # a lone backslash at the end, say: keep the text as it was
        return text


class RemoteException:
    """An error raised on a callee, as it travels back to the caller.

    The type travels by reference, so the caller gets the same class when it can import it.
    An exception raised by user code (an ``Exception``) is *framed*: its message is torch's,
    the remote worker, the exception's repr and the remote traceback. Anything else (a
    ``SystemExit`` or ``KeyboardInterrupt`` raised by user code, a :class:`FrameworkError`)
    reaches the caller as a RuntimeError with a message of one line, as torch reports them;
    a ``SystemExit`` on a callee never ends the caller.
    """

    __slots__ = ("type_ref", "type_name", "message", "framed")

    def __init__(self, type_ref: Optional[bytes], type_name: str, message: str, framed: bool) -> None:
        self.type_ref = type_ref
        self.type_name = type_name
        self.message = message
        self.framed = framed

    @classmethod
    def capture(cls, exc: BaseException, where: str) -> "RemoteException":
        """Describe ``exc``, being handled now on worker ``where`` (a WorkerInfo's repr)."""
        if isinstance(exc, FrameworkError):
            return cls(None, "builtins.RuntimeError", str(exc), framed=False)
        if not isinstance(exc, Exception):
            return cls(None, "builtins.RuntimeError", f"{type(exc).__name__}: {exception_text(exc)}", framed=False)
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        message = _unescape(f"On {where}:\n{_repr(exc)}\n{tb}")
        try:
            # By reference where it has a name (a class of __main__ is the caller's own one
            # there); a class defined in a function goes by value through cloudpickle, which
            # brings it back to the caller's own class object if the caller sent it here.
            type_ref, _ = _dump(type(exc))
        except Exception:
            try:
                type_ref = cloudpickle.dumps(type(exc), protocol=PROTOCOL)
            except Exception:  # a class that cannot be pickled: its name and text still go
                type_ref = None
        return cls(type_ref, f"{type(exc).__module__}.{type(exc).__qualname__}", message, framed=True)

    def encode(self) -> bytes:
        """The wire form, plain data that any caller can unpickle."""
        return pickle.dumps((self.type_ref, self.type_name, self.message, self.framed), protocol=PROTOCOL)

    @classmethod
    def decode(cls, data: BufferLike) -> "RemoteException":
        """Inverse of :meth:`encode`."""
        type_ref, type_name, message, framed = pickle.loads(data)
        return cls(type_ref, type_name, message, bool(framed))

    def to_exception(self, prefixed: bool = True) -> BaseException:
        """The exception to raise on the caller: the remote type when it can be imported and
        built from a message, else a RuntimeError naming the type.

        ``prefixed``: the message starts with the type's name, as torch's does when the error
        comes through a future (``rpc_sync``, ``rpc_async``, the proxies), not from
        ``to_here()``."""
        if not self.framed:
            return RuntimeError(self.message)
        exc_type = None
        if self.type_ref is not None:
            try:
                exc_type = _Unpickler(io.BytesIO(self.type_ref)).load()
            except Exception:
                exc_type = None
        short_name = self.type_name.rsplit(".", 1)[-1]
        message = f"{short_name}: {self.message}" if prefixed else self.message
        if isinstance(exc_type, type) and issubclass(exc_type, BaseException):
            try:
                return exc_type(message)
            except Exception:
                pass
            # A class whose __init__ wants more than a message (torch then raises the
            # constructor's TypeError): made without its __init__, so `except` still matches it.
            try:
                made: BaseException = cast(Any, exc_type).__new__(exc_type, message)
                BaseException.__init__(made, message)
                return made
            except Exception:
                pass
        return RuntimeError(f"{self.type_name}: {self.message}")


def exception_text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception as err:  # an exception whose __str__ fails is still reported
        return f"<str() raised {type(err).__name__}: {err}>"


def _repr(exc: BaseException) -> str:
    try:
        return repr(exc)
    except Exception as err:
        return f"<repr() raised {type(err).__name__}: {err}>"
