"""Distributed autograd, DistributedOptimizer, RemoteModule and RRef.backward, in a world of
three. This module runs as every rank's ``__main__`` (harness.RUN_AS_MAIN): the functions and
classes the scenarios send are ``__main__``'s, as in a user's script."""

import threading
import time

import torch

import harness
from harness import differs, scenario

WORLD = 3


def rounded(t):
    return [round(float(v), 5) for v in t.reshape(-1).tolist()]


def grads_of(context_id, *tensors):
    grads = harness.dist_autograd.get_gradients(context_id)
    return [rounded(grads[t]) if t in grads else None for t in tensors]


def leaves():
    a = (torch.arange(1.0, 4.0) / 3).requires_grad_()
    b = (torch.arange(4.0, 7.0) / 5).requires_grad_()
    return a, b


def mul(x, y):
    return x * y


def chain_on(worker, x, y):
    """Runs on the middle worker: a call on to ``worker``, and some work of its own."""
    return harness.rpc.rpc_sync(worker, mul, args=(x, y)) + x.sin()


def back_to(worker, x):
    """Runs on w1: calls back the worker that called it."""
    return harness.rpc.rpc_sync(worker, torch.cos, args=(x,)) * 3


def in_containers(pack):
    return {"sum": pack["pair"][0] * pack["pair"][1], "same": pack["same"] + pack["same"]}


class Scale(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(1.0, n + 1.0) / 10)

    def forward(self, x):
        return x * self.weight

    def scaled(self, x):
        return self.forward(x)


def mul_later(x, y):
    """An async_execution function: its result comes through a future completed by a
    callback on another call."""
    return harness.rpc.rpc_async("w2", mul, args=(x, y)).then(lambda fut: fut.wait() * 2)


if harness.rpc is not None:  # None where the test only lists the scenarios
    mul_later = harness.rpc.functions.async_execution(mul_later)


class FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise ValueError("backward failed on purpose")


def fails_in_backward(x):
    return FailingBackward.apply(x) * 2


def context_count():
    return int(harness.dist_autograd._get_debug_info()["num_autograd_contexts"])


def wait_for_no_contexts():
    """Contexts left on each worker once peers had a moment to hear of the release."""
    deadline = time.monotonic() + 10
    while True:
        counts = [harness.rpc.rpc_sync(f"w{r}", context_count) for r in range(WORLD)]
        if not any(counts) or time.monotonic() > deadline:
            return counts
        time.sleep(0.05)


def gradients_on_owner(context_id, module_rref):
    grads = harness.dist_autograd.get_gradients(context_id)
    return rounded(grads[module_rref.local_value().weight])


def weight_of(module_rref):
    return rounded(module_rref.local_value().weight)


def scalar_of(rref):
    return rref.local_value().sum()


def make_scale(n):
    return Scale(n)


@scenario
def add_on_a_peer():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        loss = harness.rpc.rpc_sync("w1", torch.add, args=(a, b)).sum()
        harness.dist_autograd.backward(cid, [loss])
        return grads_of(cid, a, b), a.grad, b.grad


@scenario
def a_worker_called_twice():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        x = harness.rpc.rpc_sync("w1", mul, args=(a, b))
        y = harness.rpc.rpc_sync("w1", mul, args=(x, a))
        harness.dist_autograd.backward(cid, [y.sum()])
        return grads_of(cid, a, b)


@scenario
def a_chain_of_three_workers():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        y = harness.rpc.rpc_sync("w1", chain_on, args=("w2", a, b))
        harness.dist_autograd.backward(cid, [(y * y).sum()])
        return grads_of(cid, a, b)


@scenario
def calls_that_fan_out_and_come_back():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        x = harness.rpc.rpc_sync("w1", back_to, args=("w0", a * b))
        y = harness.rpc.rpc_async("w2", torch.mul, args=(x, b)).wait()
        harness.dist_autograd.backward(cid, [y.sum()])
        return grads_of(cid, a, b)


