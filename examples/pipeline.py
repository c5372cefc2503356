"""A pipeline of remote modules over RRefs, after torch's "Distributed Pipeline Parallelism
Using RPC" tutorial, on CPU.

A small network is cut in two shards, each created on a worker of its own with
``rpc.remote``. Rank 0 splits each batch into micro-batches and streams them through the
shards: shard 1's output stays on its worker as an RRef that shard 2 fetches, so rank 0
handles only references until the results come back. The tutorial trains with distributed
autograd; this one does without: rank 0 fetches the shards' weights, computes the gradients
locally and sends each shard its own (examples/pipeline_autograd.py trains as the tutorial
does, with distributed autograd and a DistributedOptimizer).

    python -m tensorplay_rpc.run --nproc 3 examples/pipeline.py [--backend torch]

Rank 0 prints a last line ``RESULT {...}`` (the loss of each step and how far the pipeline's
output is from a local forward), the same on either backend.
"""

import argparse
import json
import os
import threading

import torch
from torch import nn

STEPS = 4
BATCH = 24
MICRO_BATCHES = 4


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["tensorplay", "torch"], default="tensorplay")
    return parser.parse_args()


# The one line that differs from torch's tutorial: which RPC to use. Its futures are torch's
# (torch is imported before init_rpc), so torch.futures works with either.
if parse_args().backend == "torch":
    import torch.distributed.rpc as rpc
else:
    import tensorplay_rpc as rpc
import torch.futures as futures  # noqa: E402


def make_layers(shard):
    torch.manual_seed(shard)
    if shard == 1:
        return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU()).double()
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1)).double()


class Shard:
    """One part of the network, on its own worker."""

    def __init__(self, shard):
        self.layers = make_layers(shard)
        self.lock = threading.Lock()  # micro-batches arrive on several threads at once

    def forward(self, x_rref):
        x = x_rref.to_here()
        with self.lock, torch.no_grad():
            return self.layers(x)

    def state(self):
        return self.layers.state_dict()

    def apply_gradients(self, grads, lr):
        with self.lock, torch.no_grad():
            for p, g in zip(self.layers.parameters(), grads):
                p -= lr * g


class Pipeline:
    """Streams micro-batches through the remote shards."""

    def __init__(self, workers):
        self.shards = [rpc.remote(worker, Shard, args=(i + 1,)) for i, worker in enumerate(workers)]

    def forward(self, x):
        outputs = []
        for micro in x.split(BATCH // MICRO_BATCHES):
            y_rref = self.shards[0].remote().forward(rpc.RRef(micro))
            outputs.append(self.shards[1].rpc_async().forward(y_rref))
        return torch.cat(futures.wait_all(outputs))

    def local_copy(self):
        """The whole network with the shards' weights now, on this worker."""
        parts = []
        for i, shard in enumerate(self.shards):
            layers = make_layers(i + 1)
            layers.load_state_dict(shard.rpc_sync().state())
            parts.append(layers)
        return parts

    def step(self, x, y, lr):
        """One step of gradient descent, the gradients computed here."""
        parts = self.local_copy()
        loss = nn.functional.mse_loss(parts[1](parts[0](x)), y)
        loss.backward()
        for shard, layers in zip(self.shards, parts):
            shard.rpc_sync().apply_gradients([p.grad for p in layers.parameters()], lr)
        return parts


def data():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH, 6, generator=g, dtype=torch.float64)
    return x, (x.sum(dim=1, keepdim=True) > 0).double()


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size)
    if rank == 0:
        pipeline = Pipeline(["w1", "w2"])
        x, y = data()
        losses, gaps = [], []
        for _ in range(STEPS):
            out = pipeline.forward(x)
            losses.append(round(nn.functional.mse_loss(out, y).item(), 9))
            parts = pipeline.local_copy()
            with torch.no_grad():
                gaps.append((out - parts[1](parts[0](x))).abs().max().item())
            pipeline.step(x, y, lr=0.1)
    rpc.shutdown()
    if rank == 0:
        print("RESULT " + json.dumps({"losses": losses, "largest_gap_to_local_forward": max(gaps)}), flush=True)


if __name__ == "__main__":
    main()
