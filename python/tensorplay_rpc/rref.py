"""RRef: a reference to a value kept on its owner worker.

Every RRef object, on its owner or elsewhere, holds one *fork* registered with the owner; the
owner keeps the value while any fork is alive anywhere, including forks still in flight inside
messages, and drops it after the last is released. The Go agent keeps the counts and the
protocol (see core/rref.go); this module keeps the values and the Python objects.
"""

from __future__ import annotations

import functools
import inspect
import sys
import time
import weakref
from typing import Any, Callable, Dict, Generic, Optional, Tuple, TypeVar, cast

from . import constants
from ._agent import FunctionCall, TensorPipeAgent, current_agent, current_agent_or_not_set, function_call
from ._call_future import _CallFuture, call_timeout
from ._owner_table import Id
from .crosslang import RemoteFunction
from .futures import Future
from .internal import current_send_context
from .rref_proxy import RRefProxy
from .worker_info import WorkerInfo

__all__ = ["PyRRef", "RRef", "method_factory", "new_method", "remote_function_rref", "remote_rref"]

T = TypeVar("T")


class PyRRef:
    """The implementation of :class:`RRef`; its public methods are installed on RRef with
    :func:`method_factory`, as torch does."""

    __slots__ = ("_agent", "_owner_id", "_owner", "_owner_epoch", "_rref_id", "_fork_id", "_slot", "_creation", "_made_by", "_type", "_function", "_unreleased", "__weakref__")

    def __init__(self, value: Any, type_hint: Any = None) -> None:
        """Make a local RRef, owned by this worker, to ``value``."""
        agent = current_agent_or_not_set()
        me = agent.info.id
        rref_id, fork_id = agent.new_id(), agent.new_id()
        slot = agent.owner_table.creation_slot(rref_id)
        slot.set_result(value)
        agent.add_fork(me, rref_id, fork_id, holder=me)
        self._bind(agent, me, rref_id, fork_id, slot, None)

    def _bind(self, agent: TensorPipeAgent, owner_id: int, rref_id: Id, fork_id: Id, slot: Optional[Future[Any]], creation: Optional[_CallFuture], function: Optional[str] = None) -> None:
        self._made_by: Optional[Callable[..., Any]] = None  # the function remote() ran, if known
        self._type: Optional[type] = None  # the value's type, once _get_type has learnt it
        # The name of the function that made the value, if remote() called it by name
        # (remote_function): the owner's Go agent keeps the value, in msgpack.
        self._function = function
        owner = agent.worker_by_id(owner_id)
        if owner is None:
            raise RuntimeError(f"the RRef's owner, worker id {owner_id}, is not in the world (it left)")
        self._owner = owner
        self._owner_epoch = agent.member_epoch(owner_id)
        # Popped by the one release (list.pop is atomic: __del__ may run on any thread).
        self._unreleased = [True]
        self._owner_id = owner_id
        self._rref_id = rref_id
        self._fork_id = fork_id
        self._slot = slot
        self._creation = creation
        self._agent = agent  # last: __del__ releases the fork once it is set
        if owner_id != agent.info.id:
            agent.user_rrefs.add(self)

    def __del__(self) -> None:
        self._release()

    def _release(self) -> None:
        """Tell the owner this worker no longer holds the fork (once: when the RRef dies, or
        at a graceful shutdown)."""
        agent = getattr(self, "_agent", None)
        # Not to an owner that left: a worker that joined under its id since holds no fork.
        if agent is None or not agent.running or agent.member_epoch(self._owner_id) != self._owner_epoch:
            return
        try:
            self._unreleased.pop()
        except IndexError:
            return
        agent.release_fork(self._owner_id, self._rref_id, self._fork_id)

    def _deleted_error(self, what: str) -> RuntimeError:
        return RuntimeError(f"{self!r} has been deleted. Cannot call {what} on it after deletion.")

    def is_owner(self) -> bool:
        """Whether this worker owns the value."""
        return self._owner_id == self._agent.info.id

    def owner(self) -> WorkerInfo:
        """The owner's :class:`WorkerInfo` (known even once it left a dynamic world)."""
        return self._owner

    def _owner_to_call(self) -> WorkerInfo:
        """The owner, to send it a call about this RRef; raises if it left a dynamic world
        (even if a worker of its name and id joined since: the value went with the one that
        left)."""
        if self._agent.member_epoch(self._owner_id) != self._owner_epoch:
            raise RuntimeError(f"the owner of this RRef, worker {self._owner.name} (id {self._owner_id}), left the world, and its value with it")
        return self._owner

    def owner_name(self) -> str:
        """The owner's name."""
        return self.owner().name

    def confirmed_by_owner(self) -> bool:
        """Whether the owner has confirmed this reference: always on the owner, and on a user
        once the owner has answered the ``remote()`` call that made it."""
        return self._creation is None or self._creation.done()

    def local_value(self) -> Any:
        """The value itself; only on the owner. Raises the error its creation raised."""
        self._python_value("local_value()")
        if not self.is_owner():
            (c, l), (fc, fl) = self._rref_id, self._fork_id
            raise RuntimeError(
                f"For UserRRef(rref_id=GloballyUniqueId(created_on={c}, local_id={l}), "
                f"fork_id=GloballyUniqueId(created_on={fc}, local_id={fl})), can't call localValue() "
                f"on user {self._agent.info}. Call it on owner {self.owner()}"
            )
        assert self._slot is not None  # an owner's RRef to a Python value has one (_make_rref)
        return self._slot.wait()

    def to_here(self, timeout: float = constants.UNSET_RPC_TIMEOUT) -> Any:
        """Copy the value from the owner and return it (on the owner, the value itself).
        Raises the error its creation raised."""
        timeout = call_timeout(timeout, self._agent.rpc_timeout)
        if self.is_owner() and self._function is None:
            return self.local_value()
        if not self._agent.running:
            # Its fork went with this worker's shutdown: a value cached with its creation is
            # not answered from either (torch's words).
            raise self._deleted_error("to_here()")
        started = time.monotonic()
        creation = self._creation
        if creation is not None and creation.done():
            if getattr(creation, "timed_out", False):
                raise RuntimeError(
                    "RRef creation via rpc.remote() timed out, and it is possible that the RRef on the owner node does not exist."
                )
            inlined = creation.wait()  # raises a failed creation's error
            if inlined is not None:
                return inlined[0]
            creation = None
        # The owner confirms a creation before it answers a fetch, with the value itself if it
        # is small and immutable (it cannot change). If the last creation by the same function
        # came so, the confirmation is awaited first; otherwise the fetch goes at once, and the
        # two round trips overlap.
        fetch = None
        if creation is None or not _came_inlined(self._made_by):
            fetch = self._agent.fetch(self._owner_to_call(), self._rref_id, timeout, self._function)
        if creation is not None:
            if not creation.wait_for(timeout if timeout > 0 else None):
                raise RuntimeError(
                    f"RPC ran for more than set timeout ({round(timeout * 1000)} ms) and will now be marked "
                    f"with an error: to_here() of an RRef whose creation on worker {self.owner_name()} is not confirmed"
                )
            try:
                inlined = creation.wait()  # raises a failed creation's error
            except Exception:
                if not getattr(creation, "timed_out", False):
                    raise
                # The creation's own timeout passed while this to_here() waited: as torch's, it
                # fetches the value, which the owner still makes.
            else:
                _remember_inlined(self._made_by, inlined is not None)
                if inlined is not None:
                    return inlined[0]
        if fetch is None:
            # The whole to_here() is bounded by timeout: the fetch has what is left, and its
            # timeout error names timeout itself.
            left = max(1e-3, timeout - (time.monotonic() - started)) if timeout > 0 else timeout
            fetch = self._agent.fetch(self._owner_to_call(), self._rref_id, left, self._function, named_timeout=timeout)
        return fetch.wait()

    def rpc_sync(self, timeout: float = constants.UNSET_RPC_TIMEOUT) -> RRefProxy:
        """A proxy whose method calls run the value's method on the owner with ``rpc_sync``:
        ``rref.rpc_sync().method(*args)``."""
        self._python_value("rpc_sync()")
        return RRefProxy(self, self._agent.rpc_sync, timeout)

    def rpc_async(self, timeout: float = constants.UNSET_RPC_TIMEOUT) -> RRefProxy:
        """Like :meth:`rpc_sync`, but each method call returns a Future."""
        self._python_value("rpc_async()")
        return RRefProxy(self, self._agent.rpc_async, timeout, blocking=False)

    def remote(self, timeout: float = constants.UNSET_RPC_TIMEOUT) -> RRefProxy:
        """Like :meth:`rpc_sync`, but each method call returns an RRef to its result, kept on
        the owner."""
        self._python_value("remote()")
        return RRefProxy(self, functools.partial(remote_rref, self._agent), timeout)

    def backward(self, dist_autograd_ctx_id: int = -1, retain_graph: bool = False) -> None:
        """Run the backward pass with this RRef's value (a scalar tensor) as its root.

        With ``dist_autograd_ctx_id``, a distributed backward pass in that context, started on
        the owner (the gradients are then in that context, see ``autograd.get_gradients``);
        without it (-1), a local backward pass, which only the owner can run."""
        if not isinstance(dist_autograd_ctx_id, int) or isinstance(dist_autograd_ctx_id, bool):
            raise TypeError(f"dist_autograd_ctx_id must be an int, got {type(dist_autograd_ctx_id).__name__}")
        self._python_value("backward()")
        if dist_autograd_ctx_id == -1 and not self.is_owner():
            raise RuntimeError(f"a local backward (no dist_autograd_ctx_id) can only run on the RRef's owner, {self.owner_name()}: pass the distributed autograd context id")
        if self.is_owner():
            _backward_owner_rref(self, dist_autograd_ctx_id, retain_graph)
        else:
            self._agent.rpc_sync(self._owner_to_call(), function_call(_backward_owner_rref, (self, dist_autograd_ctx_id, retain_graph), None), -1)

    def _python_value(self, what: str) -> None:
        """Raise if the value is not a Python object on its owner (remote() of a function
        called by name keeps it in msgpack): ``what`` needs one."""
        if self._function is not None:
            raise TypeError(
                f"{what} needs a Python object on the owner, but this RRef's value, made by "
                f"remote_function({self._function!r}) on worker {self._owner.name}, is kept as msgpack: use to_here()"
            )

    def _get_type(self, timeout: float = constants.UNSET_RPC_TIMEOUT, blocking: bool = True) -> Any:
        """The type of the value (asked of the owner once, then kept); with
        ``blocking=False``, a Future of it."""
        self._python_value("_get_type()")
        if self._type is None and self.is_owner():
            self._type = type(self.local_value())
        if self._type is not None:
            if blocking:
                return self._type
            known: Future[type] = Future()
            known.set_result(self._type)
            return known
        asked = self._agent.rpc_async(self._owner_to_call(), function_call(_type_on_owner, (self,), None), timeout)

        def learnt(fut: Future[type]) -> type:
            self._type = value_type = fut.value()
            return value_type

        typed = asked._chain(learnt)
        return typed.wait() if blocking else typed

    def _get_future(self) -> Future[None]:
        """The future of this RRef's creation by ``remote()`` (complete for other RRefs): None,
        or the creation's error."""
        if self._creation is not None:
            return self._creation._chain(_no_value)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def __reduce__(self) -> Tuple[Callable[..., RRef[Any]], Tuple[int, Id, Id, Optional[str]]]:
        context = current_send_context()
        if context is None:
            raise RuntimeError("Can not pickle rref in python pickler, rref can only be pickled when using RPC")
        self._owner_to_call()  # a fork of a value that left with its owner is no RRef
        fork_id = self._agent.new_id()
        context.forks.append((self._owner_id, self._rref_id, fork_id))
        return (_rebuild_rref, (self._owner_id, self._rref_id, fork_id, self._function))

    def __repr__(self) -> str:
        (c, l), (fc, fl) = self._rref_id, self._fork_id
        if self.is_owner():
            return f"OwnerRRef(GloballyUniqueId(created_on={c}, local_id={l}))"
        return (
            f"UserRRef(RRefId = GloballyUniqueId(created_on={c}, local_id={l}), "
            f"ForkId = GloballyUniqueId(created_on={fc}, local_id={fl}))"
        )

    __str__ = __repr__