@scenario
def rpc_async_and_futures():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        futs = [harness.rpc.rpc_async(f"w{r}", mul, args=(a, b)) for r in (1, 2)]
        loss = sum(f.wait().sum() for f in futs)
        harness.dist_autograd.backward(cid, [loss])
        return grads_of(cid, a, b)


@scenario
def remote_and_to_here():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        rref = harness.rpc.remote("w1", mul, args=(a, b))
        loss = (rref.to_here() * 2).sum()
        harness.dist_autograd.backward(cid, [loss])
        return grads_of(cid, a, b)


@scenario
def rref_proxies():
    a, _ = leaves()
    module = harness.rpc.remote("w2", make_scale, args=(3,))
    with harness.dist_autograd.context() as cid:
        y = module.rpc_sync().scaled(a) + module.rpc_async().forward(a).wait()
        harness.dist_autograd.backward(cid, [y.sum()])
        return grads_of(cid, a), harness.rpc.rpc_sync("w2", gradients_on_owner, args=(cid, module))


@scenario
def an_async_execution_function():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        y = harness.rpc.rpc_sync("w1", mul_later, args=(a, b))
        harness.dist_autograd.backward(cid, [y.sum()])
        return grads_of(cid, a, b)


@scenario
def tensors_inside_containers_and_used_twice():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        out = harness.rpc.rpc_sync("w1", in_containers, args=({"pair": [a, b], "same": a},))
        harness.dist_autograd.backward(cid, [out["sum"].sum() + out["same"].sum() * 3])
        return grads_of(cid, a, b)


@scenario
def a_leaf_used_here_and_remotely():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        loss = harness.rpc.rpc_sync("w1", mul, args=(a, b)).sum() + a.sum()
        harness.dist_autograd.backward(cid, [loss])
        return grads_of(cid, a, b), a.grad


@differs(
    "a leaf the caller's own graph uses, that also went out in RPCs through every worker, gets exactly "
    "local autograd's gradient in the context; torch's sometimes (1 run in 4 here) puts the local part "
    "in .grad instead and leaves the context's short of it",
    "ok True",
)
def a_leaf_sent_and_used_here_matches_local_autograd():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        x = harness.rpc.rpc_sync("w1", mul, args=(a, b))
        y = harness.rpc.rpc_sync("w1", mul, args=(x, a))
        z = harness.rpc.rpc_sync("w1", chain_on, args=("w2", y, b))
        u = harness.rpc.rpc_sync("w1", back_to, args=("w0", z))
        f = harness.rpc.rpc_async("w2", torch.add, args=(u, a)).wait()
        harness.dist_autograd.backward(cid, [f.sum() + a.sum()])
        distributed = grads_of(cid, a, b)
    la, lb = leaves()
    y = la * lb * la
    z = y * lb + y.sin()
    f = torch.cos(z) * 3 + la
    (f.sum() + la.sum()).backward()
    return distributed == [rounded(la.grad), rounded(lb.grad)] and a.grad is None


@scenario
def gradients_accumulate_over_two_backwards():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        loss = harness.rpc.rpc_sync("w1", mul, args=(a, b)).sum()
        harness.dist_autograd.backward(cid, [loss], retain_graph=True)
        harness.dist_autograd.backward(cid, [loss])
        return grads_of(cid, a, b)


@scenario
def contexts_are_released_everywhere():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        x = harness.rpc.rpc_sync("w1", chain_on, args=("w2", a, b))
        harness.dist_autograd.backward(cid, [x.sum()])
        during = [context_count()] + [harness.rpc.rpc_sync(f"w{r}", context_count) for r in range(1, WORLD)]
    try:
        harness.dist_autograd._is_valid_context(cid)
        valid_after = True
    except RuntimeError:
        valid_after = False
    return during, wait_for_no_contexts(), valid_after


