"""init_rpc and shutdown: the world forming, failing to form, and ending."""

import os
import signal
import subprocess
import time

import pytest

import tensorplay_rpc as rpc
from conftest import expect_behaviours, free_port, raised, run_world

# Every world here runs once over shared memory and once over gRPC.
pytestmark = pytest.mark.usefixtures("each_transport")


def test_calls_before_init_raise():
    not_init = "RPC has not been initialized. Call tensorplay_rpc.init_rpc first."
    for call in (
        lambda: rpc.rpc_sync("w", max, args=(1, 2)),
        lambda: rpc.rpc_async("w", max, args=(1, 2)),
        lambda: rpc.get_worker_info(),
        lambda: rpc.shutdown(),
    ):
        with pytest.raises(RuntimeError, match="RPC has not been initialized"):
            call()
    # torch's words where torch asks for the agent itself
    for call in (rpc.get_rpc_timeout, lambda: rpc.RRef(1), rpc._get_current_rpc_agent):
        with pytest.raises(RuntimeError, match="Current RPC agent is not set!"):
            call()
    with pytest.raises(RuntimeError) as info:
        rpc.rpc_sync("w", max)
    assert str(info.value) == not_init
    assert rpc.is_available() is True


def test_init_rejects_bad_arguments():
    with pytest.raises(TypeError, match="backend must be a member of BackendType"):
        rpc.init_rpc("w", backend="TENSORPIPE", rank=0, world_size=1)
    with pytest.raises(TypeError, match="rpc_backend_options must be an instance of RpcBackendOptions"):
        rpc.init_rpc("w", rank=0, world_size=1, rpc_backend_options={"rpc_timeout": 1})
    with pytest.raises(ValueError, match="cannot be used"):
        rpc.init_rpc("w", rank=0, world_size=1, rpc_backend_options=rpc.TensorPipeRpcBackendOptions(devices=["cuda:0"], init_method=f"tcp://127.0.0.1:{free_port()}"))


def test_single_worker_world_in_process():
    port = free_port()
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=5)
    rpc.init_rpc("solo", rank=0, world_size=1, rpc_backend_options=opts)
    try:
        assert rpc.get_worker_info() == rpc.WorkerInfo("solo", 0)
        assert rpc.rpc_sync("solo", max, args=(3, 9)) == 9
        assert rpc.rpc_async(0, sorted, args=([3, 1, 2],)).wait() == [1, 2, 3]
        with pytest.raises(RuntimeError, match="RPC is already initialized"):
            rpc.init_rpc("solo", rank=0, world_size=1, rpc_backend_options=opts)
    finally:
        rpc.shutdown()
    with pytest.raises(RuntimeError, match="RPC has not been initialized"):
        rpc.rpc_sync("solo", max, args=(1, 2))


def _errors(results):
    return [r.value for r in results]


def test_duplicate_names_fail_everyone():
    for err in _errors(run_world("faults:duplicate_name", 2, timeout=30)):
        assert err is not None and "RPC worker name same is not unique. Workers 0 and 1 share the same name." in err[1]


def test_duplicate_rank_fails():
    results = run_world("faults:try_init", 3, ranks=[0, 1, 1], timeout=30)
    errs = [r.value for r in results]
    assert all(e is not None for e in errs)
    assert any("rank 1 was taken by both" in e[1] for e in errs)


def test_rank_out_of_range():
    errs = _errors(run_world("faults:rank_out_of_range", 2, timeout=30))
    assert errs[1][0] == "RuntimeError" and "rank 5 is out of range for world_size 2" in errs[1][1]
    assert errs[0] is not None and "never joined" in errs[0][1]


def test_missing_worker_times_out_naming_ranks():
    errs = _errors(run_world("faults:missing_worker", 3, ranks=[0, 1], timeout=30))
    for err in errs:
        assert err[0] == "RuntimeError"
        assert "ranks [2] of world size 3 never joined" in err[1]
        assert err[2] < 10


def test_invalid_name():
    errs = _errors(run_world("faults:bad_name", 1, timeout=30))
    assert errs[0][0] == "RuntimeError" and "Worker name must match" in errs[0][1] and "bad name!" in errs[0][1]


def test_missing_master_addr():
    msg = run_world("faults:missing_master_addr", 1, timeout=30)[0].value
    assert msg and "MASTER_ADDR" in msg


