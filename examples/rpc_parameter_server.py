"""Parameter-server training with distributed autograd, after pytorch/examples'
distributed/rpc/parameter_server/rpc_parameter_server.py (torch's "Implementing a Parameter
Server Using Distributed RPC Framework" tutorial), on CPU.

Rank 0 is the parameter server: it only answers. Every other rank is a trainer. Each trainer
asks the server, with ``rpc.remote``, for ``get_parameter_server()``: a function of this
script's ``__main__`` that creates the one ``ParameterServer`` of the world under a module-level
lock and keeps it in the module-level global ``param_server``; so every trainer trains the same
model, which lives on the server. A trainer's forward runs the model on the server
(``remote_method(ParameterServer.forward, ...)``); ``dist_autograd.backward`` carries the
gradients back to the server and a ``DistributedOptimizer`` over the server's parameter RRefs
steps them there.

    python -m tensorplay_rpc.run --nproc 3 examples/rpc_parameter_server.py [--backend torch]

Unlike the original: no GPUs, no MNIST download (seeded random images of MNIST's shape, each
class a noisy copy of a template of its own, so there is something to learn), a smaller
network, one epoch of a few batches. Every rank prints a last line ``RESULT {...}``: a
trainer its losses and its accuracy on a test set, the server how many ``ParameterServer``s
were made (one). The trainers take turns, one batch each (the original's trainers race and
fail: see ``ParameterServer.wait_turn``), so the losses and accuracies are the same on every
run and on either backend.
"""

import argparse
import json
import math
import os
from threading import Condition, Lock

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim


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
else:
    import tensorplay_rpc as rpc
    import tensorplay_rpc.autograd as dist_autograd
    from tensorplay_rpc.optim import DistributedOptimizer

BATCH_SIZE = 32
TRAIN_BATCHES = 12
TEST_BATCHES = 4
LR = 0.1
TRAINERS = int(os.environ.get("WORLD_SIZE", "3")) - 1

# --------- MNIST Network to train, from pytorch/examples (smaller) -----


