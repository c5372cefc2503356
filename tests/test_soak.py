"""A short soak (TENSORPLAY_SOAK_SECONDS, 20 by default; `make soak` runs a long one): at the
end no futures, RRefs, lent buffers, threads or goroutines have leaked and memory has stopped
growing."""

import os

import pytest

from conftest import run_world

SECONDS = float(os.environ.get("TENSORPLAY_SOAK_SECONDS", "20"))
WORLD_TIMEOUT = SECONDS * 3 + 120


@pytest.mark.timeout(WORLD_TIMEOUT + 60)
def test_soak_leaves_nothing_behind():
    results = run_world("soak:run", 4, args=[str(SECONDS)], timeout=WORLD_TIMEOUT)
    for r in results:
        v = r.value
        assert v["calls"] > 50, f"rank {r.rank} hardly ran"
        assert v["owned_empty"], f"rank {r.rank} still owns RRefs no one references: {v['owned']}"
        end, warm, middle = v["end"], v["warm"], v["middle"]
        assert end["pending_futures"] == 0 and end["lent"] == 0, (r.rank, end)
        assert end["threads"] == warm["threads"], (r.rank, warm, end)
        assert end["goroutines"] <= warm["goroutines"] + 8, (r.rank, warm, end)
        grew = end["rss_kib"] - middle["rss_kib"]
        assert grew < 64 * 1024, f"rank {r.rank} RSS still grew by {grew} KiB in the second half"
