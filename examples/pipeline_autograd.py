"""Pipeline parallelism trained with distributed autograd, after torch's "Distributed Pipeline
Parallelism Using RPC" tutorial (pytorch/examples' distributed/rpc/pipeline/main.py), on CPU.

A small convolutional network stands in for the tutorial's ResNet50: it is cut in two shards,
each created on a worker of its own with ``rpc.remote`` ("worker1", "worker2"; rank 0 is the
master). The master splits each batch into micro-batches and streams them through the
shards with ``rpc_async``: shard 1's output stays on worker1 as an RRef that shard 2 fetches.
In a distributed autograd context, ``dist_autograd.backward`` from the master's loss carries
the gradients back through every micro-batch's RPCs to both shards, and a
``DistributedOptimizer`` over the shards' ``parameter_rrefs()`` steps each on its worker.
(examples/pipeline.py is the same pipeline trained without distributed autograd.)

    python -m tensorplay_rpc.run --nproc 3 examples/pipeline_autograd.py [--backend torch]

As the tutorial, the whole run is repeated for several numbers of micro-batches; here each
starts from the same seeded weights and data, so every split must give the same losses (up
to the order in which the micro-batches' gradients are summed). Rank 0 prints a last line
``RESULT {...}``: the losses of each split.
"""

import argparse
import json
import os
import threading
import time

import torch
import torch.nn as nn
import torch.optim as optim


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["tensorplay", "torch"], default="tensorplay")
    return parser.parse_args()


# The only lines that differ from torch's tutorial: which RPC, distributed autograd and
# distributed optimizer to use.
if parse_args().backend == "torch":
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    from torch.distributed.optim import DistributedOptimizer
    from torch.distributed.rpc import RRef
else:
    import tensorplay_rpc as rpc
    import tensorplay_rpc.autograd as dist_autograd
    from tensorplay_rpc import RRef
    from tensorplay_rpc.optim import DistributedOptimizer


#########################################################
#          Define a model-parallel small ConvNet        #
#########################################################

num_classes = 10


class ConvNetBase(nn.Module):
    def __init__(self):
        super(ConvNetBase, self).__init__()
        self._lock = threading.Lock()

    def parameter_rrefs(self):
        r"""Create one RRef for each parameter in the given local module, and return a list
        of RRefs."""
        return [RRef(p) for p in self.parameters()]


class ConvNetShard1(ConvNetBase):
    """The first part of the network."""

    def __init__(self, device):
        super(ConvNetShard1, self).__init__()
        torch.manual_seed(1)
        self.device = device
        self.seq = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2),
            nn.Conv2d(8, 16, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
        ).double().to(self.device)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x_rref):
        x = x_rref.to_here().to(self.device)
        with self._lock:
            out = self.seq(x)
        return out.cpu()


class ConvNetShard2(ConvNetBase):
    """The second part of the network."""

    def __init__(self, device):
        super(ConvNetShard2, self).__init__()
        torch.manual_seed(2)
        self.device = device
        self.seq = nn.Sequential(
            nn.Conv2d(16, 16, kernel_size=3, padding=1, stride=2),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d((1, 1)),
        ).double().to(self.device)
        self.fc = nn.Linear(16, num_classes).double().to(self.device)

    def forward(self, x_rref):
        x = x_rref.to_here().to(self.device)
        with self._lock:
            out = self.fc(torch.flatten(self.seq(x), 1))
        return out.cpu()


class DistConvNet(nn.Module):
    """Assemble two parts as an nn.Module and define pipelining logic"""

    def __init__(self, split_size, workers, *args, **kwargs):
        super(DistConvNet, self).__init__()

        self.split_size = split_size

        # Put the first part of the network on workers[0]
        self.p1_rref = rpc.remote(workers[0], ConvNetShard1, args=("cpu",) + args, kwargs=kwargs)

        # Put the second part of the network on workers[1]
        self.p2_rref = rpc.remote(workers[1], ConvNetShard2, args=("cpu",) + args, kwargs=kwargs)

    def forward(self, xs):
        # Split the input batch xs into micro-batches, and collect async RPC
        # futures into a list
        out_futures = []
        for x in iter(xs.split(self.split_size, dim=0)):
            x_rref = RRef(x)
            y_rref = self.p1_rref.remote().forward(x_rref)
            z_fut = self.p2_rref.rpc_async().forward(y_rref)
            out_futures.append(z_fut)

        # collect and cat all output tensors into one tensor.
        return torch.cat(torch.futures.wait_all(out_futures))

    def parameter_rrefs(self):
        remote_params = []
        remote_params.extend(self.p1_rref.remote().parameter_rrefs().to_here())
        remote_params.extend(self.p2_rref.remote().parameter_rrefs().to_here())
        return remote_params


#########################################################
#                   Run RPC Processes                   #
#########################################################

num_batches = 4
batch_size = 24
image_w = 16
image_h = 16


def run_master(split_size):
    # put the two model parts on worker1 and worker2 respectively
    model = DistConvNet(split_size, ["worker1", "worker2"])
    loss_fn = nn.MSELoss()
    opt = DistributedOptimizer(
        optim.SGD,
        model.parameter_rrefs(),
        lr=0.5,
    )

    g = torch.Generator().manual_seed(0)
    one_hot_indices = torch.randint(0, num_classes, (batch_size, 1), generator=g)

    losses = []
    for i in range(num_batches):
        print(f"Processing batch {i}")
        # generate random inputs and labels
        inputs = torch.randn(batch_size, 3, image_w, image_h, generator=g, dtype=torch.float64)
        labels = torch.zeros(batch_size, num_classes, dtype=torch.float64).scatter_(1, one_hot_indices, 1)

        # The distributed autograd context is the dedicated scope for the
        # distributed backward pass to store gradients, which can later be
        # retrieved using the context_id by the distributed optimizer.
        with dist_autograd.context() as context_id:
            outputs = model(inputs)
            loss = loss_fn(outputs, labels)
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
            losses.append(loss.item())
    return losses


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == 0:
        rpc.init_rpc("master", rank=rank, world_size=world_size)
        losses = {}
        for num_split in [1, 2, 4]:
            tik = time.time()
            losses[num_split] = run_master(batch_size // num_split)
            tok = time.time()
            print(f"number of splits = {num_split}, execution time = {tok - tik}")
    else:
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size)

    # block until all rpcs finish
    rpc.shutdown()
    if rank == 0:
        print("RESULT " + json.dumps({"losses": losses}), flush=True)


if __name__ == "__main__":
    main()
