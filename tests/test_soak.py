"""A short soak (TENSORPLAY_SOAK_SECONDS, 20 by default; `make soak` runs a long one): at the
end no futures, RRefs, lent buffers, threads or goroutines have leaked and memory has stopped
growing."""

import os
import time

import pytest

from conftest import run_world
from tensorplay_rpc.futures import CALLBACK_THREADS_MAX

SECONDS = float(os.environ.get("TENSORPLAY_SOAK_SECONDS", "20"))
WORLD_TIMEOUT = SECONDS * 3 + 120


def check_nothing_leaked(results):
    for r in results:
        v = r.value
        assert v["calls"] > 50, f"rank {r.rank} hardly ran"
        assert v["owned_empty"], f"rank {r.rank} still owns RRefs no one references: {v['owned']}"
        end, warm, middle = v["end"], v["warm"], v["middle"]
        assert end["pending_futures"] == 0 and end["lent"] == 0, (r.rank, end)
        assert end["threads"] == warm["threads"], (r.rank, warm, end)
        assert end["callback_threads"] <= CALLBACK_THREADS_MAX, (r.rank, warm, end)
        assert end["goroutines"] <= warm["goroutines"] + 8, (r.rank, warm, end)
        grew = end["rss_kib"] - middle["rss_kib"]
        assert grew < 64 * 1024, f"rank {r.rank} RSS still grew by {grew} KiB in the second half"


@pytest.mark.timeout(WORLD_TIMEOUT + 60)
def test_soak_leaves_nothing_behind():
    check_nothing_leaked(run_world("soak:run", 4, args=[str(SECONDS)], timeout=WORLD_TIMEOUT))


# Its own bound: up to 60 s for worker3 to get busy, half the soak before the kill, then the
# world's deadline.
@pytest.mark.timeout(60 + SECONDS / 2 + WORLD_TIMEOUT + 60)
def test_soak_with_a_worker_killed_midway(world, tmp_path):
    """worker3 is SIGKILLed halfway: the others keep going, their calls to it fail naming it,
    and they end with nothing leaked (the RRefs it held are dropped by their owners)."""
    busy = tmp_path / "busy"
    w = world("soak:run", 4, args=[str(SECONDS), str(busy)])
    deadline = time.monotonic() + 60
    while not busy.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert busy.exists(), "worker3 never got busy"
    time.sleep(SECONDS / 2)
    w.kill(3)
    results = w.finish(timeout=WORLD_TIMEOUT)
    survivors = results[:3]
    for r in survivors:
        assert r.returncode == 0, r.output
    assert sum(r.value["lost"] for r in survivors) > 0, "no call found worker3 dead"
    check_nothing_leaked(survivors)
