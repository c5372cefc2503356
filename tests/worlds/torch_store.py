"""Worlds that share MASTER_PORT with torch: a gloo process group on the same port, or
torchrun's agent store holding it. Each scenario runs on either backend (``ours`` or
``torch``), so the tests can check torch's own RPC agrees."""

import importlib
import os
import sys

import tensorplay_rpc
from worlds.common import add

BACKENDS = {"ours": "tensorplay_rpc", "torch": "torch.distributed.rpc"}


def _rpc(backend):
    return importlib.import_module(BACKENDS[backend])


def _options(rpc):
    return rpc.TensorPipeRpcBackendOptions(init_method="env://", rpc_timeout=30)


def _round(rpc, rank, world_size):
    """One round of calls around the ring and an all_reduce: both tenants of the port work."""
    import torch
    import torch.distributed as dist

    peer = f"w{(rank + 1) % world_size}"
    called = rpc.rpc_sync(peer, add, args=(rank, 100))
    fut = rpc.rpc_async(peer, torch.add, args=(torch.ones(3), rank))
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    return {"called": called, "tensor": fut.wait().tolist(), "all_reduce": total.item()}


def process_group_and_rpc(rank, world_size, backend, order, rpc_rounds="1"):
    """init_process_group and init_rpc on the same MASTER_ADDR/MASTER_PORT, in ``order``
    (``pg_first`` or ``rpc_first``); then ``rpc_rounds`` - 1 more RPC worlds made and left
    while the process group lives. (One process group per store: torch's own re-init of a
    group on a store reads the last group's keys.)"""
    import torch.distributed as dist

    rpc = _rpc(backend)
    name, opts = f"w{rank}", _options(rpc)
    if order == "pg_first":
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=opts)
    else:
        rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=opts)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    outcomes = [_round(rpc, rank, world_size)]
    rpc.shutdown()
    for _ in range(int(rpc_rounds) - 1):
        rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=opts)
        outcomes.append(_round(rpc, rank, world_size))
        rpc.shutdown()
    dist.destroy_process_group()
    return outcomes


def under_agent_store(rank, world_size, backend):
    """As under torchrun with TORCHELASTIC_USE_AGENT_STORE=True: a store the test serves
    holds MASTER_PORT; join through it, and a process group too."""
    import torch.distributed as dist

    assert os.environ["TORCHELASTIC_USE_AGENT_STORE"] == "True"
    rpc = _rpc(backend)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size, rpc_backend_options=_options(rpc))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    outcome = _round(rpc, rank, world_size)
    rpc.shutdown()
    dist.destroy_process_group()
    return outcome


def without_torch(rank, world_size):
    """A program that never imports torch: our own store on MASTER_PORT, and torch stays
    unimported."""
    assert "torch" not in sys.modules
    tensorplay_rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size)
    value = tensorplay_rpc.rpc_sync(f"w{(rank + 1) % world_size}", max, args=(1, rank))
    tensorplay_rpc.shutdown()
    return {"value": value, "torch_imported": "torch" in sys.modules}


def join_alone(rank, world_size, rpc_timeout):
    """Join, expecting to fail: the error's text, or None if it joined."""
    try:
        tensorplay_rpc.init_rpc(
            f"w{rank}", rank=rank, world_size=world_size,
            rpc_backend_options=tensorplay_rpc.TensorPipeRpcBackendOptions(rpc_timeout=float(rpc_timeout)),
        )
    except Exception as e:  # the test reads the reason
        return f"{type(e).__name__}: {e}"
    tensorplay_rpc.shutdown()
    return None


def idle_after_rank_0_dies(rank, world_size):
    """Rank 0 exits at once after the join; the others wait until a call to it fails, then
    report the CPU seconds their process used in the 2 s after that (torch 1.13's store client,
    if kept, spins on a core once the store's server is gone)."""
    import time

    import torch  # noqa: F401 - a program that uses torch: the world meets at torch's store

    tensorplay_rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size)
    if rank == 0:
        os._exit(0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            tensorplay_rpc.rpc_sync("w0", max, args=(1, 2), timeout=5)
        except RuntimeError:
            break
        time.sleep(0.05)
    # Measured from the moment the call failed: a spinning client, once it notices the closed
    # server, takes most of the window.
    before = time.process_time()
    time.sleep(2.0)
    used = time.process_time() - before
    tensorplay_rpc.shutdown(graceful=False)
    return used