class Net(nn.Module):
    def __init__(self, num_gpus=0):
        super(Net, self).__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout2d(0.25)
        self.dropout2 = nn.Dropout2d(0.5)
        self.fc1 = nn.Linear(2304, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.max_pool2d(x, 2)

        x = self.dropout1(x)
        x = torch.flatten(x, 1)

        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


# --------- Helper Methods --------------------

# On the local node, call a method with first arg as the value held by the
# RRef. Other args are passed in as arguments to the function called.
# Useful for calling instance methods.
def call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


# Given an RRef, return the result of calling the passed in method on the value
# held by the RRef. This call is done on the remote node that owns
# the RRef. args and kwargs are passed into the method.
def remote_method(method, rref, *args, **kwargs):
    args = [method, rref] + list(args)
    return rpc.rpc_sync(rref.owner(), call_method, args=args, kwargs=kwargs)


# --------- Parameter Server --------------------
parameter_servers_made = 0


class ParameterServer(nn.Module):
    def __init__(self, num_gpus=0):
        global parameter_servers_made
        super().__init__()
        model = Net(num_gpus=num_gpus)
        self.model = model
        self.input_device = torch.device("cpu")
        parameter_servers_made += 1
        # Not in the original: the trainers take turns (see take_turn).
        self.turns = Condition()
        self.next_trainer = 1

    def forward(self, inp):
        inp = inp.to(self.input_device)
        out = self.model(inp)
        out = out.to("cpu")
        return out

    # Use dist autograd to retrieve gradients accumulated for this model.
    # Primarily used for verification.
    def get_dist_gradients(self, cid):
        grads = dist_autograd.get_gradients(cid)
        cpu_grads = {}
        for k, v in grads.items():
            k_cpu, v_cpu = k.to("cpu"), v.to("cpu")
            cpu_grads[k_cpu] = v_cpu
        return cpu_grads

    # Not in the original, whose trainers race: one trainer's optimizer step changes the
    # parameters in place between another's forward and backward, and that backward fails
    # ("one of the variables needed for gradient computation has been modified by an inplace
    # operation", pytorch/examples#780 and #856, pytorch/tutorials#2095). As the fix proposed
    # upstream (pytorch/examples#842), each trainer waits for its turn (trainers 1, 2, ..., 1,
    # 2, ...) before a forward and hands it on after its optimizer step; the run is then the
    # same every time.
    def wait_turn(self, rank):
        with self.turns:
            self.turns.wait_for(lambda: self.next_trainer == rank)

    def end_turn(self):
        with self.turns:
            self.next_trainer = self.next_trainer % TRAINERS + 1
            self.turns.notify_all()

    # Wrap local parameters in a RRef. Needed for building the
    # DistributedOptimizer which optimizes parameters remotely.
    def get_param_rrefs(self):
        param_rrefs = [rpc.RRef(param) for param in self.model.parameters()]
        return param_rrefs


param_server = None
global_lock = Lock()


def get_parameter_server(num_gpus=0):
    global param_server
    # Ensure that we get only one handle to the ParameterServer.
    with global_lock:
        if not param_server:
            # construct it once
            param_server = ParameterServer(num_gpus=num_gpus)
        return param_server


def run_parameter_server(rank, world_size):
    # The parameter server just acts as a host for the model and responds to
    # requests from trainers, hence it does not need to run a loop.
    # rpc.shutdown() will wait for all workers to complete by default, which
    # in this case means that the parameter server will wait for all trainers
    # to complete, and then exit.
    print("PS master initializing RPC")
    rpc.init_rpc(name="parameter_server", rank=rank, world_size=world_size)
    print("RPC initialized! Running parameter server...")
    rpc.shutdown()
    print("RPC shutdown on parameter server.")
    # This worker's own global: set by the trainers' calls of get_parameter_server.
    print("RESULT " + json.dumps({"parameter_servers_made": parameter_servers_made, "param_server_set": param_server is not None}), flush=True)


# --------- Trainers --------------------

# nn.Module corresponding to the network trained by this trainer. The
# forward() method simply invokes the network on the given parameter
# server.
class TrainerNet(nn.Module):
    def __init__(self, num_gpus=0):
        super().__init__()
        self.num_gpus = num_gpus
        self.param_server_rref = rpc.remote("parameter_server", get_parameter_server, args=(num_gpus,))

    def get_global_param_rrefs(self):
        remote_params = remote_method(ParameterServer.get_param_rrefs, self.param_server_rref)
        return remote_params

    def forward(self, x):
        model_output = remote_method(ParameterServer.forward, self.param_server_rref, x)
        return model_output


def run_training_loop(rank, num_gpus, train_loader, test_loader):
    # Runs the typical neural network forward + backward + optimizer step, but
    # in a distributed fashion.
    net = TrainerNet(num_gpus=num_gpus)
    # Build DistributedOptimizer.
    param_rrefs = net.get_global_param_rrefs()
    opt = DistributedOptimizer(optim.SGD, param_rrefs, lr=LR)
    losses = []
    for i, (data, target) in enumerate(train_loader):
        remote_method(ParameterServer.wait_turn, net.param_server_rref, rank)
        with dist_autograd.context() as cid:
            model_output = net(data)
            target = target.to(model_output.device)
            loss = F.nll_loss(model_output, target)
            if i % 5 == 0:
                print(f"Rank {rank} training batch {i} loss {loss.item()}")
            dist_autograd.backward(cid, [loss])
            # Ensure that dist autograd ran successfully and gradients were
            # returned.
            assert remote_method(ParameterServer.get_dist_gradients, net.param_server_rref, cid) != {}
            opt.step(cid)
            losses.append(loss.item())
        remote_method(ParameterServer.end_turn, net.param_server_rref)

    print("Training complete!")
    print("Getting accuracy....")
    remote_method(ParameterServer.wait_turn, net.param_server_rref, rank)
    accuracy = get_accuracy(test_loader, net)
    remote_method(ParameterServer.end_turn, net.param_server_rref)
    return losses, accuracy


def get_accuracy(test_loader, model):
    model.eval()
    correct_sum = 0
    device = torch.device("cpu")
    with torch.no_grad():
        for i, (data, target) in enumerate(test_loader):
            out = model(data)
            pred = out.argmax(dim=1, keepdim=True)
            pred, target = pred.to(device), target.to(device)
            correct = pred.eq(target.view_as(pred)).sum().item()
            correct_sum += correct

    print(f"Accuracy {correct_sum / (len(test_loader) * BATCH_SIZE)}")
    return correct_sum / (len(test_loader) * BATCH_SIZE)


# Main loop for trainers.
def run_worker(rank, world_size, num_gpus, train_loader, test_loader):
    print(f"Worker rank {rank} initializing RPC")
    rpc.init_rpc(name=f"trainer_{rank}", rank=rank, world_size=world_size)

    print(f"Worker {rank} done initializing RPC")

    losses, accuracy = run_training_loop(rank, num_gpus, train_loader, test_loader)
    rpc.shutdown()
    print("RESULT " + json.dumps({"losses": losses, "accuracy": accuracy, "finite": all(math.isfinite(v) for v in losses)}), flush=True)


# --------- Data: MNIST's shape, no download --------------------


def synthetic_mnist(seed, batches):
    """``batches`` batches of 28x28 one-channel images and their labels: each image a noisy
    copy of its class's template (the same templates on every rank)."""
    templates = torch.rand(10, 1, 28, 28, generator=torch.Generator().manual_seed(12345))
    g = torch.Generator().manual_seed(seed)
    loader = []
    for _ in range(batches):
        target = torch.randint(0, 10, (BATCH_SIZE,), generator=g)
        data = templates[target] + 0.5 * torch.randn(BATCH_SIZE, 1, 28, 28, generator=g)
        loader.append(((data - 0.5) / 0.5, target))
    return loader


# --------- Launcher --------------------


if __name__ == "__main__":
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    num_gpus = 0
    if rank == 0:
        run_parameter_server(0, world_size)
    else:
        # Get data to train on
        train_loader = synthetic_mnist(seed=rank, batches=TRAIN_BATCHES)
        test_loader = synthetic_mnist(seed=100 + rank, batches=TEST_BATCHES)
        # start training worker on this node
        run_worker(rank, world_size, num_gpus, train_loader, test_loader)
