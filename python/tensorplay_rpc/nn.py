"""``RemoteModule``, as ``torch.distributed.nn.RemoteModule``: an ``nn.Module`` made and kept on
another worker, whose ``forward`` runs there.

    emb = RemoteModule("ps/cpu", torch.nn.EmbeddingBag, args=(100, 16), kwargs={"mode": "sum"})
    out = emb(indices, offsets)              # forward on "ps", gradients flow in a context
    params = emb.remote_parameters()         # RRefs, for DistributedOptimizer
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch
from torch import nn

from .api import remote, rpc_async, rpc_sync
from .futures import Future
from .internal import current_send_context
from .rref import RRef

__all__ = ["RemoteModule"]


def _parse_remote_device(remote_device: str) -> Tuple[Union[str, int], str]:
    """``"worker/device"`` or ``"rank:N/device"`` (the device optional, ``cpu`` by default) as
    (worker name or rank, device)."""
    if not isinstance(remote_device, str):
        raise TypeError(f"remote_device must be a string like 'worker1/cpu' or 'rank:1/cpu', got {type(remote_device).__name__}")
    worker, _, device = remote_device.partition("/")
    device = device or "cpu"
    if not worker or "/" in device:
        raise ValueError(f"Could not parse remote_device: {remote_device}. The valid format is '<workername>/<device>' or 'rank:<rank>/<device>'")
    kind = torch.device(device).type  # torch's own error for a device it does not know
    if kind != "cpu":
        raise ValueError(f"remote_device {remote_device!r}: this build of tensorplay_rpc supports only CPU devices")
    if worker.startswith("rank:"):
        rank = worker[len("rank:"):]
        if not rank.isdigit():
            raise ValueError(f"Could not parse remote_device: {remote_device}. The valid format is '<workername>/<device>' or 'rank:<rank>/<device>'")
        return int(rank), device
    return worker, device


def _create_module(module_cls: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], device: str) -> nn.Module:
    module = module_cls(*args, **kwargs)
    if not isinstance(module, nn.Module):
        raise ValueError(
            "Expect `module_cls(*args, **kwargs)` returns an instance of <class nn.Module>, "
            f"but it returns an instance of {type(module)}."
        )
    return module.to(device)


def _remote_forward(module_rref: RRef[nn.Module], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    return module_rref.local_value().forward(*args, **kwargs)


def _param_rrefs(module_rref: RRef[nn.Module], recurse: bool) -> List[RRef[nn.Parameter]]:
    return [RRef(param) for param in module_rref.local_value().parameters(recurse)]


def _rebuild_remote_module(on: Union[str, int], device: str, module_rref: RRef[nn.Module]) -> "RemoteModule":
    return RemoteModule._from_parts(on, device, module_rref)


def _raise_not_supported(name: str) -> Any:
    raise ValueError(f"Method ``{name}`` not supported for RemoteModule")


class RemoteModule(nn.Module):  # type: ignore[misc]  # torch is untyped here
    """A module made by ``module_cls(*args, **kwargs)`` on the worker ``remote_device`` names
    (``"worker_name/cpu"`` or ``"rank:N/cpu"``), used from here: ``forward`` (and calling it)
    runs the module's forward there and returns the result; ``forward_async`` returns a Future
    of it. Made inside a distributed autograd context, the calls are recorded, so gradients
    reach the module's parameters (in that context, on its owner).

    It can be passed to other workers in RPCs, and arrives as a RemoteModule of the same
    module. What would need the module here (``parameters()``, ``to()``, hooks, ``state_dict()``,
    …) raises ``ValueError``; ``train()`` and ``eval()`` act on the remote module.
    """

    on: Union[str, int]
    device: str
    module_rref: RRef[nn.Module]

    def __init__(self, remote_device: str, module_cls: Any, args: Optional[Tuple[Any, ...]] = None, kwargs: Optional[Dict[str, Any]] = None, _module_interface_cls: Any = None) -> None:
        super().__init__()
        if _module_interface_cls is not None:
            raise NotImplementedError("TorchScript module interfaces are not supported by tensorplay_rpc's RemoteModule")
        on, device = _parse_remote_device(remote_device)
        self.on, self.device = on, device
        self.module_rref = remote(on, _create_module, (module_cls, tuple(args or ()), dict(kwargs or {}), device))

    @classmethod
    def _from_parts(cls, on: Union[str, int], device: str, module_rref: RRef[nn.Module]) -> "RemoteModule":
        made = cls.__new__(cls)
        nn.Module.__init__(made)
        made.on, made.device, made.module_rref = on, device, module_rref
        return made

    @staticmethod
    def init_from_module_rref(remote_device: str, module_rref: RRef[nn.Module], _module_interface_cls: Any = None) -> "RemoteModule":
        """A RemoteModule of the module ``module_rref`` refers to, which ``remote_device``
        must name the owner of."""
        if _module_interface_cls is not None:
            raise NotImplementedError("TorchScript module interfaces are not supported by tensorplay_rpc's RemoteModule")
        on, device = _parse_remote_device(remote_device)
        return RemoteModule._from_parts(on, device, module_rref)

    def forward_async(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """A Future of the remote module's ``forward(*args, **kwargs)``."""
        return rpc_async(self.on, _remote_forward, args=(self.module_rref, args, kwargs))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The remote module's ``forward(*args, **kwargs)``, run on its worker."""
        return rpc_sync(self.on, _remote_forward, args=(self.module_rref, args, kwargs))

    def remote_parameters(self, recurse: bool = True) -> List[RRef[nn.Parameter]]:
        """RRefs to the remote module's parameters (with ``recurse``, its submodules' too), for
        :class:`~tensorplay_rpc.optim.DistributedOptimizer`."""
        params: List[RRef[nn.Parameter]] = rpc_sync(self.on, _param_rrefs, args=(self.module_rref, recurse))
        return params

    def get_module_rref(self) -> RRef[nn.Module]:
        """The RRef to the remote module."""
        return self.module_rref

    def __reduce__(self) -> Tuple[Any, Tuple[Union[str, int], str, RRef[nn.Module]]]:
        if current_send_context() is None:
            raise RuntimeError("Cannot pickle RemoteModule in python pickler. RemoteModule can only be pickled when using RPC")
        return _rebuild_remote_module, (self.on, self.device, self.module_rref)

    def train(self, mode: bool = True) -> "RemoteModule":
        """Set the remote module's training mode."""
        rpc_sync(self.on, _set_training, args=(self.module_rref, mode))
        return self

    def eval(self) -> "RemoteModule":
        """Put the remote module in evaluation mode."""
        return self.train(False)

    def extra_repr(self) -> str:
        return f"on={self.on!r}, device={self.device!r}"

    # What would need the module in this process.
    def register_buffer(self, *args: Any, **kwargs: Any) -> None:
        _raise_not_supported("register_buffer")

    def register_parameter(self, *args: Any, **kwargs: Any) -> None:
        _raise_not_supported("register_parameter")

    def add_module(self, *args: Any, **kwargs: Any) -> None:
        _raise_not_supported("add_module")

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("apply")

    def cuda(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("cuda")

    def ipu(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("ipu")

    def xpu(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("xpu")

    def cpu(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("cpu")

    def type(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("type")

    def float(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("float")

    def double(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("double")

    def half(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("half")

    def bfloat16(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("bfloat16")

    def to(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("to")

    def register_backward_hook(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("register_backward_hook")

    def register_full_backward_hook(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("register_full_backward_hook")

    def register_forward_pre_hook(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("register_forward_pre_hook")

    def register_forward_hook(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("register_forward_hook")

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("state_dict")

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("load_state_dict")

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        raise ValueError("Method ``parameters`` not supported for RemoteModule. Please use ``remote_parameters`` instead.")

    def named_parameters(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("named_parameters")

    def buffers(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("buffers")

    def named_buffers(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("named_buffers")

    def children(self) -> Any:
        _raise_not_supported("children")

    def named_children(self) -> Any:
        _raise_not_supported("named_children")

    def modules(self) -> Any:
        _raise_not_supported("modules")

    def named_modules(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("named_modules")

    def requires_grad_(self, *args: Any, **kwargs: Any) -> Any:
        _raise_not_supported("requires_grad_")

    def zero_grad(self, *args: Any, **kwargs: Any) -> None:
        _raise_not_supported("zero_grad")

    def share_memory(self) -> Any:
        _raise_not_supported("share_memory")


def _set_training(module_rref: RRef[nn.Module], mode: bool) -> None:
    module_rref.local_value().train(mode)
