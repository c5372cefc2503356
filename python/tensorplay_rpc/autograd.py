"""Distributed autograd, as ``torch.distributed.autograd`` (its FAST mode).

Every RPC made inside ``with autograd.context() as context_id:`` whose arguments or results hold
tensors that require grad is recorded on both ends; ``backward(context_id, roots)`` then runs the
backward pass through every worker that took part, and each worker's gradients are in its own
context (``get_gradients``), not in ``.grad``. See ``tensorplay_rpc._dist_autograd`` for how.

    import tensorplay_rpc as rpc
    import tensorplay_rpc.autograd as dist_autograd

    with dist_autograd.context() as context_id:
        t1 = torch.rand((3, 3), requires_grad=True)
        t2 = torch.rand((3, 3), requires_grad=True)
        loss = rpc.rpc_sync("worker1", torch.add, args=(t1, t2)).sum()
        dist_autograd.backward(context_id, [loss])
        grads = dist_autograd.get_gradients(context_id)  # {t1: ..., t2: ...}
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Dict, List, Optional, Sequence, Type

from . import _dist_autograd, _dist_backward
from ._dist_autograd import DistAutogradContext

__all__ = ["DistAutogradContext", "backward", "context", "get_gradients", "is_available"]


def is_available() -> bool:
    """Whether distributed autograd is available (always, in this package)."""
    return True


class context:
    """A context manager around a forward and backward pass: ``with context() as context_id``.

    The id is unique across the world; every worker that takes part in the pass keeps what the
    pass needs under it, and all of them drop it when the block ends.
    """

    def __enter__(self) -> int:
        self.autograd_context = _dist_autograd.new_context()
        return self.autograd_context._context_id()

    def __exit__(self, kind: Optional[Type[BaseException]], value: Optional[BaseException], traceback: Optional[TracebackType]) -> None:
        _dist_autograd.release_context(self.autograd_context._context_id())


def backward(context_id: int, roots: Sequence[Any], retain_graph: bool = False) -> None:
    """Run the distributed backward pass from ``roots`` (scalar tensors) in context
    ``context_id``, through every worker the forward pass's RPCs reached; returns once all of
    them are done, or raises the first error any raised.

    Gradients accumulate in the context on the worker that owns each leaf (see
    :func:`get_gradients`). The graph is always kept until the context ends (``retain_graph``
    is accepted for torch's signature): a later pass of the same backward may reach it again.
    """
    _dist_backward.backward(context_id, roots, retain_graph)


def get_gradients(context_id: int) -> Dict[Any, Any]:
    """The gradients accumulated on this worker in context ``context_id``: a dict from each
    leaf tensor that got one to its gradient."""
    return _dist_autograd.get_gradients(context_id)


def _new_context() -> DistAutogradContext:
    """Make a new context current on this thread (what ``context()`` does on entry)."""
    return _dist_autograd.new_context()


def _release_context(context_id: int) -> None:
    """Release the context here and on every worker that took part (``context()``'s exit)."""
    _dist_autograd.release_context(context_id)


def _retrieve_context(context_id: int) -> DistAutogradContext:
    """The context of that id on this worker; raises if there is none."""
    return _dist_autograd.retrieve_context(context_id)


def _current_context() -> DistAutogradContext:
    """This thread's current context; raises if there is none."""
    return _dist_autograd.current_context()


def _is_valid_context(context_id: int) -> None:
    """Raise if this worker has no context of that id (torch's check, which returns None)."""
    _dist_autograd.retrieve_context(context_id)


def _get_max_id() -> int:
    """The largest context id this worker can make."""
    return _dist_autograd.max_id()


def _get_debug_info() -> Dict[str, str]:
    """This worker's distributed autograd counters, by name, as strings (torch's keys)."""
    return {
        "num_autograd_contexts": str(_dist_autograd.context_count()),
        "num_current_backward_passes": str(_dist_backward.backward_passes()),
    }


def _known_worker_ids(context_id: int) -> List[int]:
    """The workers this worker exchanged messages with in context ``context_id``."""
    return sorted(_dist_autograd.retrieve_context(context_id)._known_worker_ids())
