"""One MASTER_PORT for torch.distributed and RPC (issues 14 and 16): a gloo process group on
the same port, in either order, and torchrun's agent store holding the port. The same worlds
run on torch's own RPC, which must agree."""

import datetime

import pytest

from conftest import end_processes, run_world, start_world

WORLD = 3
GLOO_ON_LOOPBACK = {"GLOO_SOCKET_IFNAME": "lo"}


def ring_outcome(rank: int) -> dict:
    """What a rank of ``worlds.torch_store._round`` sees in a world of WORLD."""
    return {"called": 100 + rank, "tensor": [1.0 + rank] * 3, "all_reduce": float(sum(range(WORLD)))}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("order", ["pg_first", "rpc_first"])
def test_a_process_group_and_rpc_share_master_port(order: str) -> None:
    by_backend = {}
    for backend in ("ours", "torch"):
        results = run_world("torch_store:process_group_and_rpc", WORLD, env=GLOO_ON_LOOPBACK, args=[backend, order, "2"], timeout=90)
        by_backend[backend] = [r.value for r in results]
    # Two RPC worlds in a row on one process group: each init_rpc meets under its own key.
    assert by_backend["ours"] == [[ring_outcome(rank)] * 2 for rank in range(WORLD)]
    assert by_backend["ours"] == by_backend["torch"]


@pytest.mark.timeout(200)
def test_under_torchruns_agent_store(world) -> None:
    import torch.distributed as dist

    by_backend = {}
    for attempt, backend in enumerate(("ours", "torch")):
        env = dict(GLOO_ON_LOOPBACK, TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT=str(attempt))
        w = world("torch_store:under_agent_store", WORLD, env=env, args=[backend])
        # The agent's store holds MASTER_PORT, as torchrun's does; the ranks wait for it.
        agent_store = dist.TCPStore("127.0.0.1", w.port, None, True, datetime.timedelta(seconds=60), wait_for_workers=False)
        try:
            results = w.finish(90)
        finally:
            end_processes(w.procs)
        assert all(r.returncode == 0 and r.error is None for r in results), [r.error or r.output[-2000:] for r in results]
        by_backend[backend] = [r.value for r in results]
        if backend == "ours":
            # We met there: rank 0 published its own store, on a port of its own.
            published = agent_store.get("tensorplay_rpc/attempt_0/round_0/store").decode()
            assert published.startswith("127.0.0.1:") and not published.endswith(f":{w.port}")
    assert by_backend["ours"] == [ring_outcome(rank) for rank in range(WORLD)]
    assert by_backend["ours"] == by_backend["torch"]


@pytest.mark.timeout(120)
def test_a_program_without_torch_never_imports_it() -> None:
    results = run_world("torch_store:without_torch", WORLD, timeout=60)
    assert [r.value for r in results] == [{"value": max(1, rank), "torch_imported": False} for rank in range(WORLD)]


@pytest.mark.timeout(120)
def test_a_rank_waiting_for_rank_0_at_torchs_store_says_so(world) -> None:
    import torch.distributed as dist

    w = world("torch_store:join_alone", 2, ranks=[1], env={"TORCHELASTIC_USE_AGENT_STORE": "True"}, args=["2"])
    agent_store = dist.TCPStore("127.0.0.1", w.port, None, True, datetime.timedelta(seconds=30), wait_for_workers=False)
    [result] = w.finish(60)
    assert result.value is not None, result.output
    assert "rank 1: rank 0 did not publish its rendezvous store at torch's store 127.0.0.1" in result.value
    del agent_store


@pytest.mark.timeout(60)
def test_an_unknown_rendezvous_choice_is_refused() -> None:
    [result] = run_world("torch_store:join_alone", 1, env={"TENSORPLAY_RPC_RENDEZVOUS": "maybe"}, args=["5"], timeout=30)
    assert result.value == "ValueError: TENSORPLAY_RPC_RENDEZVOUS='maybe' is not one of auto, torch, own"


@pytest.mark.timeout(120)
def test_no_core_spins_after_the_store_host_dies(world) -> None:
    w = world("torch_store:idle_after_rank_0_dies", 2)
    results = w.finish(60)
    assert results[0].returncode == 0, results[0].output
    assert results[1].error is None, results[1].error
    # Idle: well under a core-second in 2 s (a store client spinning from 0.5 s on takes about 1.5).
    assert results[1].value < 0.5, results[1].value