@scenario
def concurrent_contexts_on_threads_do_not_mix():
    results = {}

    def train(k):
        try:
            a = torch.full((3,), float(k), requires_grad=True)
            with harness.dist_autograd.context() as cid:
                y = harness.rpc.rpc_sync("w1", mul, args=(a, a))
                for _ in range(4):
                    y = y + harness.rpc.rpc_sync(f"w{1 + k % 2}", mul, args=(a, a))
                harness.dist_autograd.backward(cid, [y.sum()])
                results[k] = grads_of(cid, a)[0]
        except Exception as exc:
            results[k] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=train, args=(k,)) for k in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results.items()), wait_for_no_contexts()


@scenario
def context_ids_are_unique_across_the_world():
    with harness.dist_autograd.context() as mine:
        pass
    theirs = harness.rpc.rpc_sync("w1", new_context_id)
    return mine != theirs, mine >> 48, theirs >> 48


def new_context_id():
    with harness.dist_autograd.context() as cid:
        return cid


@scenario
def a_second_context_on_a_thread():
    with harness.dist_autograd.context():
        with harness.dist_autograd.context():
            pass


def first_line(call):
    """The error ``call`` raises, without the C++ frames torch appends."""
    try:
        call()
    except Exception as exc:
        return type(exc).__name__, str(exc).split("\nException raised from")[0]
    return None


@scenario
def backward_in_an_unknown_context():
    a, _ = leaves()
    return first_line(lambda: harness.dist_autograd.backward(12345, [a.sum()]))


@scenario
def get_gradients_of_an_unknown_context():
    harness.dist_autograd.get_gradients(999)


@scenario
def a_root_that_does_not_require_grad():
    with harness.dist_autograd.context() as cid:
        return first_line(lambda: harness.dist_autograd.backward(cid, [torch.ones(())]))


@scenario
def a_root_that_is_not_a_scalar():
    a, _ = leaves()
    with harness.dist_autograd.context() as cid:
        return first_line(lambda: harness.dist_autograd.backward(cid, [a * 2]))


@scenario
def current_context_outside_any():
    harness.dist_autograd._current_context()


@scenario
def current_context_inside_one():
    with harness.dist_autograd.context() as cid:
        return harness.dist_autograd._current_context()._context_id() == cid, harness.dist_autograd._is_valid_context(cid)


@scenario
def is_valid_context_of_an_unknown_one():
    harness.dist_autograd._is_valid_context(777)


@differs(
    "an error in a remote backward keeps its type and names the worker; torch's reaches the caller as a RuntimeError",
    "ValueError: ",
)
def an_error_in_a_remote_backward():
    a, _ = leaves()
    with harness.dist_autograd.context() as cid:
        y = harness.rpc.rpc_sync("w1", fails_in_backward, args=(a,))
        harness.dist_autograd.backward(cid, [y.sum()])


@scenario
def rref_backward_in_a_context():
    a, b = leaves()
    with harness.dist_autograd.context() as cid:
        rref = harness.rpc.remote("w1", torch.dot, args=(a, b))
        rref.backward(cid)
        return grads_of(cid, a, b)


@scenario
def rref_backward_locally_on_the_owner():
    a, b = leaves()
    rref = harness.rpc.RRef((a * b).sum())
    rref.backward()
    return rounded(a.grad), rounded(b.grad)


@scenario
def rref_backward_of_a_value_that_is_no_tensor():
    harness.rpc.RRef([1, 2]).backward()


@scenario
def distributed_optimizer_steps_each_owner():
    torch.manual_seed(0)
    remote_scale = harness.rpc.remote("w1", make_scale, args=(3,))
    local_weight = torch.nn.Parameter(torch.ones(3))
    params = [harness.rpc.rpc_sync("w1", weight_rref, args=(remote_scale,)), harness.rpc.RRef(local_weight)]
    opt = harness.DistributedOptimizer(torch.optim.SGD, params, lr=0.05)
    x = torch.arange(1.0, 4.0)
    for _ in range(3):
        with harness.dist_autograd.context() as cid:
            y = remote_scale.rpc_sync().forward(x) * local_weight
            harness.dist_autograd.backward(cid, [(y * y).sum()])
            opt.step(cid)
    return harness.rpc.rpc_sync("w1", weight_of, args=(remote_scale,)), rounded(local_weight), local_weight.grad


