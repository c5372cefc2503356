"""A hostile peer against a live world of Python workers.

tests/hostilepeer (a Go program speaking our gRPC service, or our shared-memory transport,
with crafted frames and control words) attacks rank 0
of a world of three real workers while ranks 1 and 2 keep calling rank 0 and each other
(tests/worlds/hostile.py). A hostile peer must not crash, starve or impersonate: no worker dies,
every honest call made during the attacks succeeds, rank 0's memory stays bounded, and a peer
that claims to be someone it is not gets nowhere. In a world with a token, a peer without it
gets every attack refused.

HOSTILE_PEER_ATTACKS (a comma list of attack names, see tests/hostilepeer) runs only those, to
tell which attack hurts.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import time
from typing import Dict, List, Tuple

import pytest

from conftest import TESTS_DIR, RankResult, World, end_processes

log = logging.getLogger(__name__)

REPO_ROOT = os.path.dirname(TESTS_DIR)
WORLD_SIZE = 3
# The world ends by itself after this, whatever the test does.
WORLD_DEADLINE_S = 150
# How much rank 0's resident memory may grow while it is attacked. The attacks announce
# terabytes; an agent that allocated by announcement would blow far past this.
RSS_GROWTH_BOUND_KIB = 512 << 10
# The attacker ends by itself after ATTACK_TIMEOUT_S (plus 5 s of grace); the test waits a
# little longer before killing it.
ATTACK_TIMEOUT_S = 55
ATTACK_LINE = re.compile(r"^ATTACK (\S+) (\S+) ?(.*)$")
# Attacks whose whole point is to claim to be someone else: the worker must end their stream.
IMPERSONATIONS = ("hello-mismatch", "hello-missing")


@pytest.fixture(scope="module")
def hostilepeer(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The hostile peer program, built from tests/hostilepeer."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    out = str(tmp_path_factory.mktemp("hostilepeer") / "hostilepeer")
    proc = subprocess.run(
        [go, "build", "-o", out, "./tests/hostilepeer"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"go build failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def vm_rss_kib(pid: int) -> int:
    """A process's resident set size in KiB, from /proc/<pid>/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


def logs_of(w: World) -> str:
    """Every rank's log so far, for failure messages."""
    parts = []
    for rank, path in enumerate(w.logs):
        with open(path, errors="replace") as f:
            parts.append(f"--- rank {rank} (exit {w.procs[rank].poll()}) ---\n{f.read()[-6000:]}")
    return "\n".join(parts)


def wait_for_files(w: World, paths: List[str], timeout: float) -> None:
    """Wait, bounded, until every path exists; fail at once if a rank exits meanwhile."""
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        dead = [r for r, p in enumerate(w.procs) if p.poll() is not None]
        assert not dead, f"ranks {dead} exited before the world was ready\n{logs_of(w)}"
        assert time.monotonic() < deadline, f"the world was not ready in {timeout}s\n{logs_of(w)}"
        time.sleep(0.05)


# Attacks on the shared-memory listener only, with the outcome each must have: a region the
# worker must not map is refused at set-up; corrupt control words end the stream.
SHM_ATTACKS = {
    "ring-head-ahead": "dropped",
    "ring-head-behind": "dropped",
    "frame-over-limit": "dropped",
    "unsealed-region": "refused",
    "region-too-small": "refused",
}


def expected_attacks(transport: str) -> List[str]:
    """The attacks the hostile peer runs: HOSTILE_PEER_ATTACKS's, or the main ones."""
    if os.environ.get("HOSTILE_PEER_ATTACKS"):
        return os.environ["HOSTILE_PEER_ATTACKS"].split(",")
    main = ["half-open", "near-limit", "wrapping-sizes", "header-flood", "huge-method", "budget-hog", *IMPERSONATIONS]
    return main + (list(SHM_ATTACKS) if transport == "shm" else [])


def run_attacker(binary: str, addr: str, extra: List[str]) -> Tuple[Dict[str, Tuple[str, str]], str]:
    """Run the hostile peer against addr (the agent's address, every transport's); return
    each attack's (outcome, detail) and its output."""
    cmd = [binary, "-addr", addr, "-name", "worker1", "-rank", "1", "-timeout", f"{ATTACK_TIMEOUT_S}s", *extra]
    if os.environ.get("HOSTILE_PEER_ATTACKS"):
        cmd += ["-attacks", os.environ["HOSTILE_PEER_ATTACKS"]]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=ATTACK_TIMEOUT_S + 20)
    except subprocess.TimeoutExpired:
        end_processes([proc])
        output, _ = proc.communicate()
        raise AssertionError(f"the hostile peer did not end by itself:\n{output}")
    finally:
        end_processes([proc])
    assert proc.returncode == 0, f"the hostile peer could not attack (exit {proc.returncode}):\n{output}"
    outcomes = {}
    for line in output.splitlines():
        m = ATTACK_LINE.match(line)
        if m:
            outcomes[m.group(1)] = (m.group(2), m.group(3))
    return outcomes, output


