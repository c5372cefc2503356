"""DistributedDataParallel combined with RPC, after pytorch/examples' distributed/rpc/ddp_rpc
(torch's "Combining Distributed DataParallel with Distributed RPC Framework" tutorial), on CPU.

Four workers: two trainers (ranks 0 and 1), a master (rank 2) and a parameter server "ps"
(rank 3). The master creates a ``RemoteModule`` holding an ``nn.EmbeddingBag`` on the ps and
sends it to both trainers (``rpc_async(trainer, _run_trainer, args=(remote_emb_module, rank))``).
Each trainer's model looks its bags up in the remote embedding table, then runs an
``nn.Linear`` wrapped in ``DistributedDataParallel`` over a gloo process group of the two
trainers (on a port of its own, beside RPC's). In a distributed autograd context,
``dist_autograd.backward`` carries the gradients to the ps, DDP all-reduces the linear
layer's gradients between the trainers, and a ``DistributedOptimizer`` over the table's
``remote_parameters()`` and ``RRef``\\ s of the local parameters steps both.

    python -m tensorplay_rpc.run --nproc 4 examples/ddp_rpc.py [--backend torch] [--pg-port P]

Unlike the original: no GPUs (gloo, no device ids), seeded data: 4 batches per trainer that
repeat for 5 epochs (instead of 10 fresh random batches for 100 epochs), and each trainer
returns its losses and its linear layer's weights. The master (rank 2) prints a last line
``RESULT {...}``: each trainer's losses, whether the two trainers' linear layers are equal
after training (DDP's all-reduce must have happened) and changed (the optimizer stepped them),
and the embedding table's sum before and after. The trainers' updates of the shared table interleave as the calls arrive, so the
losses differ slightly from run to run; they must be finite and go down.
"""

import argparse
import json
import math
import os
import random

import torch
import torch.distributed as dist
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

NUM_EMBEDDINGS = 100
EMBEDDING_DIM = 16
EPOCHS = 5
BATCHES = 4


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["tensorplay", "torch"], default="tensorplay")
    parser.add_argument("--pg-port", type=int, default=None, help="port of the trainers' process group (default: MASTER_PORT + 1)")
    return parser.parse_args()


ARGS = parse_args()
# The only lines that differ from torch's example: which RPC, distributed autograd,
# distributed optimizer and remote module to use.
if ARGS.backend == "torch":
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    from torch.distributed.nn import RemoteModule
    from torch.distributed.optim import DistributedOptimizer
    from torch.distributed.rpc import RRef, TensorPipeRpcBackendOptions
else:
    import tensorplay_rpc as rpc
    import tensorplay_rpc.autograd as dist_autograd
    from tensorplay_rpc import RRef, TensorPipeRpcBackendOptions
    from tensorplay_rpc.nn import RemoteModule
    from tensorplay_rpc.optim import DistributedOptimizer


class HybridModel(torch.nn.Module):
    r"""
    The model consists of a sparse part and a dense part.
    1) The dense part is an nn.Linear module that is replicated across all trainers using DistributedDataParallel.
    2) The sparse part is a Remote Module that holds an nn.EmbeddingBag on the parameter server.
    This remote model can get a Remote Reference to the embedding table on the parameter server.
    """

    def __init__(self, remote_emb_module, rank):
        super(HybridModel, self).__init__()
        self.remote_emb_module = remote_emb_module
        torch.manual_seed(rank)  # different on each trainer: DDP makes them rank 0's
        self.fc = DDP(torch.nn.Linear(16, 8))
        self.rank = rank

    def forward(self, indices, offsets):
        emb_lookup = self.remote_emb_module.forward(indices, offsets)
        return self.fc(emb_lookup)


