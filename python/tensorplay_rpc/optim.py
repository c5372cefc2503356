"""``DistributedOptimizer``, as ``torch.distributed.optim.DistributedOptimizer``: one local
optimizer per worker that owns some of the parameters, each stepping with that worker's
gradients of a distributed autograd context.

    opt = DistributedOptimizer(torch.optim.SGD, param_rrefs, lr=0.05)
    with autograd.context() as context_id:
        loss = ...
        autograd.backward(context_id, [loss])
        opt.step(context_id)
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Sequence

from . import _dist_autograd
from ._agent import function_call, require_agent
from .api import rpc_async
from .futures import wait_all
from .rref import RRef

__all__ = ["DistributedOptimizer"]


class _LocalOptimizer:
    """The optimizer on one owner of parameters: ``optimizer_class`` over the values of
    ``param_rrefs`` (all owned here)."""

    # One step at a time on a worker, whichever optimizer: trainers stepping at once through
    # optimizers that share parameters must not interleave their gradients (as torch's).
    _step_lock = threading.Lock()

    def __init__(self, optimizer_class: Any, param_rrefs: Sequence[RRef[Any]], *args: Any, **kwargs: Any) -> None:
        self._params = [rref.local_value() for rref in param_rrefs]
        self.optim = optimizer_class(self._params, *args, **kwargs)

    def step(self, context_id: int) -> None:
        """Step with this worker's gradients of context ``context_id`` (a parameter that got
        none is not stepped); ``.grad`` is as it was afterwards."""
        grads = _dist_autograd.get_gradients(context_id)
        with _LocalOptimizer._step_lock:
            held = [param.grad for param in self._params]
            try:
                for param in self._params:
                    param.grad = grads.get(param)
                self.optim.step()
            finally:
                for param, grad in zip(self._params, held):
                    param.grad = grad


def _new_local_optimizer(optimizer_class: Any, param_rrefs: Sequence[RRef[Any]], *args: Any, **kwargs: Any) -> RRef[_LocalOptimizer]:
    return RRef(_LocalOptimizer(optimizer_class, param_rrefs, *args, **kwargs))


def _local_optimizer_step(optimizer: RRef[_LocalOptimizer], context_id: int) -> None:
    optimizer.local_value().step(context_id)


class DistributedOptimizer:
    """An optimizer over parameters spread across workers.

    ``params_rref`` is a list of RRefs to the parameters (from ``RRef(param)`` on their owners,
    or ``RemoteModule.remote_parameters()``). One ``optimizer_class(params, *args, **kwargs)`` is
    made on each owner, for the parameters it owns; :meth:`step` steps them all at once, each
    with its own worker's gradients of the context.
    """

    def __init__(self, optimizer_class: Any, params_rref: Sequence[RRef[Any]], *args: Any, **kwargs: Any) -> None:
        if not callable(optimizer_class):
            raise TypeError(f"optimizer_class must be an optimizer class, got {optimizer_class!r}")
        if not all(isinstance(p, RRef) for p in params_rref):
            raise TypeError("params_rref must be a list of RRefs to parameters")
        per_owner: Dict[str, List[RRef[Any]]] = {}
        for param in params_rref:
            per_owner.setdefault(param.owner_name(), []).append(param)
        futures = [
            rpc_async(owner, _new_local_optimizer, args=(optimizer_class, rrefs, *args), kwargs=kwargs)
            for owner, rrefs in per_owner.items()
        ]
        self.remote_optimizers: List[RRef[_LocalOptimizer]] = wait_all(futures)

    def step(self, context_id: int) -> None:
        """One step of every owner's optimizer, with the gradients of distributed autograd
        context ``context_id``; returns once all are done (raises the first error)."""
        _dist_autograd.retrieve_context(context_id)  # raises naming it if there is none here
        remote = [opt for opt in self.remote_optimizers if not opt.is_owner()]
        agent = require_agent()
        futures = [agent.rpc_async(opt.owner(), function_call(_local_optimizer_step, (opt, context_id), None), -1, internal=True) for opt in remote]
        # This worker's own optimizer steps here meanwhile, without a call to itself.
        local_error: Optional[BaseException] = None
        for opt in self.remote_optimizers:
            if opt.is_owner():
                try:
                    _local_optimizer_step(opt, context_id)
                except BaseException as exc:
                    local_error = local_error or exc
        wait_all(futures)
        if local_error is not None:
            raise local_error

    def __repr__(self) -> str:
        owners: Optional[List[str]] = [opt.owner_name() for opt in self.remote_optimizers]
        return f"DistributedOptimizer(owners={owners})"
