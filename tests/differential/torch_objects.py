"""torch objects as arguments and results (issue 16): views sharing storage, strides, dtypes,
requires_grad, sparse tensors, modules and optimizer state, torch.Size, dtypes and devices,
and a CUDA tensor asked of a worker without a GPU. Each scenario returns plain values
(lists, tuples, booleans) that describe what arrived, so the two backends compare exactly."""

import torch

import harness
from harness import differs, scenario


def shares_storage(a, b):
    return a.storage().data_ptr() == b.storage().data_ptr()


def views_arrive(pair):
    whole, part = pair
    # A write through one view is seen through the other only if they share storage.
    part[0, 0] = -1.0
    return shares_storage(whole, part), whole.tolist(), part.tolist(), part.stride()


def describe(t):
    return str(t.dtype), tuple(t.shape), t.stride(), t.is_contiguous(), t.requires_grad, t.detach().tolist()


def describe_all(ts):
    return [describe(t) for t in ts]


def describe_sparse(t):
    return t.is_sparse, str(t.dtype), tuple(t.shape), t.to_dense().tolist()


def module_outcome(module, x):
    with torch.no_grad():
        return [round(v, 5) for v in module(x).tolist()], [p.requires_grad for p in module.parameters()]


def optimizer_state(state):
    return sorted(state["param_groups"][0]), {k: [round(v, 5) for v in s["momentum_buffer"].flatten().tolist()] for k, s in state["state"].items()}


def view_pair():
    whole = torch.arange(12.0).reshape(3, 4)
    return whole, whole[1:]


def fixed_linear():
    linear = torch.nn.Linear(3, 2)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.0]]))
        linear.bias.copy_(torch.tensor([0.25, -0.5]))
    return linear


@scenario
def views_of_one_tensor_share_storage_on_arrival():
    whole = torch.arange(12.0).reshape(3, 4)
    return harness.rpc.rpc_sync("w1", views_arrive, args=((whole, whole[1:, 1:3]),))


@scenario
def views_in_a_result_share_storage_on_arrival():
    whole, part = harness.rpc.rpc_sync("w1", view_pair)
    part[0, 0] = -1.0
    return shares_storage(whole, part), whole.tolist()


@scenario
def non_contiguous_tensors_keep_their_strides():
    base = torch.arange(24.0).reshape(4, 6)
    return harness.rpc.rpc_sync("w1", describe_all, args=([base.t(), base[:, ::2], base[1:3, 2:5], torch.ones(1).expand(5)],))


@scenario
def dtypes_and_requires_grad_arrive_exactly():
    tensors = [
        torch.tensor([1.5, -2.25], dtype=torch.float16),
        torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
        torch.tensor([1e-300, 3.0], dtype=torch.float64),
        torch.tensor([-128, 127], dtype=torch.int8),
        torch.tensor([True, False]),
        torch.tensor([1 + 2j], dtype=torch.complex64),
        torch.tensor([0.5, 1.5], requires_grad=True),
        torch.empty(0, 3),
    ]
    return harness.rpc.rpc_sync("w1", describe_all, args=(tensors,))


@scenario
def sparse_tensors_arrive():
    sparse = torch.sparse_coo_tensor([[0, 2], [1, 0]], [3.0, 4.0], (3, 2))
    return harness.rpc.rpc_sync("w1", describe_sparse, args=(sparse,))


@scenario
def size_dtype_and_device_objects_arrive():
    back = harness.rpc.rpc_sync("w1", tuple, args=((torch.Size([2, 3]), torch.float16, torch.device("cpu")),))
    return [(type(v).__name__, str(v)) for v in back]


@scenario
def a_module_arrives_with_its_parameters():
    return harness.rpc.rpc_sync("w1", module_outcome, args=(fixed_linear(), torch.tensor([1.0, 1.0, 1.0])))


@scenario
def optimizer_state_arrives():
    linear = fixed_linear()
    optimizer = torch.optim.SGD(linear.parameters(), lr=0.1, momentum=0.9)
    linear(torch.ones(3)).sum().backward()
    optimizer.step()
    return harness.rpc.rpc_sync("w1", optimizer_state, args=(optimizer.state_dict(),))


def on_cuda():
    return torch.ones(2, device="cuda")


@differs(
    "the message is torch's, word for word; torch turns every remote exception but ValueError and TypeError into a RuntimeError, we keep the type (docs/migration.md)",
    "AssertionError: AssertionError: On WorkerInfo(id=1, name=w1):\\nAssertionError('Torch not compiled with CUDA enabled')",
)
def a_cuda_tensor_on_a_worker_without_a_gpu_fails_with_torchs_message():
    return harness.rpc.rpc_sync("w1", on_cuda)
