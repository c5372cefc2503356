"""Distributed autograd's backward passes (see ``_dist_autograd`` for the contexts and the
recording of sends and receives they follow): the caller's pass from the roots, each worker's
pass from the tensors it sent, and the waves of calls that carry gradients between them."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from ._dist_autograd import retrieve_context, suspended
from ._dist_recv import RecvKey, _dummy, _recv_function, _thread

__all__ = ["backward", "backward_passes"]

_lock = threading.Lock()
_backward_passes = 0


def backward_passes() -> int:
    """How many backward passes (a caller's or a peer's) are running on this worker."""
    return _backward_passes


# The caller's passes let leaves' .grad take their gradients for a moment (see the module's
# doc): two at once on this worker would mix them. Passes started by peers use no .grad.
_root_pass_lock = threading.Lock()


def _walk(outputs: Sequence[Any]) -> Tuple[List[Any], bool]:
    """The leaves that require grad reachable from ``outputs`` (each once), and whether a
    receive node is."""
    recv_type = _recv_function()._backward_cls
    leaves: Dict[int, Any] = {}
    reaches_recv = False
    stack = []
    for out in outputs:
        if out.grad_fn is None:
            leaves[id(out)] = out
        else:
            stack.append(out.grad_fn)
    # Keyed by id, holding the node: a node's Python object may be made anew at each access,
    # and a freed one's id reused.
    seen: Dict[int, Any] = {}
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        if isinstance(node, recv_type):
            reaches_recv = True
            continue  # its only input is the dummy leaf
        variable = getattr(node, "variable", None)
        if variable is not None:  # AccumulateGrad: a leaf
            leaves[id(variable)] = variable
            continue
        for nxt, _ in node.next_functions:
            if nxt is not None and id(nxt) not in seen:
                stack.append(nxt)
    return list(leaves.values()), reaches_recv


@contextlib.contextmanager
def _pass_running() -> Iterator[List[Tuple[RecvKey, Any]]]:
    """Count a pass and collect what reaches receive nodes on this thread meanwhile; no
    current context (the pass's own messages are not recorded)."""
    global _backward_passes
    collector: List[Tuple[RecvKey, Any]] = []
    previous = _thread.collector
    _thread.collector = collector
    with _lock:
        _backward_passes += 1
    try:
        with suspended():
            yield collector
    finally:
        _thread.collector = previous
        with _lock:
            _backward_passes -= 1


# A pass's gradients for tensors other workers sent, grouped: (context id, sender) -> the
# messages' (indices, gradients) by message id.
Outgoing = Dict[Tuple[int, int], Dict[int, Tuple[List[int], List[Any]]]]
# The same, as a call of _pass_from_sends carries it: (message id, indices, gradients).
Items = List[Tuple[int, List[int], List[Any]]]


def backward(context_id: int, roots: Sequence[Any], retain_graph: bool = False) -> None:
    """Run the distributed backward pass from ``roots`` (scalars) in context ``context_id``."""
    import torch

    ctx = retrieve_context(context_id)
    if not isinstance(roots, (list, tuple)) or not all(isinstance(r, torch.Tensor) for r in roots):
        raise TypeError(f"roots must be a list of tensors, got {type(roots).__name__}")
    for root in roots:
        if not root.requires_grad:
            raise RuntimeError("requires_grad not set on root")
        if root.numel() != 1:
            # torch's words, after the root's name (tensors have none unless named).
            raise RuntimeError(f"{root.names[0] if any(root.names) else ''} is not a scalar, all roots need to be scalar")
    if not roots:
        return
    leaves, _ = _walk(roots)
    with _root_pass_lock, _pass_running() as collector:
        saved = [(leaf, leaf.grad) for leaf in leaves]
        for leaf in leaves:
            leaf.grad = None
        try:
            # Every pass keeps the graph: see the module's doc.
            torch.autograd.backward(list(roots), [torch.ones_like(r) for r in roots], retain_graph=True)
        finally:
            for leaf, grad in saved:
                got, leaf.grad = leaf.grad, grad
                if got is not None:
                    ctx._accumulate(leaf, got)
    _drive(_grouped(collector))


def _drive(outgoing: Outgoing) -> None:
    """Carry the gradients a pass sent out to the workers that sent those tensors, in waves:
    each wave's passes run at once (this worker's own here, the others' by one call per worker
    and context) and return the gradients they send out in turn, which make the next wave,
    until none are left. Every call is made from here, one level deep: no pass waits on a
    thread of a worker that waits on it. Raises the first error of a wave, once it is over."""
    from ._agent import require_agent

    agent = require_agent()
    me = agent.info.id
    while outgoing:
        calls = []
        local = []
        for (context_id, sender), per_message in outgoing.items():
            items: Items = [(mid, idx, grads) for mid, (idx, grads) in per_message.items()]
            if sender == me:
                local.append((context_id, items))
                continue
            info = agent.worker_by_id(sender)
            if info is None:
                raise RuntimeError(f"distributed backward: worker id {sender}, which sent tensors of context {context_id}, left the world")
            with suspended():
                calls.append(agent.rpc_async(info, (_pass_from_sends, (context_id, items), {}), -1, internal=True))
        next_wave: Outgoing = {}
        first_error: Optional[BaseException] = None
        for context_id, items in local:
            try:
                _merge(next_wave, _pass_from_sends(context_id, items))
            except BaseException as exc:
                first_error = first_error or exc
        for call in calls:
            try:
                _merge(next_wave, call.wait())
            except BaseException as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        outgoing = next_wave


def _pass_from_sends(context_id: int, items: Items) -> Outgoing:
    """Runs on a worker that sent tensors requiring grad: the pass from those tensors, given
    the gradients their receivers computed (``items``: message id, indices, gradients). Returns
    the gradients that reached this worker's receive nodes, for the caller to carry on."""
    import torch

    ctx = retrieve_context(context_id)
    outputs: List[Any] = []
    grads: List[Any] = []
    for message_id, indices, gradients in items:
        sent = ctx._sent(message_id)
        for index, grad in zip(indices, gradients):
            if not 0 <= index < len(sent):
                raise RuntimeError(f"message {message_id} of context {context_id} sent {len(sent)} tensors requiring grad, not {index + 1}")
            outputs.append(sent[index])
            grads.append(grad)
    leaves, reaches_recv = _walk(outputs)
    inputs = leaves + ([_dummy()] if reaches_recv else [])
    with _pass_running() as collector:
        if inputs:
            got = torch.autograd.grad(outputs, inputs, grads, retain_graph=True, allow_unused=True)
            for leaf, grad in zip(leaves, got):
                if grad is not None:
                    ctx._accumulate(leaf, grad)
    return _grouped(collector)


def _grouped(collector: List[Tuple[RecvKey, Any]]) -> Outgoing:
    """What reached receive nodes, by the context and worker each tensor came from."""
    grouped: Outgoing = {}
    for (context_id, sender, message_id, index), grad in collector:
        if grad is None:
            continue
        indices, gradients = grouped.setdefault((context_id, sender), {}).setdefault(message_id, ([], []))
        indices.append(index)
        gradients.append(grad)
    return grouped


def _merge(into: Outgoing, more: Outgoing) -> None:
    for key, per_message in more.items():
        target = into.setdefault(key, {})
        for message_id, (indices, gradients) in per_message.items():
            held = target.setdefault(message_id, ([], []))
            held[0].extend(indices)
            held[1].extend(gradients)
