"""Training steps over RPC for `make bench`: the distributed RNN of torch's tutorial (embedding
table and decoder on the parameter server, the LSTM on the trainer) and a parameter server
whose model runs on the server (torch's rpc_parameter_server tutorial), each step a forward, a
distributed backward and a DistributedOptimizer step. Small models: the figure is the RPC
layer's cost per step, which is what users of these tutorials pay."""

import time

import torch
from torch import nn


class EmbeddingTable(nn.Module):
    def __init__(self, ntoken, ninp):
        super().__init__()
        self.encoder = nn.Embedding(ntoken, ninp)

    def forward(self, x):
        return self.encoder(x)


class Decoder(nn.Module):
    def __init__(self, ntoken, nhid):
        super().__init__()
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, x):
        return self.decoder(x)


class ServerNet(nn.Module):
    """The parameter server's model: an MNIST-shaped MLP."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


def call_method(method, rref, *args):
    return method(rref.local_value(), *args)


def _remote_params(rpc, rref):
    return rpc.rpc_sync(rref.owner(), _param_rrefs_on_owner, args=(rref,))


def _param_rrefs_on_owner(rref):
    import sys

    rpc = sys.modules.get("tensorplay_rpc") or sys.modules["torch.distributed.rpc"]
    return [rpc.RRef(p) for p in rref.local_value().parameters()]


def _steps(step, warmup, count):
    for _ in range(warmup):
        step()
    samples = []
    for _ in range(count):
        t0 = time.perf_counter()
        step()
        samples.append(time.perf_counter() - t0)
    return samples


def rnn_step_times(rpc, dist_autograd, DistributedOptimizer, ps="w1", warmup=5, count=100):
    """Seconds per step of the distributed RNN, trained from this worker."""
    torch.manual_seed(0)
    ntoken, ninp, nhid, nlayers, batch, seq = 50, 16, 32, 2, 8, 10
    emb = rpc.remote(ps, EmbeddingTable, args=(ntoken, ninp))
    dec = rpc.remote(ps, Decoder, args=(ntoken, nhid))
    lstm = nn.LSTM(ninp, nhid, nlayers)
    params = _remote_params(rpc, emb) + [rpc.RRef(p) for p in lstm.parameters()] + _remote_params(rpc, dec)
    opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.05)
    criterion = nn.CrossEntropyLoss()
    data = torch.randint(0, ntoken, (seq, batch))
    target = torch.randint(0, ntoken, (seq * batch,))

    def step():
        with dist_autograd.context() as cid:
            x = rpc.rpc_sync(ps, call_method, args=(EmbeddingTable.forward, emb, data))
            out, _ = lstm(x)
            y = rpc.rpc_sync(ps, call_method, args=(Decoder.forward, dec, out))
            loss = criterion(y.view(-1, ntoken), target)
            dist_autograd.backward(cid, [loss])
            opt.step(cid)

    return _steps(step, warmup, count)


def parameter_server_step_times(rpc, dist_autograd, DistributedOptimizer, ps="w1", warmup=5, count=100):
    """Seconds per step of a trainer whose model runs on the parameter server."""
    torch.manual_seed(0)
    net = rpc.remote(ps, ServerNet)
    opt = DistributedOptimizer(torch.optim.SGD, _remote_params(rpc, net), lr=0.05)
    criterion = nn.CrossEntropyLoss()
    x, target = torch.randn(32, 784), torch.randint(0, 10, (32,))

    def step():
        with dist_autograd.context() as cid:
            y = rpc.rpc_sync(ps, call_method, args=(ServerNet.forward, net, x))
            loss = criterion(y, target)
            dist_autograd.backward(cid, [loss])
            opt.step(cid)

    return _steps(step, warmup, count)
