"""A worker started by a real cluster launcher (mpirun): init_rpc(name) with no rank or world
size, one call to the next rank, and a JSON file of what it saw (seen-RANK.json)."""

import json
import os

import tensorplay_rpc as rpc

# Only the launcher's own variables say which rank this is.
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "-1")))
rpc.init_rpc(f"w{rank}")
me = rpc.get_worker_info()
size = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("SLURM_NTASKS", "0")))
peer = rpc.rpc_sync(f"w{(me.id + 1) % size}", rpc.get_worker_info)
rpc.shutdown()
# A file of its own in the working directory: mpirun may join the ranks' output lines.
with open(f"seen-{rank}.json", "w") as f:
    json.dump({"name": me.name, "id": me.id, "peer": [peer.name, peer.id]}, f)