def _run_trainer(remote_emb_module, rank):
    r"""
    Each trainer runs a forward pass which involves an embedding lookup on the
    parameter server and running nn.Linear locally. During the backward pass,
    DDP is responsible for aggregating the gradients for the dense part
    (nn.Linear) and distributed autograd ensures gradients updates are
    propagated to the parameter server.
    """

    # Setup the model.
    model = HybridModel(remote_emb_module, rank)

    # Retrieve all model parameters as rrefs for DistributedOptimizer.

    # Retrieve parameters for embedding table.
    model_parameter_rrefs = model.remote_emb_module.remote_parameters()

    # model.fc.parameters() only includes local parameters.
    # NOTE: Cannot call model.parameters() here,
    # because this will call remote_emb_module.parameters(),
    # which supports remote_parameters() but not parameters().
    for param in model.fc.parameters():
        model_parameter_rrefs.append(RRef(param))

    # Setup distributed optimizer
    opt = DistributedOptimizer(
        optim.SGD,
        model_parameter_rrefs,
        lr=0.05,
    )

    criterion = torch.nn.CrossEntropyLoss()
    fc_before = [p.detach().clone() for p in model.fc.parameters()]

    rng = random.Random(rank)
    g = torch.Generator().manual_seed(rank)

    def make_batch():
        num_indices = rng.randint(20, 50)
        indices = torch.randint(0, NUM_EMBEDDINGS, (num_indices,), generator=g)

        # Generate offsets.
        offsets = []
        start = 0
        batch_size = 0
        while start < num_indices:
            offsets.append(start)
            start += rng.randint(1, 10)
            batch_size += 1

        offsets_tensor = torch.LongTensor(offsets)
        target = torch.randint(0, 8, (batch_size,), generator=g)
        return indices, offsets_tensor, target

    # The same few batches every epoch, so that the loss has something to learn.
    batches = [make_batch() for _ in range(BATCHES)]

    def get_next_batch(rank):
        for indices, offsets_tensor, target in batches:
            yield indices, offsets_tensor, target

    losses = []
    for epoch in range(EPOCHS):
        # create distributed autograd context
        for indices, offsets, target in get_next_batch(rank):
            with dist_autograd.context() as context_id:
                output = model(indices, offsets)
                loss = criterion(output, target)

                # Run distributed backward pass
                dist_autograd.backward(context_id, [loss])

                # Run distributed optimizer
                opt.step(context_id)

                # Not necessary to zero grads as each iteration creates a different
                # distributed autograd context which hosts different grads
                losses.append(loss.item())
        print("Training done for epoch {}".format(epoch))
    fc_changed = any(not torch.equal(a, b) for a, b in zip(fc_before, model.fc.parameters()))
    return {"losses": losses, "fc": [p.detach().flatten().tolist() for p in model.fc.parameters()], "fc_changed": fc_changed}


def _embedding_sum(module_rref):
    """Runs on the ps: the sum of the embedding table's weights."""
    return module_rref.local_value().weight.detach().double().sum().item()


def run_worker(rank, world_size):
    r"""
    A wrapper function that initializes RPC, calls the function, and shuts down
    RPC.
    """

    # We need to use different port numbers in TCP init_method for init_rpc and
    # init_process_group to avoid port conflicts.
    master_addr, master_port = os.environ.get("MASTER_ADDR", "localhost"), int(os.environ.get("MASTER_PORT", "29501"))
    pg_port = ARGS.pg_port or master_port + 1
    rpc_backend_options = TensorPipeRpcBackendOptions()
    rpc_backend_options.init_method = f"tcp://{master_addr}:{master_port}"

    result = None
    # Rank 2 is master, 3 is ps and 0 and 1 are trainers.
    if rank == 2:
        rpc.init_rpc(
            "master",
            rank=rank,
            world_size=world_size,
            rpc_backend_options=rpc_backend_options,
        )

        remote_emb_module = RemoteModule(
            "ps",
            torch.nn.EmbeddingBag,
            args=(NUM_EMBEDDINGS, EMBEDDING_DIM),
            kwargs={"mode": "sum"},
        )
        before = rpc.rpc_sync("ps", _embedding_sum, args=(remote_emb_module.get_module_rref(),))

        # Run the training loop on trainers.
        futs = []
        for trainer_rank in [0, 1]:
            trainer_name = "trainer{}".format(trainer_rank)
            fut = rpc.rpc_async(trainer_name, _run_trainer, args=(remote_emb_module, trainer_rank))
            futs.append(fut)

        # Wait for all training to finish.
        trained = [fut.wait() for fut in futs]
        after = rpc.rpc_sync("ps", _embedding_sum, args=(remote_emb_module.get_module_rref(),))
        losses = {f"trainer{r}": t["losses"] for r, t in enumerate(trained)}
        result = {
            "losses": losses,
            "finite": all(math.isfinite(v) for ls in losses.values() for v in ls),
            "fc_weights_equal": trained[0]["fc"] == trained[1]["fc"],
            "fc_changed": [t["fc_changed"] for t in trained],
            "largest_fc_gap": max(abs(a - b) for p0, p1 in zip(trained[0]["fc"], trained[1]["fc"]) for a, b in zip(p0, p1)),
            "embedding_sum_before": before,
            "embedding_sum_after": after,
        }
    elif rank <= 1:
        # Initialize process group for Distributed DataParallel on trainers.
        dist.init_process_group(backend="gloo", rank=rank, world_size=2, init_method=f"tcp://{master_addr}:{pg_port}")

        # Initialize RPC.
        trainer_name = "trainer{}".format(rank)
        rpc.init_rpc(
            trainer_name,
            rank=rank,
            world_size=world_size,
            rpc_backend_options=rpc_backend_options,
        )

        # Trainer just waits for RPCs from master.
    else:
        torch.manual_seed(0)  # the embedding table RemoteModule makes here
        rpc.init_rpc(
            "ps",
            rank=rank,
            world_size=world_size,
            rpc_backend_options=rpc_backend_options,
        )
        # parameter server do nothing
        pass

    # block until all rpcs finish
    rpc.shutdown()

    # Clean up process group for trainers to avoid resource leaks
    if rank <= 1:
        dist.destroy_process_group()
    if result is not None:
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    # 2 trainers, 1 parameter server, 1 master.
    run_worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
