"""Calls between Python workers and workers written in other languages (Go programs on the
core, ``core.Func`` and ``core.CallFunc``), by function name.

Python calls a function another worker serves with :func:`remote_function`; Python serves a
function to every language with :func:`expose`. Arguments and results travel as msgpack, not
pickles: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, lists and tuples (which
arrive as lists), dicts, and numpy arrays and torch CPU tensors (which arrive as numpy arrays;
Go reads them as ``core.Array``). The request is the msgpack array of the positional
arguments, the reply the result; anything else is a ``TypeError`` on the side that tried to
send it.

An array is msgpack extension type :data:`ARRAY_EXT` holding ``[dtype, shape, index]``; its
elements (C order, little-endian) travel in buffer ``index`` of the message, beside the
msgpack, written from the array's memory and, when the message is big, lent to the receiver in
place.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union, overload

import msgpack

__all__ = [
    "ARRAY_DTYPES",
    "ARRAY_EXT",
    "IMPORTS",
    "RemoteFunction",
    "check_name",
    "encode_call",
    "encode_remote",
    "error_detail",
    "error_from",
    "expose",
    "expose_imports",
    "exposed_names",
    "imports_allowed",
    "pack",
    "remote_function",
    "serve",
    "unpack",
    "watch_exposed",
]

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

ARRAY_EXT = 1  # core.ArrayExt
# The element types an array may have, by numpy's name (core.Array's DType).
ARRAY_DTYPES = frozenset(
    ["float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool"]
)


class RemoteFunction:
    """A function another worker serves under ``name`` (a Go handler registered with
    ``core.Func``, or a Python function it exposed). Pass it to :func:`rpc_sync` or
    :func:`rpc_async` in place of a Python callable; it cannot be called here."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = check_name(name, "a remote function")

    def __repr__(self) -> str:
        return f"remote_function({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteFunction) and other.name == self.name

    def __hash__(self) -> int:
        return hash(("RemoteFunction", self.name))


def remote_function(name: str) -> RemoteFunction:
    """The function worker ``to`` serves under ``name``, for
    ``rpc_sync(to, remote_function(name), args=(...))`` and ``rpc_async``. Arguments go by
    position and, like the result, as msgpack."""
    return RemoteFunction(name)


_exposed: Dict[str, Callable[..., Any]] = {}
_exposed_lock = threading.Lock()
# Called with each name exposed while an agent runs, so it serves the name at once; with
# IMPORTS when expose_imports changes.
_on_expose: List[Callable[[str], None]] = []
# Whether any importable "module:function" may be called by name (expose_imports).
_imports_allowed = False
IMPORTS = ":"  # core.ModuleMethods


# Method names the core and the Python agent use themselves (pybind's PyMethod and
# core.ReservedMethodPrefix).
_PICKLED_METHOD = "py"
_RESERVED_PREFIX = "_tensorplay/"


def check_name(name: Any, what: str) -> str:
    """``name`` if it can name a function called by name; a ``ValueError`` saying why not."""
    if not isinstance(name, str) or not name or "\n" in name or name == _PICKLED_METHOD or name.startswith(_RESERVED_PREFIX):
        raise ValueError(
            f"{what}'s name must be a non-empty str without newlines, other than {_PICKLED_METHOD!r} "
            f"and names starting {_RESERVED_PREFIX!r} (the agent's own), got {name!r}"
        )
    return name


@overload
def expose(name: F) -> F: ...
@overload
def expose(name: str, fn: None = None) -> Callable[[F], F]: ...
@overload
def expose(name: str, fn: F) -> F: ...