class RRef(PyRRef, Generic[T]):
    """A remote reference to a value of type ``T`` kept on its owner worker.

    ``RRef(value)`` makes one owned by this worker; :func:`~tensorplay_rpc.remote` makes one
    owned by another. An RRef can be passed in RPC arguments and results, also inside
    containers; it arrives as an RRef to the same value.
    """

    __slots__ = ()


def method_factory(method_name: str, docstring: Optional[str]) -> Callable[..., Any]:
    """Return a method that forwards ``obj.<method_name>(...)`` to the implementation in
    :class:`PyRRef`, with ``docstring`` as its documentation."""

    def method(self: RRef[Any], *args: Any, **kwargs: Any) -> Any:
        return getattr(super(RRef, self), method_name)(*args, **kwargs)

    method.__name__ = method_name
    method.__qualname__ = f"RRef.{method_name}"
    method.__doc__ = docstring
    return method


for _name, _impl in inspect.getmembers(PyRRef, inspect.isfunction):
    if _name.startswith("_") and _name != "__str__":
        continue
    new_method = method_factory(_name, _impl.__doc__)
    setattr(RRef, _name, new_method)


def remote_function_rref(agent: TensorPipeAgent, dest: WorkerInfo, fn: RemoteFunction, args: Optional[Tuple[Any, ...]], kwargs: Optional[Dict[str, Any]], timeout: float) -> "RRef[Any]":
    """``remote()`` of a function ``dest`` serves by name: an RRef to its result, which
    ``dest``'s Go agent keeps (in msgpack) until the last reference to it is gone."""
    rref_id, fork_id, creation = agent.remote_function(dest, fn, args, kwargs, timeout)
    return _make_rref(agent, dest.id, rref_id, fork_id, creation, fn.name)