def attack_world(w: World, sync_dir: str, binary: str, extra: List[str]) -> Tuple[Dict[str, Tuple[str, str]], str, int, List[RankResult]]:
    """Wait for the world, attack rank 0, stop the world; return the attacks' outcomes, the
    attacker's output, rank 0's RSS growth in KiB and every rank's result."""
    addr_file = os.path.join(sync_dir, "addr")
    wait_for_files(w, [addr_file] + [os.path.join(sync_dir, f"calling{r}") for r in range(1, WORLD_SIZE)], 90)
    with open(addr_file) as f:
        addr = f.read().strip()
    pid0 = w.procs[0].pid
    rss_before = vm_rss_kib(pid0)
    outcomes, output = run_attacker(binary, addr, extra)
    log.info("hostile peer against %s:\n%s", addr, output)
    dead = [r for r, p in enumerate(w.procs) if p.poll() is not None]
    assert not dead, f"ranks {dead} died under attack\n{output}\n{logs_of(w)}"
    rss_after = vm_rss_kib(pid0)
    with open(os.path.join(sync_dir, "stop"), "w") as f:
        f.write("stop")
    results = w.finish(60)
    output += f"rank 0 RSS: {rss_before} KiB before the attacks, {rss_after} KiB after\n"
    return outcomes, output, rss_after - rss_before, results


def start_attacked_world(world, tmp_path, env=None) -> Tuple[World, str]:
    sync_dir = str(tmp_path / "sync")
    os.makedirs(sync_dir)
    w = world("hostile:run", WORLD_SIZE, args=[sync_dir, str(WORLD_DEADLINE_S)], env=env)
    return w, sync_dir


def check_world_survived(results: List[RankResult], output: str) -> None:
    """No rank failed, and every honest call succeeded."""
    failed = [r for r in results if r.returncode != 0 or r.error]
    assert not failed, "ranks failed:\n" + "\n".join(f"rank {r.rank} exit {r.returncode}: {r.error}\n{r.output[-4000:]}" for r in failed) + "\n" + output
    problems = []
    for r in results[1:]:
        v = r.value
        if v["ok"] == 0 or v["failed"]:
            problems.append(
                f"rank {r.rank}: {v['failed']} of {v['ok'] + v['failed']} honest calls failed under attack (slowest {v['max_latency']:.1f}s):\n"
                + "\n".join(v["errors"])
            )
    assert not problems, "\n".join(problems) + "\n" + output


@pytest.mark.timeout(280)
@pytest.mark.parametrize("transport", ["grpc", "tcp", "shm"])
def test_hostile_peer_cannot_crash_starve_or_impersonate(world, tmp_path, hostilepeer, transport):
    w, sync_dir = start_attacked_world(world, tmp_path)
    outcomes, output, rss_growth_kib, results = attack_world(w, sync_dir, hostilepeer, ["-transport", transport])
    missing = [name for name in expected_attacks(transport) if name not in outcomes]
    assert not missing, f"attacks {missing} did not report:\n{output}"
    assert not [n for n, (o, _) in outcomes.items() if o == "dial-failed"], output
    check_world_survived(results, output)
    assert rss_growth_kib < RSS_GROWTH_BOUND_KIB, f"rank 0's RSS grew by {rss_growth_kib} KiB under attack\n{output}"
    for name in set(IMPERSONATIONS) & set(outcomes):
        assert outcomes[name][0] == "dropped", f"{name}: a peer that did not say who it is was served: {outcomes[name]}"
    wrong = {n: outcomes[n] for n, want in SHM_ATTACKS.items() if n in outcomes and outcomes[n][0] != want}
    assert not wrong, f"shared-memory attacks with the wrong outcome (want {SHM_ATTACKS}): {wrong}\n{output}"
    rank0_log = results[0].output
    assert "release-other-holder" not in outcomes or "refused RRef operations" in rank0_log, "forged RRef releases were not refused\n" + output + rank0_log[-4000:]
    assert "recovered from a panic" not in rank0_log, "an attack made the agent panic:\n" + rank0_log[-8000:]


@pytest.mark.timeout(280)
@pytest.mark.parametrize("transport", ["grpc", "tcp", "shm"])
def test_every_attack_is_refused_without_the_token(world, tmp_path, hostilepeer, transport):
    w, sync_dir = start_attacked_world(world, tmp_path, env={"TENSORPLAY_RPC_TOKEN": "hostile-peer-test-secret"})
    # The attacker presents no token (its -token is empty).
    outcomes, output, rss_growth_kib, results = attack_world(w, sync_dir, hostilepeer, ["-hold", "2s", "-transport", transport])
    check_world_survived(results, output)
    assert not [name for name in expected_attacks(transport) if name not in outcomes], output
    not_refused = {n: o for n, o in outcomes.items() if o[0] != "unauthenticated"}
    assert not not_refused, f"attacks not refused for want of the token: {not_refused}\n{output}"
    assert rss_growth_kib < RSS_GROWTH_BOUND_KIB, f"rank 0's RSS grew by {rss_growth_kib} KiB\n{output}"