def expose(name: Union[str, Callable[..., Any]], fn: Optional[Callable[..., Any]] = None) -> Any:
    """Serve ``fn`` to callers in any language (a Go program's ``core.CallFunc``, or Python's
    :func:`remote_function`) under ``name``. Three forms::

        @rpc.expose                  # under the function's own name
        def train_step(batch): ...

        @rpc.expose("train_step")
        def step(batch): ...

        rpc.expose("train_step", step)

    Functions exposed before :func:`init_rpc` are served from the moment the worker joins;
    later ones from the moment ``expose`` returns. Exposing a name again replaces the function.
    """
    if callable(name) and fn is None:
        return expose(name.__name__, name)
    exposed_name = check_name(name, "an exposed function")
    if fn is None:
        return lambda f: expose(exposed_name, f)
    if not callable(fn):
        raise TypeError(f"expose({exposed_name!r}, ...) needs a callable, got {type(fn).__name__}")
    with _exposed_lock:
        _exposed[exposed_name] = fn
        listeners = list(_on_expose)
    for listener in listeners:
        listener(exposed_name)
    return fn


def expose_imports(allow: bool = True) -> None:
    """Let callers in any language call every importable function by the name
    ``"module:function"`` (for example ``"numpy:add"`` or ``"mypkg.train:step"``), as well as the
    exposed ones; ``allow=False`` stops it. Off by default: with it on, any worker of the world
    can run any function this interpreter can import."""
    global _imports_allowed
    with _exposed_lock:
        _imports_allowed = bool(allow)
        listeners = list(_on_expose)
    for listener in listeners:
        listener(IMPORTS)


def imports_allowed() -> bool:
    """Whether :func:`expose_imports` is on."""
    return _imports_allowed


def exposed_names() -> List[str]:
    """The names of the functions exposed so far."""
    with _exposed_lock:
        return sorted(_exposed)


def watch_exposed(listener: Callable[[str], None], on: bool = True) -> None:
    """Have ``listener(name)`` called for each name exposed from now on (``on=False``: stop)."""
    with _exposed_lock:
        if on:
            _on_expose.append(listener)
        elif listener in _on_expose:
            _on_expose.remove(listener)


def _as_array(obj: Any) -> Any:
    """``obj`` as a C-contiguous numpy array in native byte order if it is a numpy array or a
    torch CPU tensor (without a copy when it already is one), else None."""
    np = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        if obj.device.type != "cpu":
            raise TypeError(f"a tensor on {obj.device} cannot be sent: move it to the CPU first")
        obj = obj.detach().contiguous().numpy()
    if np is None or not isinstance(obj, np.ndarray):
        return None
    if not obj.dtype.isnative:
        obj = obj.astype(obj.dtype.newbyteorder("="))
    if obj.dtype.name not in ARRAY_DTYPES:
        raise TypeError(f"an array of dtype {obj.dtype} cannot be sent: want one of {', '.join(sorted(ARRAY_DTYPES))}")
    return np.ascontiguousarray(obj)


def pack(value: Any, what: str) -> List[Any]:
    """The segments of a message holding ``value``: its msgpack, then the memory of each array
    in it; a ``TypeError`` naming ``what`` if it cannot be sent."""
    buffers: List[Any] = []

    def extension(obj: Any) -> Any:
        np = sys.modules.get("numpy")
        if np is not None and isinstance(obj, np.generic):
            return obj.item()
        array = _as_array(obj)
        if array is None:
            raise TypeError(f"{type(obj).__name__!r} is none of the types msgpack carries")
        buffers.append(memoryview(array.reshape(-1)).cast("B"))
        return msgpack.ExtType(ARRAY_EXT, msgpack.packb([array.dtype.name, list(array.shape), len(buffers) - 1]))

    try:
        return [msgpack.packb(value, use_bin_type=True, default=extension), *buffers]
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{what} cannot be sent as msgpack: {exc}") from None