def remote_rref(agent: TensorPipeAgent, dest: WorkerInfo, call: FunctionCall, timeout: float) -> "RRef[Any]":
    """Run ``call`` on ``dest`` and return an RRef to its result, kept there (``remote()``)."""
    rref_id, fork_id, creation = agent.remote(dest, call, timeout)
    rref = _make_rref(agent, dest.id, rref_id, fork_id, creation)
    rref._made_by = call[0]
    return rref


# Whether the value of the last RRef a function made came with its creation's confirmation.
_inlined_by: "weakref.WeakKeyDictionary[Callable[..., Any], bool]" = weakref.WeakKeyDictionary()


def _came_inlined(func: Optional[Callable[..., Any]]) -> bool:
    try:
        return func is not None and _inlined_by.get(func, False)
    except TypeError:  # not weakly referenceable, or unhashable
        return False


def _remember_inlined(func: Optional[Callable[..., Any]], inlined: bool) -> None:
    try:
        if func is not None:
            _inlined_by[func] = inlined
    except TypeError:
        pass


def _backward_owner_rref(rref: PyRRef, context_id: int, retain_graph: bool) -> None:
    """Runs on an RRef's owner: the backward pass from its value (see PyRRef.backward)."""
    value = rref.local_value()
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        raise RuntimeError("RRef should contain a tensor for .backward()")
    if context_id == -1:
        torch.autograd.backward([value], retain_graph=retain_graph)
        return
    from . import _dist_autograd, _dist_backward

    # Not recorded in the context (the caller's thread may be in it: a self-call).
    with _dist_autograd.suspended():
        _dist_backward.backward(context_id, [value], retain_graph)


