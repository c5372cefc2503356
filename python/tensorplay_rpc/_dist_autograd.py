"""The machinery of distributed autograd (torch's FAST mode); the public names are in
:mod:`tensorplay_rpc.autograd`.

- A *context* (one per ``with autograd.context()``) has an id unique across the world: the
  worker id in the top bits, a count below, as torch makes them. Each worker that takes part
  keeps its own :class:`DistAutogradContext` under that id.
- An RPC made on a thread whose current context is set goes in an *envelope*: the context id,
  a message id and the sender. Pickling records, in the sender's context, every tensor of the
  message that requires grad (the *send* side); unpickling on the receiver joins (or, for a
  request, creates) the context there and makes each such tensor the output of a
  :class:`_RecvRpcBackward` node (the *receive* side), keyed by sender, message and index. A
  request's handler runs in the request's context, so its reply and its own RPCs are recorded
  the same way.
- ``backward`` (``_dist_backward``) runs the local graph from the roots. Each receive node it reaches collects its
  gradient; once the local pass is over, the gradients go, one call per sender, to the workers
  that sent those tensors, which run their own pass from the tensors they sent and return the
  gradients that reached *their* receive nodes; the caller carries those on in the next wave,
  and so on until none are left (see ``_drive``). Every call is made by the caller, one level
  deep: no worker's thread waits on a worker that waits on it. ``backward`` returns when the
  whole world's part is done, or raises the first error any of them raised.
- Gradients of leaves accumulate in the context of the worker that owns them, summed over
  every pass, never in ``.grad`` (the first pass, on the caller, lets ``.grad`` take them for a
  moment so that hooks on leaves, DistributedDataParallel's all-reduce among them, see them,
  and puts ``.grad`` back as it was).
- Releasing a context tells every worker it exchanged messages with in it, which tell theirs.

Every pass keeps the graph (``retain_graph``): a worker's graph can be reached again by a
later pass of the same backward (a tensor sent twice, a worker called twice), and the graph is
freed with the context.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from ._dist_recv import _dummy, _recv_function, _thread

logger = logging.getLogger(__name__)

__all__ = [
    "DistAutogradContext",
    "current_context",
    "entered",
    "get_gradients",
    "is_valid_context",
    "max_id",
    "new_context",
    "outgoing_context",
    "record_sends",
    "release_context",
    "retrieve_context",
    "suspended",
    "take_received_context",
    "wrap",
]

# Ids are the worker id shifted above a per-worker count, as torch's are.
_COUNT_BITS = 48




class DistAutogradContext:
    """One distributed autograd context on this worker: the gradients of this worker's leaves,
    the tensors it sent that need gradients back (by message id), and the workers it exchanged
    messages with in this context."""

    def __init__(self, context_id: int) -> None:
        self._id = context_id
        self._lock = threading.Lock()
        self._grads: Dict[int, Tuple[Any, Any]] = {}  # id(leaf) -> (leaf, accumulated gradient)
        self._sends: Dict[int, List[Any]] = {}  # message id -> tensors sent that require grad
        self._receives = 0
        self._known: Set[int] = set()

    def _context_id(self) -> int:
        """This context's id, the same on every worker."""
        return self._id

    def _known_worker_ids(self) -> Set[int]:
        """The workers this worker sent messages to or received messages from in this context."""
        with self._lock:
            return set(self._known)

    def _send_functions(self) -> Dict[int, List[Any]]:
        """The tensors sent in this context that require grad, by message id."""
        with self._lock:
            return {mid: list(ts) for mid, ts in self._sends.items()}

    def _recv_function_count(self) -> int:
        """How many tensors this worker received in this context that require grad."""
        with self._lock:
            return self._receives

    def _know(self, worker_id: int) -> None:
        with self._lock:
            self._known.add(worker_id)

    def _record_sends(self, message_id: int, tensors: List[Any]) -> None:
        with self._lock:
            self._sends[message_id] = tensors

    def _sent(self, message_id: int) -> List[Any]:
        with self._lock:
            tensors = self._sends.get(message_id)
        if tensors is None:
            raise RuntimeError(f"distributed autograd context {self._id} on this worker has no message {message_id} that sent tensors requiring grad")
        return tensors

    def _accumulate(self, leaf: Any, grad: Any) -> None:
        with self._lock:
            held = self._grads.get(id(leaf))
            # A new tensor, never in place: the gradient may be shared with the caller's graph.
            self._grads[id(leaf)] = (leaf, grad if held is None else held[1] + grad)

    def _gradients(self) -> Dict[Any, Any]:
        with self._lock:
            return {leaf: grad for leaf, grad in self._grads.values()}

    def __repr__(self) -> str:
        return f"DistAutogradContext(context_id={self._id})"


