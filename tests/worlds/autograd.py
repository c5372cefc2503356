"""Distributed autograd under faults: a worker that dies or freezes in the middle of a
backward pass fails the caller's backward promptly, naming it, and the rest of the world
goes on."""

import os
import signal
import time

import torch

import tensorplay_rpc as rpc
import tensorplay_rpc.autograd as dist_autograd

from .common import init, set_done, wait_done


class _StopsInBackward(torch.autograd.Function):
    """Its backward ends (SIGKILL) or freezes (SIGSTOP) the process running it."""

    @staticmethod
    def forward(ctx, x, how):
        ctx.how = how
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        os.kill(os.getpid(), ctx.how)
        # A signal a process sends itself takes effect a moment later: without a pause this
        # pass could finish and reply first.
        time.sleep(1)
        return grad, None


def stops_in_backward(x, how):
    return _StopsInBackward.apply(x, how) * 2, os.getpid()


def mul(x, y):
    return x * y


def _backward_outcome(worker, how):
    a = torch.ones(3, requires_grad=True)
    with dist_autograd.context() as cid:
        y, pid = rpc.rpc_sync(worker, stops_in_backward, args=(a, how))
        z = rpc.rpc_sync("worker2", mul, args=(a, a))
        started = time.monotonic()
        try:
            dist_autograd.backward(cid, [(y + z).sum()])
            outcome = None
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        took = time.monotonic() - started
    return outcome, took, pid


def _still_trains_with(worker):
    a = torch.ones(3, requires_grad=True)
    with dist_autograd.context() as cid:
        z = rpc.rpc_sync(worker, mul, args=(a, a))
        dist_autograd.backward(cid, [z.sum()])
        return dist_autograd.get_gradients(cid)[a].tolist()


def peer_dies_mid_backward(rank, world_size):
    init(rank, world_size)
    out = {}
    if rank == 0:
        out["killed"], out["killed_took"], _ = _backward_outcome("worker1", signal.SIGKILL)
        out["after_kill"] = _still_trains_with("worker2")
        rpc.rpc_sync("worker2", set_done)
    elif rank == 1:
        time.sleep(60)  # killed in its backward long before
    else:
        wait_done(60)
        time.sleep(0.5)  # the reply to set_done leaves before this worker does
    rpc.shutdown(graceful=False)  # a graceful one would wait for the dead worker
    return out


def peer_freezes_mid_backward(rank, world_size):
    init(rank, world_size, rpc_timeout=3)
    out = {}
    if rank == 0:
        out["frozen"], out["frozen_took"], pid = _backward_outcome("worker1", signal.SIGSTOP)
        out["after_freeze"] = _still_trains_with("worker2")
        os.kill(pid, signal.SIGCONT)
        out["w1_log"] = rpc.rpc_sync("worker1", get_log)
    rpc.shutdown()
    return out


LOG = []


def get_log():
    return LOG


def _install_log():
    from tensorplay_rpc import _dist_autograd as da
    orig = da._pass_from_sends

    def logged(context_id, items):
        LOG.append(("pass", context_id, [(m, i) for m, i, _ in items], {k: len(v) for k, v in da.retrieve_context(context_id)._sends.items()}))
        r = orig(context_id, items)
        LOG.append(("done", r))
        return r

    da._pass_from_sends = logged