def test_master_port_in_use():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=5)
        # Our store's refusal, or torch's when this process has imported torch (it then meets
        # at torch's store on that port): both say why.
        with pytest.raises(RuntimeError, match="(?i)address already in use"):
            rpc.init_rpc("w", rank=0, world_size=1, rpc_backend_options=opts)


def test_graceful_shutdown_waits_for_calls_in_flight():
    results = run_world("basic:graceful_shutdown", 3)
    for r in results:
        expect_behaviours(r.value, {
            "worker2's slow call, in flight at shutdown, completed": lambda v: r.rank != 2 or v["slow_result"] == 1.5,
            # worker0 and worker1 waited for worker2's slow call.
            f"worker{r.rank}'s shutdown waited for the world's calls in flight": lambda v: r.rank == 2 or v["waited"] > 1.0,
            "a call after shutdown is refused: RPC has not been initialized": lambda v: raised(RuntimeError, "not been initialized")(v["after"]),
            "a second shutdown is refused": lambda v: v["second_shutdown"][0] is RuntimeError,
        })


def test_graceful_shutdown_honours_its_timeout():
    result = run_world("faults:shutdown_timeout", 2)[0]
    expect_behaviours(result.value, {
        "shutdown(timeout=1.5) waited about 1.5 s, then returned, as torch's does": lambda o: o["error"] is None and 1.4 < o["took"] < 3.5,
        "this worker is shut down whole: no agent, none of its threads": lambda o: o["agent_left"] and o["threads_left"] == [],
        "a new world starts at once": lambda o: o["solo"] == 3,
    })
    assert "timed out" in result.output and "ranks [1]" in result.output and "left without them" in result.output, result.output


def test_non_graceful_shutdown_returns_at_once():
    took, outcome = run_world("basic:non_graceful", 2)[0].value
    assert took < 2, f"shutdown(graceful=False) took {took:.1f} s"
    assert raised(RuntimeError, "shut down", "worker1")(outcome), f"a call to a worker that shut down gave {outcome!r}"


def test_reinit_after_shutdown():
    results = run_world("basic:reinit", 2, args=[str(free_port())])
    assert [r.value for r in results] == [(2, 4), (2, 4)]


def test_dead_peer_fails_waiting_calls_promptly(world, tmp_path, each_transport):
    shm_files_before = set(os.listdir("/dev/shm"))
    ready = tmp_path / "ready"
    w = world("faults:peer_dies", 3, args=[str(ready)])
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "worker0 never got its calls in flight"
    w.kill(1)
    results = w.finish(timeout=30)
    out = results[0].value
    assert results[0].returncode == 0, results[0].output
    assert results[2].returncode == 0, results[2].output
    names_the_dead = lambda err: '"worker1"' in err  # noqa: E731
    expect_behaviours(out, {
        "calls waiting on the dead worker failed within 2 seconds": lambda o: o["waited"] < 2,
        "every rpc_async future in flight to it failed naming it": lambda o: o["errors"] and all(names_the_dead(e) for e in o["errors"]),
        "threads blocked in rpc_sync, to_here and an RRef proxy call failed naming it":
            lambda o: o["blocked"] and all(names_the_dead(e) for e in o["blocked"].values()),
        "a new call to it fails naming it": lambda o: names_the_dead(o["new_call"]),
        "the surviving worker still answers": lambda o: o["survivor"] == 4,
        "shutdown with a dead peer returns within 10 s": lambda o: o["shutdown_took"] < 10,
        # Shared memory carried the calls only when chosen, and nothing of it outlives the
        # world: no region stays mapped after shutdown.
        "shared memory carried the calls only when chosen":
            lambda o: o["mapped_while_calling"] >= 2 if each_transport == "shm" else o["mapped_while_calling"] == 0,
        "no region stays mapped after shutdown": lambda o: o["mapped_after_shutdown"] == 0,
    })
    for r in (results[0], results[2]):
        assert 'worker "worker1" is gone' in r.output, f"worker{r.rank} did not log the death:\n{r.output}"
    # Regions are memfds, which leave no file in /dev/shm.
    assert set(os.listdir("/dev/shm")) <= shm_files_before, "the world left files in /dev/shm"


