"""Workers of a dynamic world under churn, for tests/test_dynamic_world.py.

    python dynamic_churn.py anchor RANK PORT SYNC_DIR
    python dynamic_churn.py churner INDEX PORT SYNC_DIR SEED CYCLES [stay]

Anchors (ranks 0 and 1) stay the whole time and keep calling every worker they see; churners
join, call everyone present, and leave, CYCLES times, at random moments; with ``stay`` a
churner's last join lasts until its process is killed. Each writes what it saw as JSON in
SYNC_DIR; anchors also keep their current view there (``view<rank>``) for the test to watch.
"""

import json
import os
import random
import sys
import time

import tensorplay_rpc as rpc

ROLE, INDEX, PORT, SYNC = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
CALL_TIMEOUT_S = 5
RUN_LIMIT_S = 120  # every loop here ends by then, whatever happens


def whoami() -> str:
    return rpc.get_worker_info().name


def join(name: str, rank: int) -> None:
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{PORT}", rpc_timeout=CALL_TIMEOUT_S)
    rpc.init_rpc(name, rank=rank, world_size=None, rpc_backend_options=options)


def present() -> list:
    return sorted(w.name for w in rpc._get_current_rpc_agent().get_worker_infos())


def call_everyone() -> list:
    """Call every worker present but this one; (name, outcome) pairs, outcome "ok" or the
    error's text."""
    me = whoami()
    futures = []
    for name in present():
        if name != me:
            try:
                futures.append((name, rpc.rpc_async(name, whoami, timeout=CALL_TIMEOUT_S)))
            except Exception as exc:  # it left since present() looked
                futures.append((name, exc))
    outcomes = []
    for name, fut in futures:
        try:
            if isinstance(fut, Exception):
                raise fut
            got = fut.wait()
            outcomes.append((name, "ok" if got == name else f"wrong answer {got!r}"))
        except Exception as exc:
            outcomes.append((name, f"{type(exc).__name__}: {exc}"))
    return outcomes


def write(name: str, value) -> None:
    path = os.path.join(SYNC, name)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def anchor() -> None:
    name = f"anchor{INDEX}"
    join(name, INDEX)
    write(f"joined{INDEX}", True)
    deadline = time.monotonic() + RUN_LIMIT_S
    calls, failures, seen = 0, [], set()
    while not os.path.exists(os.path.join(SYNC, "churn_over")) and time.monotonic() < deadline:
        for peer, outcome in call_everyone():
            calls += 1
            seen.add(peer)
            if outcome != "ok":
                failures.append((peer, outcome))
        write(f"view{INDEX}", present())
        time.sleep(0.01)
    # Every churner has left or was killed: the world must come back to the two anchors.
    settle = time.monotonic() + 15
    while present() != ["anchor0", "anchor1"] and time.monotonic() < settle:
        time.sleep(0.05)
    write(f"anchor{INDEX}", {"calls": calls, "failures": failures, "seen": sorted(seen), "final": present()})
    wait_for(f"anchor{1 - INDEX}")  # neither leaves before both have looked
    if INDEX == 1:
        rpc.shutdown()
        write("anchor1_left", True)
    else:
        wait_for("anchor1_left")
        rpc.shutdown()


def wait_for(step: str) -> None:
    deadline = time.monotonic() + RUN_LIMIT_S
    while not os.path.exists(os.path.join(SYNC, step)) and time.monotonic() < deadline:
        time.sleep(0.02)


def churner() -> None:
    seed, cycles = int(sys.argv[5]), int(sys.argv[6])
    stay = len(sys.argv) > 7 and sys.argv[7] == "stay"
    rng = random.Random(seed)
    name, rank = f"c{INDEX}", 10 + INDEX
    record = []
    for cycle in range(cycles):
        time.sleep(rng.uniform(0, 0.08))
        join(name, rank)
        record.append({"sees": present(), "calls": call_everyone()})
        if stay and cycle == cycles - 1:
            write(f"{name}.{seed}", record)
            write(f"{name}_staying", True)
            time.sleep(RUN_LIMIT_S)  # until the test kills this process
        time.sleep(rng.uniform(0, 0.08))
        rpc.shutdown()
    write(f"{name}.{seed}", record)


if __name__ == "__main__":
    anchor() if ROLE == "anchor" else churner()