_lock = threading.Lock()
_contexts: Dict[int, DistAutogradContext] = {}
_context_counts = itertools.count(1)
_message_counts = itertools.count(1)


def _worker_id() -> int:
    from ._agent import require_agent

    return require_agent().info.id


def _new_id(counts: "itertools.count[int]") -> int:
    return (_worker_id() << _COUNT_BITS) + next(counts)


def max_id() -> int:
    """The largest context or message id this worker can make."""
    return ((_worker_id() + 1) << _COUNT_BITS) - 1


# -- contexts -------------------------------------------------------------------------------


def new_context() -> DistAutogradContext:
    """A new context, current on this thread from now on."""
    if _thread.current is not None:
        raise RuntimeError("Already have an autograd context id for this thread.")
    ctx = DistAutogradContext(_new_id(_context_counts))
    with _lock:
        _contexts[ctx._context_id()] = ctx
    _thread.current = ctx._context_id()
    return ctx


def retrieve_context(context_id: int) -> DistAutogradContext:
    """The context of that id on this worker."""
    with _lock:
        ctx = _contexts.get(context_id)
    if ctx is None:
        raise RuntimeError(f"Could not find autograd context with id: {context_id}")
    return ctx


def is_valid_context(context_id: int) -> bool:
    """Whether this worker has a context of that id."""
    with _lock:
        return context_id in _contexts


def current_context() -> DistAutogradContext:
    """This thread's current context."""
    context_id = _thread.current
    ctx = None
    if context_id is not None:
        with _lock:
            ctx = _contexts.get(context_id)
    if ctx is None:
        raise RuntimeError(
            "Current thread doesn't have a valid autograd context. Please wrap your code using: "
            "`with tensorplay_rpc.autograd.context() as context_id` to generate a valid context"
        )
    return ctx


def context_count() -> int:
    """How many contexts this worker holds."""
    with _lock:
        return len(_contexts)


def release_context(context_id: int) -> None:
    """Drop the context here and tell every worker it exchanged messages with in it."""
    with _lock:
        ctx = _contexts.pop(context_id, None)
    if ctx is None:
        raise RuntimeError(f"Could not find autograd context with id: {context_id}")
    if _thread.current == context_id:
        _thread.current = None
    _tell_release(ctx, None)


def _tell_release(ctx: DistAutogradContext, told_by: Optional[int]) -> None:
    """Have the releasing thread tell the workers ``ctx`` knows (but ``told_by``) that it is
    released: the ``with`` block that ends a training step does not wait for them."""
    workers = ctx._known_worker_ids() - {told_by}
    if workers:
        _releases.put((ctx._context_id(), workers))
        _start_releasing()


_releases: "queue.SimpleQueue[Tuple[int, Set[int]]]" = queue.SimpleQueue()
_releasing: Optional[threading.Thread] = None


def _start_releasing() -> None:
    global _releasing
    if _releasing is None or not _releasing.is_alive():
        with _lock:
            if _releasing is None or not _releasing.is_alive():
                _releasing = threading.Thread(target=_release_loop, name="tensorplay-rpc-autograd-release", daemon=True)
                _releasing.start()


def _release_loop() -> None:
    """Tell peers of released contexts, a batch at a time; ends once idle for a while."""
    from ._agent import current_agent

    while True:
        try:
            batch = [_releases.get(timeout=10.0)]
        except queue.Empty:
            return
        while not _releases.empty():
            batch.append(_releases.get_nowait())
        agent = current_agent()
        if agent is None or not agent.running:
            continue
        me = agent.info.id
        calls = []
        for context_id, workers in batch:
            for worker_id in workers - {me}:
                info = agent.worker_by_id(worker_id)
                if info is None:  # left a dynamic world: its contexts went with it
                    continue
                try:
                    calls.append(agent.rpc_async(info, (_release_from_peer, (context_id, me), {}), -1, internal=True))
                except Exception as exc:  # shutting down meanwhile
                    logger.debug("telling a peer to release an autograd context failed: %s", exc)
        for call in calls:
            try:
                call.wait()
            except Exception as exc:  # the peer is gone or shutting down: its contexts go with it
                logger.debug("telling a peer to release an autograd context failed: %s", exc)


def _release_from_peer(context_id: int, told_by: int) -> None:
    """Runs on a worker a peer told that a context was released."""
    with _lock:
        ctx = _contexts.pop(context_id, None)
    if ctx is not None:
        _tell_release(ctx, told_by)