def test_a_peer_killed_mid_transfer_fails_only_its_calls(world, tmp_path, each_transport):
    """Killed while big arrays flow both ways: over shared memory worker0 is, at that moment,
    reading worker1's memory and lending its own to worker1."""
    ready = tmp_path / "ready"
    w = world("faults:peer_dies_mid_transfer", 3, args=[str(ready), str(32 << 20)])
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline and w.procs[0].poll() is None:
        time.sleep(0.05)
    assert ready.exists(), "the transfers never got going"
    w.kill(1)
    results = w.finish(timeout=60)
    assert results[0].returncode == 0, results[0].output
    assert results[2].returncode == 0, results[2].output
    expect_behaviours(results[0].value, {
        "the sender's calls to the dead worker failed within 2 seconds": lambda o: o["sender_ended"] and o["waited"] < 2,
        "each failed call names the dead worker": lambda o: o["errors"] and all('"worker1"' in e for e in o["errors"]),
        "the calls before the kill completed": lambda o: o["completed"] >= 2,
        "the surviving worker still answers, big calls included": lambda o: o["survivor"] == 4 and o["big_to_survivor"] == 16,
        "no region stays mapped after shutdown": lambda o: o["mapped_after_shutdown"] == 0,
    })
    # Reading a dead peer's memory is its death, not a breach of the protocol.
    assert "broke the protocol" not in results[0].output, results[0].output
    assert 'worker "worker1" is gone' in results[0].output, results[0].output


def test_a_frozen_peer_is_not_a_dead_one(world, tmp_path, each_transport):
    ready, frozen = tmp_path / "ready", tmp_path / "frozen"
    w = world("faults:peer_frozen", 3, args=[str(ready), str(frozen)])
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), "worker0 never got going"
    frozen_for = 5.0
    os.kill(w.procs[1].pid, signal.SIGSTOP)
    try:
        frozen.write_text("frozen")
        time.sleep(frozen_for)
    finally:
        os.kill(w.procs[1].pid, signal.SIGCONT)
    results = w.finish(timeout=60)
    for r in results:
        assert r.returncode == 0, r.output
        assert "is gone" not in r.output, r.output
    expect_behaviours(results[0].value, {
        "the other worker answers at once while worker1 is frozen": lambda o: o["survivor"] == 4 and o["survivor_took"] < 2,
        "a call to the frozen worker completes once it thaws (it is not taken for dead)":
            lambda o: o["frozen_call"] == 5 and o["frozen_call_took"] > frozen_for - 1,
        "an RRef it owns resolves before and after the freeze": lambda o: o["before"] == o["after"] == 42,
        "new calls to it succeed after": lambda o: o["new_call"] == 7,
    })


def test_a_big_call_to_a_frozen_peer_fails_in_bounded_time(world, tmp_path, each_transport):
    ready, frozen, failed = tmp_path / "ready", tmp_path / "frozen", tmp_path / "failed"
    w = world("faults:big_call_to_frozen", 3, args=[str(ready), str(frozen), str(failed), str(32 << 20)])
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline and w.procs[0].poll() is None:
        time.sleep(0.05)
    assert ready.exists(), "worker0 never got going"
    os.kill(w.procs[1].pid, signal.SIGSTOP)
    try:
        frozen.write_text("frozen")
        deadline = time.monotonic() + 30
        while not failed.exists() and time.monotonic() < deadline and w.procs[0].poll() is None:
            time.sleep(0.05)
    finally:
        os.kill(w.procs[1].pid, signal.SIGCONT)
    results = w.finish(timeout=60)
    for r in results:
        assert r.returncode == 0, r.output
    expect_behaviours(results[0].value, {
        "the call to the frozen worker failed, naming it": lambda o: o["error"] is not None and "worker1" in o["error"],
        "it failed within its timeout and the grace for a peer to read what it was lent": lambda o: 1.5 < o["failed_after"] < 8,
        "the other worker answered meanwhile": lambda o: o["survivor"] == 4,
        "the frozen worker took big calls before and after": lambda o: o["before"] == 16 and o["after"] == 32,
    })