def unpack(payload: Any, buffers: Sequence[Any] = ()) -> Any:
    """The value of a message of msgpack ``payload`` and ``buffers``; arrays become numpy
    arrays over the buffers' memory (no copy); dicts may have keys of any type. A peer's
    malformed array (an unknown dtype, a buffer index the message does not have, a shape its
    buffer does not fill) raises ValueError saying which."""

    def extension(code: int, data: bytes) -> Any:
        if code != ARRAY_EXT:
            return msgpack.ExtType(code, data)
        try:
            header = msgpack.unpackb(data)
        except Exception as exc:
            raise ValueError(f"an array whose header is not msgpack: {exc}") from None
        if not (isinstance(header, list) and len(header) == 3):
            raise ValueError(f"an array whose header is not [dtype, shape, buffer]: {header!r:.100}")
        dtype, shape, where = header
        if not isinstance(dtype, str) or dtype not in ARRAY_DTYPES:
            raise ValueError(f"an array of dtype {dtype!r:.40}; known: {sorted(ARRAY_DTYPES)}")
        if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
            raise ValueError(f"an array of shape {shape!r:.100}: want a list of non-negative integers")
        if isinstance(where, bytes):
            raw: Any = where
        elif type(where) is int and 0 <= where < len(buffers):
            raw = buffers[where]
        else:
            raise ValueError(f"an array in buffer {where!r:.40}, but the message has {len(buffers)} buffers")
        import numpy as np  # only a message with arrays needs it

        count = 1
        for n in shape:
            count *= n
        itemsize = np.dtype(dtype).itemsize
        if count * itemsize != memoryview(raw).nbytes:
            raise ValueError(f"an array of shape {shape} and dtype {dtype} needs {count * itemsize} bytes, its buffer has {memoryview(raw).nbytes}")
        return np.frombuffer(raw, dtype=dtype).reshape(shape)

    return msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=extension)


def encode_call(fn: RemoteFunction, args: Optional[Tuple[Any, ...]], kwargs: Optional[Dict[str, Any]]) -> List[Any]:
    """The segments of a call of ``fn``: its positional arguments as a msgpack array."""
    if kwargs:
        raise TypeError(
            f"{fn!r} takes its arguments by position only (they may go to another language), "
            f"got keyword arguments {sorted(kwargs)}"
        )
    return pack(list(args or ()), f"an argument of {fn!r}")


def encode_remote(rref_id: Tuple[int, int], fn: RemoteFunction, args: Optional[Tuple[Any, ...]], kwargs: Optional[Dict[str, Any]]) -> List[Any]:
    """The segments of ``remote()`` of ``fn``: the msgpack array [creator, local, name] of the
    RRef's id and the function, then the call's own message (core.RemoteMethod)."""
    segments = encode_call(fn, args, kwargs)
    segments[0] = msgpack.packb([rref_id[0], rref_id[1], fn.name]) + segments[0]
    return segments


def serve(name: str, payload: Any, buffers: Sequence[Any]) -> List[Any]:
    """Run the exposed function ``name`` on the call's arguments and return its reply."""
    with _exposed_lock:
        fn = _exposed.get(name)
    if fn is None:
        fn = _imported(name)
    args = unpack(payload, buffers)
    if not isinstance(args, list):
        raise TypeError(f"the arguments to {name!r} are not a msgpack array but a {type(args).__name__}")
    return pack(fn(*args), f"the result of {name!r}")


def _imported(name: str) -> Callable[..., Any]:
    """The function ``"module:function"`` names, if expose_imports allows it."""
    module_name, _, attribute = name.partition(":")
    if not (_imports_allowed and module_name and attribute):
        raise LookupError(f"no function is exposed under {name!r} (importable functions are served only after rpc.expose_imports())")
    fn: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        fn = getattr(fn, part)
    if not callable(fn):
        raise TypeError(f"{name!r} is a {type(fn).__name__}, not a function")
    return fn


def error_detail(exc: BaseException) -> Any:
    """What a failed exposed function sends back beside its message: the exception's type
    name, message and traceback (a Go caller reads them into a ``core.PythonError``)."""
    return pack(
        {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        },
        "an error",
    )[0]


def error_from(worker: str, message: str, detail: Any) -> RuntimeError:
    """The error a failed call of a remote function raises: a ``RuntimeError`` naming the
    worker, with the remote exception's type and traceback when a Python function raised it."""
    try:
        fields = unpack(detail) if detail is not None and len(detail) else None
    except Exception:
        fields = None
    if isinstance(fields, dict) and isinstance(fields.get("type"), str):
        text = f"On worker {worker}: {fields['type']}: {fields.get('message', '')}"
        if fields.get("traceback"):
            text += f"\n\nRemote traceback:\n{fields['traceback']}"
        return RuntimeError(text)
    return RuntimeError(f"On worker {worker}: {message}")
