"""A batch-update parameter server, after pytorch/examples' distributed/rpc/batch, on CPU.

Rank 0 holds a small model; every other rank is a trainer. Each step a trainer fetches the
model, computes gradients on its own batch and sends them; the server adds up the trainers'
gradients and, once all have arrived, takes one optimizer step and answers every trainer
with the new model (an ``async_execution`` function: no thread waits meanwhile). A gloo
process group shares MASTER_ADDR/MASTER_PORT with RPC, as in torch's examples: the trainers
all-reduce their last losses through it.

    python -m tensorplay_rpc.run --nproc 3 examples/parameter_server.py [--backend torch]

Rank 0 prints a last line ``RESULT {...}`` (the losses and the final weights), the same on
either backend.
"""

import argparse
import json
import os
import threading

import torch
import torch.distributed as dist
from torch import nn

STEPS = 6
BATCH = 16
FEATURES = 8


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["tensorplay", "torch"], default="tensorplay")
    return parser.parse_args()


# The one line that differs from torch's example: which RPC to use. Its futures are torch's
# (torch is imported before init_rpc), so torch.futures works with either.
if parse_args().backend == "torch":
    import torch.distributed.rpc as rpc
else:
    import tensorplay_rpc as rpc
import torch.futures as futures  # noqa: E402


class ParameterServer:
    """Holds the model; one optimizer step per batch of every trainer's gradients."""

    def __init__(self, trainers):
        torch.manual_seed(0)
        self.model = nn.Linear(FEATURES, 1).double()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.trainers = trainers
        self.lock = threading.Lock()
        self.pending = futures.Future()
        self.arrived = 0
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)

    def get_model(self):
        return self.model

    @staticmethod
    @rpc.functions.async_execution
    def update_and_fetch_model(ps_rref, grads):
        self = ps_rref.local_value()
        with self.lock:
            for p, g in zip(self.model.parameters(), grads):
                p.grad += g
            self.arrived += 1
            fut = self.pending
            if self.arrived == self.trainers:
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                self.arrived = 0
                self.pending = futures.Future()
                fut.set_result(self.model)
        return fut


def trainer_batch(rank, step):
    """A trainer's own data for a step: y = x . w_true + 1, seeded by rank and step."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64)
    w_true = torch.arange(1, FEATURES + 1, dtype=torch.float64) / FEATURES
    return x, x @ w_true.unsqueeze(1) + 1


def train(ps_rref, rank):
    model = ps_rref.rpc_sync().get_model()
    losses = []
    for step in range(STEPS):
        x, y = trainer_batch(rank, step)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(round(loss.item(), 9))
        grads = [p.grad for p in model.parameters()]
        model = rpc.rpc_sync(ps_rref.owner(), ParameterServer.update_and_fetch_model, args=(ps_rref, grads))
    return losses


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # The process group first, then RPC, on the same MASTER_ADDR/MASTER_PORT.
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size)
    if rank == 0:
        trainers = world_size - 1
        ps_rref = rpc.RRef(ParameterServer(trainers))
        futs = [rpc.rpc_async(f"w{t}", train, args=(ps_rref, t)) for t in range(1, world_size)]
        losses = {f"w{t}": fut.wait() for t, fut in zip(range(1, world_size), futs)}
        weights = [round(v, 9) for v in torch.cat([p.detach().flatten() for p in ps_rref.local_value().model.parameters()]).tolist()]
    last = torch.tensor([0.0 if rank == 0 else 1.0])
    dist.all_reduce(last)  # every rank takes part: the trainers count themselves
    rpc.shutdown()
    dist.destroy_process_group()
    if rank == 0:
        print("RESULT " + json.dumps({"losses": losses, "weights": weights, "trainers_counted": last.item()}), flush=True)


if __name__ == "__main__":
    main()