def test_a_peer_frozen_past_the_peer_timeout_fails_the_calls_waiting_on_it(world, tmp_path, each_transport, monkeypatch):
    peer_timeout = 12
    monkeypatch.setenv("TENSORPLAY_RPC_PEER_TIMEOUT", str(peer_timeout))
    ready, frozen, failed, thawed = (tmp_path / n for n in ("ready", "frozen", "failed", "thawed"))
    w = world("faults:frozen_past_peer_timeout", 3, args=[str(ready), str(frozen), str(failed), str(thawed), str(32 << 20)])
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline and w.procs[0].poll() is None:
        time.sleep(0.05)
    assert ready.exists(), "worker0 never got going"
    os.kill(w.procs[1].pid, signal.SIGSTOP)
    try:
        frozen.write_text("frozen")
        deadline = time.monotonic() + peer_timeout + 30
        while not failed.exists() and time.monotonic() < deadline and w.procs[0].poll() is None:
            time.sleep(0.1)
    finally:
        os.kill(w.procs[1].pid, signal.SIGCONT)
    thawed.write_text("thawed")
    results = w.finish(timeout=90)
    for r in results:
        assert r.returncode == 0, r.output
    expect_behaviours(results[0].value, {
        "the other worker answered meanwhile": lambda o: o["survivor"] == 4,
        "both calls without a timeout failed, naming the frozen worker":
            lambda o: all(e is not None and '"worker1"' in e for e in (o["small_error"], o["big_error"])),
        "they failed once the peer timeout had passed, not before and not long after":
            lambda o: peer_timeout - 1 < o["failed_after"] < peer_timeout + 6,
        "the frozen worker answers again once it runs, big calls included": lambda o: o["after"] == 32 and o["small_after"] == 7,
    })


def test_graceful_shutdown_after_the_store_host_died(world, tmp_path):
    w = world("faults:store_host_dies", 3, args=[str(tmp_path)])
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"ready{r}").exists() for r in range(3)) and time.monotonic() < deadline:
        time.sleep(0.02)
    w.kill(0)
    w.procs[0].wait(timeout=10)
    (tmp_path / "killed").write_text("killed")
    results = w.finish(timeout=30)
    for r in results[1:]:
        assert r.returncode == 0, r.output
        got, took = r.value
        assert got == r.rank + 1 and took < 10
        assert 'worker "worker0" is gone' in r.output, r.output


@pytest.mark.parametrize("given_as", ["env", "option"])
def test_a_world_with_a_token(world, given_as):
    results = run_world("faults:token_world", 2, args=[given_as], env={"WORLD_TOKEN": "s3cret"})
    assert [r.value for r in results] == [("joined", 1), ("joined", 2)]


@pytest.mark.parametrize("given_as", ["env", "option"])
def test_a_worker_with_a_wrong_token_is_refused_and_logged(world, given_as):
    ok = world("faults:token_world", 2, ranks=[0], args=[given_as], env={"WORLD_TOKEN": "s3cret"})
    stranger = world("faults:token_world", 2, ranks=[1], args=[given_as], env={"WORLD_TOKEN": "wrong", "MASTER_PORT": str(ok.port)})
    verdict, message = stranger.finish(timeout=30)[0].value
    assert verdict == "refused" and "token" in message, message
    host = ok.finish(timeout=30)[0]
    assert host.value[0] == "refused", host.value  # its world never formed
    assert "refused connections without the world's token from=127.0.0.1" in host.output, host.output


def _throwaway_ca(directory):
    """A CA and one worker certificate it signed, made with the openssl command."""
    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
            "-subj", "/CN=test CA", "-keyout", "ca-key.pem", "-out", "ca.pem")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=worker",
            "-keyout", "key.pem", "-out", "req.pem")
    openssl("x509", "-req", "-in", "req.pem", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
            "-days", "1", "-out", "cert.pem")


def test_a_world_under_tls(world, tmp_path):
    _throwaway_ca(tmp_path)
    # With the token too, as the README advises: shared memory needs one under TLS.
    token = {"TENSORPLAY_RPC_TOKEN": "tls-world-secret"}
    results = run_world("faults:tls_world", 2, args=[str(tmp_path), "yes"], env=token)
    assert [r.value for r in results] == [("joined", 1), ("joined", 2)]
    # A worker without a certificate is refused by the store.
    ok = world("faults:tls_world", 2, ranks=[0], args=[str(tmp_path), "yes"], env=token)
    plain = world("faults:tls_world", 2, ranks=[1], args=[str(tmp_path), "no"], env={"MASTER_PORT": str(ok.port), **token})
    assert plain.finish(timeout=30)[0].value[0] == "refused"
    assert ok.finish(timeout=30)[0].value[0] == "refused"


def test_unreachable_master_addr():
    err = run_world("faults:unreachable_store", 2, ranks=[1], timeout=30)[0].value
    assert err[0] == "RuntimeError" and "could not reach the rendezvous store" in err[1]
    assert err[2] < 10
