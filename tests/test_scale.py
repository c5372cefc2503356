"""A world of many workers on this host (``make scale`` runs 256, three times)."""

import logging
import os
import statistics

import pytest

from conftest import run_world

log = logging.getLogger(__name__)

# make test runs a world of 32; make scale sets 256 and three runs.
WORKERS = int(os.environ.get("TENSORPLAY_SCALE_WORKERS", "32"))
RUNS = int(os.environ.get("TENSORPLAY_SCALE_RUNS", "1"))
# Bounded: 256 interpreters take about a minute to start and join on 2 cores.
WORLD_TIMEOUT = 60 + WORKERS


@pytest.mark.timeout(WORLD_TIMEOUT + 60)
@pytest.mark.parametrize("run", range(RUNS))
def test_a_big_world_joins_calls_and_leaves(run):
    results = run_world("scale:calls_to_peers", WORKERS, timeout=WORLD_TIMEOUT)
    for r in results:
        want = [(p, r.rank) for p in r.value["peers"]]
        assert r.value["answers"] == want, (r.rank, r.value["answers"], want)
        # Connections on first use, not a full mesh: streams to the 5 peers it called and from
        # the 5 that called it.
        assert r.value["shm_regions"] <= 10, (r.rank, r.value["shm_regions"])
    summary = {
        key: (min(r.value[key] for r in results), statistics.median(r.value[key] for r in results), max(r.value[key] for r in results))
        for key in ("join_s", "goroutines", "os_threads", "fds", "rss_mib", "shm_regions")
    }
    # What the README reports per worker: min, median, max.
    log.warning("scale run %d of %d, %d workers: %s", run + 1, RUNS, WORKERS, summary)
