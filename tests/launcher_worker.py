"""A worker started by tests/test_launcher.py through python -m tensorplay_rpc.run.

    launcher_worker.py ok | fail | env | spam | wait READY_DIR
"""

import os
import subprocess
import sys
import time

import tensorplay_rpc as rpc

MODE = sys.argv[1]
RANK = int(os.environ["RANK"])


def rank_of():
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])


if MODE == "env":  # what the launcher set, without joining
    print(" ".join(f"{v}={os.environ[v]}" for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")))
    sys.exit(0)
if MODE == "spam":  # far more than a pipe holds
    for i in range(200_000):
        print(f"line {i}")
    sys.exit(0)
if MODE == "fail" and RANK == 1:
    print("rank 1 fails on purpose", file=sys.stderr)
    sys.exit(3)
rpc.init_rpc(f"w{RANK}")  # rank and world size from the launcher's environment
if MODE == "wait":
    # A process of the worker's own (as a DataLoader's), which Ctrl-C must reach too.
    child = subprocess.Popen(["sleep", "60"])
    with open(os.path.join(sys.argv[2], f"child{RANK}"), "w") as f:
        f.write(str(child.pid))
    open(os.path.join(sys.argv[2], f"ready{RANK}"), "w").close()
    time.sleep(60)  # until the test's Ctrl-C
world = int(os.environ["WORLD_SIZE"])
seen = [rpc.rpc_sync(f"w{r}", rank_of) for r in range(world)]
print(f"sees {seen}")
rpc.shutdown()
