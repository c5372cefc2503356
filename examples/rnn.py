"""A distributed RNN, after pytorch/examples' distributed/rpc/rnn (main.py and rnn.py), on CPU.

Rank 1 is the trainer, rank 0 the parameter server "ps". The embedding table and the decoder
live on the ps (created with ``rpc.remote``); the LSTM lives on the trainer. Each step the
trainer sends its tokens to the remote embedding table, runs the LSTM locally and sends the
LSTM's output to the remote decoder; then, in a distributed autograd context,
``dist_autograd.backward`` carries the gradients back through both RPCs and a
``DistributedOptimizer`` over every parameter (RRefs from the ps for the remote ones,
``RRef(param)`` for the local ones) steps each on its owner.

    python -m tensorplay_rpc.run --nproc 2 examples/rnn.py [--backend torch]

Unlike the original: seeded random data (instead of uninitialised ``torch.LongTensor``s),
seeded weights (each remote module from a generator of its own), float64, dropout 0, and 3
epochs of the same 4 batches, so that the run is the same every time. The trainer (rank 1)
prints a last line ``RESULT {...}`` (the loss of every step and the sums of the embedding
table's, the LSTM's and the decoder's weights before and after training), the same on either
backend.
"""

import argparse
import json
import os

import torch
import torch.nn as nn
import torch.optim as optim


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["tensorplay", "torch"], default="tensorplay")
    return parser.parse_args()


# The only lines that differ from torch's example: which RPC, distributed autograd and
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

EPOCHS = 3
BATCHES = 4
LR = 0.05
DROPOUT = 0.0  # the original's 0.5 makes the losses depend on the RNG of each worker


# ---- rnn.py ----------------------------------------------------------------------------


def _call_method(method, rref, *args, **kwargs):
    r"""a helper function to call a method on the given RRef"""
    return method(rref.local_value(), *args, **kwargs)


def _remote_method(method, rref, *args, **kwargs):
    r"""a helper function to run method on the owner of rref and fetch back the result
    using RPC"""
    return rpc.rpc_sync(rref.owner(), _call_method, args=[method, rref] + list(args), kwargs=kwargs)


def _parameter_rrefs(module):
    r"""Create one RRef for each parameter in the given local module, and return a list of
    RRefs."""
    param_rrefs = []
    for param in module.parameters():
        param_rrefs.append(RRef(param))
    return param_rrefs


def uniform_(tensor, a, b, seed):
    """nn.init.uniform_ from a generator of its own: the ps builds the embedding table and the
    decoder at once, on two threads, so the global generator would give each a different
    share of its numbers from run to run."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        tensor.copy_(torch.rand(tensor.shape, generator=g, dtype=tensor.dtype) * (b - a) + a)


class EmbeddingTable(nn.Module):
    r"""Encoding layers of the RNNModel"""

    def __init__(self, ntoken, ninp, dropout):
        super(EmbeddingTable, self).__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp).double()
        uniform_(self.encoder.weight, -0.1, 0.1, seed=1)

    def forward(self, input):
        return self.drop(self.encoder(input)).cpu()


class Decoder(nn.Module):
    r"""Decoding layers of the RNNModel"""

    def __init__(self, ntoken, nhid, dropout):
        super(Decoder, self).__init__()
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(nhid, ntoken).double()
        nn.init.zeros_(self.decoder.bias)
        uniform_(self.decoder.weight, -0.1, 0.1, seed=2)

    def forward(self, output):
        return self.decoder(self.drop(output))


class RNNModel(nn.Module):
    r"""A distributed RNN model which puts embedding table and decoder parameters on a
    remote parameter server, and locally holds parameters for the LSTM module."""

    def __init__(self, ps, ntoken, ninp, nhid, nlayers, dropout=0.5):
        super(RNNModel, self).__init__()
        # setup embedding table remotely
        self.emb_table_rref = rpc.remote(ps, EmbeddingTable, args=(ntoken, ninp, dropout))
        # setup LSTM locally
        torch.manual_seed(3)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout).double()
        # setup decoder remotely
        self.decoder_rref = rpc.remote(ps, Decoder, args=(ntoken, nhid, dropout))

    def forward(self, input, hidden):
        # pass input to the remote embedding table and fetch emb tensor back
        emb = _remote_method(EmbeddingTable.forward, self.emb_table_rref, input)
        output, hidden = self.rnn(emb, hidden)
        # pass output to the remote decoder and get the decoded output back
        decoded = _remote_method(Decoder.forward, self.decoder_rref, output)
        return decoded, hidden

    def parameter_rrefs(self):
        remote_params = []
        # get RRefs of embedding table
        remote_params.extend(_remote_method(_parameter_rrefs, self.emb_table_rref))
        # create RRefs for local parameters
        remote_params.extend(_parameter_rrefs(self.rnn))
        # get RRefs of decoder
        remote_params.extend(_remote_method(_parameter_rrefs, self.decoder_rref))
        return remote_params


# ---- main.py ---------------------------------------------------------------------------


def checksum(module):
    return round(sum(p.detach().double().sum().item() for p in module.parameters()), 9)


def checksums(model):
    """The sums of the embedding table's, the LSTM's and the decoder's weights."""
    return [
        _remote_method(checksum, model.emb_table_rref),
        checksum(model.rnn),
        _remote_method(checksum, model.decoder_rref),
    ]


def _run_trainer():
    r"""The trainer creates a distributed RNNModel and a DistributedOptimizer. Then, it
    performs training using random input data."""
    batch = 5
    ntoken = 7
    ninp = 2

    nhid = 3
    nindices = 6
    nlayers = 4
    g = torch.Generator().manual_seed(0)
    hidden = (
        torch.randn(nlayers, nindices, nhid, generator=g, dtype=torch.float64),
        torch.randn(nlayers, nindices, nhid, generator=g, dtype=torch.float64),
    )

    model = RNNModel("ps", ntoken, ninp, nhid, nlayers, dropout=DROPOUT)

    # setup distributed optimizer
    opt = DistributedOptimizer(
        optim.SGD,
        model.parameter_rrefs(),
        lr=LR,
    )

    criterion = torch.nn.CrossEntropyLoss()
    before = checksums(model)

    # The same few batches every epoch, so that the loss has something to learn.
    batches = [
        (torch.randint(0, ntoken, (batch, nindices), generator=g), torch.randint(0, nindices, (batch, ntoken), generator=g))
        for _ in range(BATCHES)
    ]

    def get_next_batch():
        for data, target in batches:
            yield data, target

    losses = []
    for epoch in range(EPOCHS):
        # create distributed autograd context
        for data, target in get_next_batch():
            with dist_autograd.context() as context_id:
                hidden[0].detach_()
                hidden[1].detach_()
                output, hidden = model(data, hidden)
                loss = criterion(output, target)
                # run distributed backward pass
                dist_autograd.backward(context_id, [loss])
                # run distributed optimizer
                opt.step(context_id)
                # not necessary to zero grads as each iteration creates a different
                # distributed autograd context which hosts different grads
                losses.append(round(loss.item(), 9))
        print("Training epoch {}".format(epoch))
    # The optimizer must have stepped the parameters on both workers.
    return {"losses": losses, "checksums_before": before, "checksums_after": checksums(model)}


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == 1:
        rpc.init_rpc("trainer", rank=rank, world_size=world_size)
        result = _run_trainer()
    else:
        rpc.init_rpc("ps", rank=rank, world_size=world_size)
        # parameter server does nothing

    # block until all rpcs finish
    rpc.shutdown()
    if rank == 1:
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