def release_all() -> None:
    """Forget every context (this worker is leaving its world)."""
    with _lock:
        _contexts.clear()
    _thread.current = None


# -- recording sends and receives ------------------------------------------------------------


def outgoing_context() -> Optional[int]:
    """The context an RPC made on this thread now is recorded in, or None (the common case)."""
    return _thread.current


@contextlib.contextmanager
def entered(context_id: Optional[int]) -> Iterator[None]:
    """Make ``context_id`` this thread's current context for the block (a request's handler)."""
    previous, _thread.current = _thread.current, context_id
    try:
        yield
    finally:
        _thread.current = previous


def suspended() -> "contextlib.AbstractContextManager[None]":
    """No current context for the block: the library's own messages are not recorded."""
    return entered(None)


class _Meta:
    """What an envelope says of its message; unpickled first, it sets up the receive."""

    __slots__ = ("context_id", "message_id", "sender", "reply")

    def __init__(self, context_id: int, message_id: int, sender: int, reply: bool) -> None:
        self.context_id, self.message_id, self.sender, self.reply = context_id, message_id, sender, reply

    def __reduce__(self) -> Tuple[Any, Tuple[int, int, int, bool]]:
        return _begin_receive, (self.context_id, self.message_id, self.sender, self.reply)


class Envelope:
    """A message sent in a context (see :func:`wrap`); on the receiver it unpickles as the
    message itself."""

    __slots__ = ("meta", "message")

    def __init__(self, meta: _Meta, message: Any) -> None:
        self.meta, self.message = meta, message

    def __reduce__(self) -> Tuple[Any, Tuple[_Meta, Any]]:
        return _open_envelope, (self.meta, self.message)


def wrap(message: Any, context_id: int, dest: int, reply: bool) -> Envelope:
    """``message``, to be sent to worker ``dest`` in context ``context_id`` (a request made in
    it, or the reply to one)."""
    ctx = retrieve_context(context_id)
    ctx._know(dest)
    return Envelope(_Meta(context_id, _new_id(_message_counts), _worker_id(), reply), message)


def record_sends(envelope: Envelope, tensors: Optional[List[Any]]) -> None:
    """Keep the tensors requiring grad that pickling ``envelope`` sent, in their order."""
    if tensors:
        with _lock:
            ctx = _contexts.get(envelope.meta.context_id)
        if ctx is not None:
            ctx._record_sends(envelope.meta.message_id, tensors)


class _Receiving:
    __slots__ = ("ctx", "sender", "message_id", "reply", "count", "previous")

    def __init__(self, ctx: Optional[DistAutogradContext], sender: int, message_id: int, reply: bool, previous: Optional["_Receiving"]) -> None:
        self.ctx, self.sender, self.message_id, self.reply = ctx, sender, message_id, reply
        self.count = 0
        self.previous = previous


def _begin_receive(context_id: int, message_id: int, sender: int, reply: bool) -> _Receiving:
    with _lock:
        ctx = _contexts.get(context_id)
        # A request joins its context here; a reply to a context released meanwhile records
        # nothing (it would make a context no one releases).
        if ctx is None and not reply:
            ctx = _contexts[context_id] = DistAutogradContext(context_id)
    if ctx is not None:
        ctx._know(sender)
    state = _Receiving(ctx, sender, message_id, reply, _thread.receiving)
    _thread.receiving = state
    return state


def _open_envelope(state: _Receiving, message: Any) -> Any:
    _thread.receiving = state.previous
    if not state.reply and state.ctx is not None:
        _thread.received = state.ctx._context_id()
    return message


def abandon_receive() -> None:
    """Unpickling a message failed: forget the receive it may have begun on this thread."""
    _thread.receiving = None
    _thread.received = None


def take_received_context() -> Optional[int]:
    """The context of the request just unpickled on this thread, if it came in one."""
    context_id = _thread.received
    if context_id is not None:
        _thread.received = None
    return context_id


def received_requiring_grad(tensor: Any) -> Any:
    """A received tensor that required grad on its sender: in a context, the output of a
    receive node that sends its gradient back; otherwise a leaf that requires grad."""
    state = _thread.receiving
    if state is None or state.ctx is None:
        return tensor.requires_grad_()
    index = state.count
    state.count += 1
    with state.ctx._lock:
        state.ctx._receives += 1
    key = (state.ctx._context_id(), state.sender, state.message_id, index)
    return _recv_function().apply(_dummy(), tensor, key)


def get_gradients(context_id: int) -> Dict[Any, Any]:
    """The gradients accumulated in context ``context_id`` on this worker, by leaf."""
    return retrieve_context(context_id)._gradients()
