"""A dynamic world for tests/test_logging.py: what the Go core logs reaches Python's logging.

    python logging_world.py RANK PORT SYNC_DIR

w0 and w2 record what reaches the "tensorplay_rpc.core" logger; w1 is killed by the test while
in the world (the core of whichever finds it gone first warns so); w2 leaves gracefully (w0's
core says so at debug level). Each writes its records (level, text) to
SYNC_DIR/records<rank>.json.
"""

import json
import logging
import os
import sys
import time

import tensorplay_rpc as rpc

from steps import Steps

RANK, PORT, SYNC = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
steps = Steps(SYNC, f"w{RANK}")
records = []


class Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        records.append((record.levelname, record.getMessage()))


if RANK != 1:
    core = logging.getLogger("tensorplay_rpc.core")
    core.addHandler(Keep())
    core.setLevel(logging.DEBUG)
    core.propagate = False
options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{PORT}", rpc_timeout=10)
if RANK != 0:
    steps.wait("joined0")
rpc.init_rpc(f"w{RANK}", rank=RANK, world_size=None, rpc_backend_options=options)
steps.mark(f"joined{RANK}")
if RANK == 1:
    time.sleep(60)  # until the test kills it
elif RANK == 2:
    steps.wait("w1_dropped")
    rpc.shutdown()
    with open(os.path.join(SYNC, "records2.json"), "w") as f:
        json.dump(records, f)
    steps.mark("left2")
else:
    names = lambda: {w.name for w in rpc._get_current_rpc_agent().get_worker_infos()}
    # w1's init_rpc returned, so every member knew it: from now on its absence means it was
    # dropped (the test may have killed it already).
    steps.wait("joined1")
    steps.wait("joined2")
    deadline = time.monotonic() + 30
    while "w1" in names() and time.monotonic() < deadline:
        time.sleep(0.05)
    steps.mark("w1_dropped")
    steps.wait("left2")
    while "w2" in names() and time.monotonic() < deadline:
        time.sleep(0.05)
    rpc.shutdown()
    with open(os.path.join(SYNC, "records0.json"), "w") as f:
        json.dump(records, f)
