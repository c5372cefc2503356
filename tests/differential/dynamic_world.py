"""One worker of a dynamic world (init_rpc(world_size=None)), run the same way on torch and on
tensorplay_rpc by tests/test_dynamic_world.py, which compares what each worker prints.

    python dynamic_world.py BACKEND RANK PORT SYNC_DIR

Three workers join one after the other, w0 calls the others, w1 leaves, and the two left look
at the world and call w1 by name and by id; then w2 leaves and w0 (which holds the store)
last. Steps wait for files in SYNC_DIR, so the order is the same on both backends. Only what
torch 1.13 supports is here: torch's w1 cannot join again (it sees a world of itself alone,
and no one sees it), so rejoining is tested on ours alone (tests/test_dynamic_world.py).
"""

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from steps import Steps  # noqa: E402 (tests/steps.py, one directory up)

BACKEND, RANK, PORT, SYNC = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rpc = importlib.import_module(BACKEND)
NAME = f"w{RANK}"
steps = Steps(SYNC, NAME)
mark, wait = steps.mark, steps.wait


def say(what: str, outcome) -> None:
    print(f"{what}: {outcome}", flush=True)


def view():
    return sorted((w.name, w.id) for w in rpc._get_current_rpc_agent().get_worker_infos())


def whoami():
    return rpc.get_worker_info().name


def attempt(what: str, fn) -> None:
    try:
        say(what, repr(fn()))
    except Exception as exc:
        say(what, f"{type(exc).__name__}: {exc}".replace(BACKEND, "<rpc>"))


def join() -> None:
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{PORT}", rpc_timeout=20)
    rpc.init_rpc(NAME, rank=RANK, world_size=None, rpc_backend_options=options)
    say("joined, sees", view())


if RANK == 0:
    join()
    mark("joined0")
    wait("joined2")
    say("sees", view())
    attempt("calls w1", lambda: rpc.rpc_sync("w1", whoami))
    attempt("calls 2", lambda: rpc.rpc_sync(2, whoami))
    attempt("remote on w2", lambda: rpc.remote("w2", whoami).to_here())
    mark("called")
    wait("left1")
elif RANK == 1:
    wait("joined0")
    join()
    mark("joined1")
    wait("called")
    rpc.shutdown()
    say("left", "ok")
    mark("left1")
    sys.exit(0)
else:
    wait("joined1")
    join()
    mark("joined2")
    wait("left1")

# w0 and w2, once w1 has left.
say("sees after w1 left", view())
attempt("calls w1", lambda: rpc.rpc_sync("w1", whoami))
attempt("calls 1", lambda: rpc.rpc_sync(1, whoami))
attempt("get_worker_info w1", lambda: rpc.get_worker_info("w1"))
attempt("calls the other", lambda: rpc.rpc_sync("w2" if RANK == 0 else "w0", whoami))
mark(f"checked{RANK}")
if RANK == 0:
    wait("left2")
    say("sees after w2 left", view())
else:
    wait("checked0")
rpc.shutdown()
say("left", "ok")
mark(f"left{RANK}")
