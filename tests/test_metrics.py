"""rpc.metrics() (issue 14): traffic by peer, errors by kind, latency, memory."""

import pytest

from conftest import run_world


@pytest.mark.timeout(120)
def test_metrics_count_calls_errors_and_bytes_by_peer():
    caller, callee = (r.value for r in run_world("basic:metrics", 2, timeout=60))
    # 4 adds, 1 error, 1 timeout; the callee also served the all-gather's call from worker 0.
    assert caller["calls_sent"] == 6 and caller["in_flight"] == 0, caller
    assert caller["errors"] == {"remote": 1, "timeout": 1}, caller
    assert caller["has_latency"] == ["p50", "p90", "p99"] and caller["bytes_positive"], caller
    assert callee["calls_served"] == 7, callee
    assert caller["keys"] == [
        "lent_messages", "outstanding", "owned_rrefs", "peers", "pending_futures", "receive_budget", "receive_bytes_in_use"
    ], caller