def _type_on_owner(rref: "RRef[Any]") -> type:
    """Run on the owner: the type of the RRef's value."""
    return type(rref.local_value())


def _no_value(creation: Future[Any]) -> None:
    creation.value()  # raises the creation's error


def _make_rref(agent: TensorPipeAgent, owner_id: int, rref_id: Id, fork_id: Id, creation: Optional[_CallFuture] = None, function: Optional[str] = None) -> RRef[Any]:
    """An RRef object holding ``fork_id``, already registered with the owner."""
    rref: RRef[Any] = RRef.__new__(RRef)
    slot = agent.owner_table.slot(rref_id) if owner_id == agent.info.id and function is None else None
    rref._bind(agent, owner_id, rref_id, fork_id, slot, creation, function)
    return rref


def _rebuild_rref(owner_id: int, rref_id: Id, fork_id: Id, function: Optional[str] = None) -> RRef[Any]:
    """Unpickle an RRef: on its owner, the owner's RRef again; elsewhere, a user RRef."""
    agent = current_agent()
    if agent is None:
        raise RuntimeError("an RRef can only be unpickled on an initialized RPC worker")
    # The ids come from a peer: check them before Go or the owner table ever sees them.
    if type(owner_id) is not int or agent.worker_by_id(owner_id) is None:
        raise ValueError(f"an RRef arrived naming owner {owner_id!r}, which is not a worker of this world")
    for what, id_ in (("RRef", rref_id), ("fork", fork_id)):
        if not (isinstance(id_, (tuple, list)) and len(id_) == 2 and all(type(x) is int and -(1 << 63) <= x < 1 << 63 for x in id_)):
            raise ValueError(f"an RRef arrived with a malformed {what} id {id_!r}")
    if function is not None and not isinstance(function, str):
        raise ValueError(f"an RRef arrived naming function {function!r}")
    # Checked above: each id is two ints, though perhaps a list.
    return _make_rref(agent, owner_id, cast(Id, tuple(rref_id)), cast(Id, tuple(fork_id)), function=function)