def weight_rref(module_rref):
    return harness.rpc.RRef(module_rref.local_value().weight)


@scenario
def distributed_optimizer_with_an_unknown_context():
    opt = harness.DistributedOptimizer(torch.optim.SGD, [harness.rpc.RRef(torch.nn.Parameter(torch.ones(2)))], lr=0.1)
    opt.step(4242)


@scenario
def remote_module_forward_and_parameters():
    torch.manual_seed(0)
    module = harness.RemoteModule("w2/cpu", torch.nn.Linear, args=(3, 2))
    x = torch.arange(6.0).reshape(2, 3)
    with harness.dist_autograd.context() as cid:
        y = module(x) + module.forward_async(x).wait()
        harness.dist_autograd.backward(cid, [y.sum()])
        params = module.remote_parameters()
        grads = harness.rpc.rpc_sync("w2", grads_on_owner_of, args=(cid, params))
    return grads, len(params), module.get_module_rref().owner_name()


def grads_on_owner_of(context_id, param_rrefs):
    grads = harness.dist_autograd.get_gradients(context_id)
    return [rounded(grads[p.local_value()]) for p in param_rrefs]


def forward_elsewhere(module, x):
    """Runs on another worker: a RemoteModule that came in an RPC."""
    return module(x).sum()


def forward_method_elsewhere(module, x):
    return module.forward(x).sum()


def _grads_through_a_passed_remote_module(use_it_there):
    """Pass a RemoteModule of a Linear on w2 to w1, which uses it (``use_it_there``): the
    caller's input gets the module's weight as its gradient."""
    torch.manual_seed(0)
    module = harness.RemoteModule("w2", torch.nn.Linear, kwargs={"in_features": 2, "out_features": 1})
    x = torch.ones(1, 2, requires_grad=True)
    with harness.dist_autograd.context() as cid:
        y = harness.rpc.rpc_sync("w1", use_it_there, args=(module, x))
        harness.dist_autograd.backward(cid, [y])
        return grads_of(cid, x)[0] == rounded(harness.rpc.rpc_sync("w2", weight_of_linear, args=(module.get_module_rref(),)))


def weight_of_linear(module_rref):
    return module_rref.local_value().weight.detach()


@scenario
def a_remote_module_passed_to_another_worker():
    return _grads_through_a_passed_remote_module(forward_method_elsewhere)


@differs(
    "a RemoteModule that came in an RPC can be called like any module; torch's lacks nn.Module's state "
    "there ('_backward_hooks'), so only its forward() works",
    "ok True",
)
def a_remote_module_passed_on_is_callable():
    return _grads_through_a_passed_remote_module(forward_elsewhere)


@scenario
def remote_module_parameters_is_not_supported():
    harness.RemoteModule("w1", torch.nn.Linear, args=(2, 2)).parameters()


@scenario
def remote_module_to_is_not_supported():
    harness.RemoteModule("w1", torch.nn.Linear, args=(2, 2)).to("cpu")


@scenario
def remote_module_pickled_outside_rpc():
    import pickle

    pickle.dumps(harness.RemoteModule("w1", torch.nn.Linear, args=(2, 2)))


@scenario
def is_available():
    return harness.dist_autograd.is_available()


@scenario
def remote_module_from_a_module_rref():
    torch.manual_seed(0)
    first = harness.RemoteModule("w1/cpu", torch.nn.Linear, args=(2, 1))
    second = harness.RemoteModule.init_from_module_rref("w1/cpu", first.get_module_rref())
    x = torch.ones(1, 2)
    return rounded(first(x).detach()) == rounded(second.forward(x).detach()), second.get_module_rref().owner_name()


@scenario
def remote_module_on_a_rank():
    module = harness.RemoteModule("rank:2/cpu", torch.nn.Linear, args=(2, 1))
    return module.get_module_rref().owner_name(), len(module.remote_parameters())


@scenario
def remote_module_with_a_bad_device():
    harness.RemoteModule("w1/nowhere:0", torch.nn.Linear, args=(2, 1))
