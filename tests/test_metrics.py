"""rpc.metrics() and the Prometheus endpoint (issue 14): traffic by peer, errors by kind,
latency, memory. Runs in the pytest plugin's world (tensorplay_rpc.testing): this process is
w0, and w1 calls w2."""

import operator
import time
import urllib.request

import pytest

import tensorplay_rpc as rpc

pytestmark = pytest.mark.rpc_world(workers=2, timeout=60, env={"TENSORPLAY_RPC_METRICS_PORT": "0"})


def fail(message: str) -> None:
    raise ValueError(message)


def peer_view(of: str) -> dict:
    """This worker's metrics of worker ``of``, and the snapshot's own keys."""
    snapshot = rpc.metrics()
    peer = {p["name"]: p for p in snapshot["peers"]}[of]
    return {"peer": peer, "keys": sorted(snapshot)}


def make_calls() -> dict:
    """Four adds, one error and one timeout to w2; then the metrics of w2."""
    for i in range(4):
        rpc.rpc_sync("w2", operator.add, args=(i, 1))
    for call in (lambda: rpc.rpc_sync("w2", fail, args=("counted",)), lambda: rpc.rpc_sync("w2", time.sleep, args=(1,), timeout=0.1)):
        try:
            call()
        except Exception:
            pass
    return peer_view("w2")


def test_metrics_count_calls_errors_and_bytes_by_peer(rpc_world):
    seen = rpc_world.run("w1", make_calls)
    sent = seen["peer"]
    assert sent["calls_sent"] == 6 and sent["in_flight"] == 0, sent
    assert {k: v for k, v in sent["errors"].items() if v} == {"remote": 1, "timeout": 1}, sent
    assert sorted(sent["latency_us"]) == ["p50", "p90", "p99"] and sent["latency_us"]["p99"] >= 65536, sent
    assert sent["bytes_sent"] > 0 and sent["bytes_received"] > 0, sent
    assert seen["keys"] == [
        "lent_messages", "outstanding", "owned_rrefs", "peers", "pending_futures", "receive_budget", "receive_bytes_in_use"
    ]
    # The callee counted each call once it read it (the timed-out one too).
    served = rpc_world.run("w2", peer_view, "w1")["peer"]
    assert served["calls_served"] == 6 and served["calls_sent"] == 0, served


def test_the_prometheus_endpoint_is_scraped(rpc_world):
    rpc_world.run("w1", make_calls)
    addr = rpc_world.run("w1", rpc.metrics_address)
    assert addr is not None and addr.startswith("127.0.0.1:"), addr
    sent = rpc_world.run("w1", peer_view, "w2")["peer"]  # no call to w2 from here to the scrape
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    calls, timeouts = sent["calls_sent"], sent["errors"]["timeout"]
    assert calls >= 6 and timeouts >= 1, sent
    assert f'tensorplay_rpc_calls_sent_total{{peer="w2",worker="w1"}} {calls}' in text, text
    assert f'tensorplay_rpc_call_errors_total{{kind="timeout",peer="w2",worker="w1"}} {timeouts}' in text, text
    assert f'tensorplay_rpc_call_duration_seconds_count{{peer="w2",worker="w1"}} {calls}' in text, text
    assert f'tensorplay_rpc_sent_bytes_total{{peer="w2",worker="w1"}} {sent["bytes_sent"]}' in text, text
    assert f'tensorplay_rpc_calls_waiting{{peer="w2",worker="w1"}} {sent["calls_waiting"]}' in text, text
    assert "process_resident_memory_bytes" in text


def test_without_the_variable_no_endpoint_is_served(rpc_world):
    # This process (w0) has no TENSORPLAY_RPC_METRICS_PORT: the marker's env is the workers'.
    assert rpc.metrics_address() is None
