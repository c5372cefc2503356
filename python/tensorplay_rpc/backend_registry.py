"""The RPC backends init_rpc can use, and registering new ones."""

from __future__ import annotations

import collections
import enum
from typing import Any, Callable, List, Optional

from . import constants
from ._agent import TensorPipeAgent, start_agent
from .options import RpcBackendOptions, TensorPipeRpcBackendOptions

__all__ = [
    "BackendType",
    "BackendValue",
    "backend_registered",
    "construct_rpc_backend_options",
    "init_backend",
    "register_backend",
]

BackendValue = collections.namedtuple(
    "BackendValue", ["construct_rpc_backend_options_handler", "init_backend_handler"]
)
BackendValue.__doc__ = "A backend's two handlers: one builds its options, one starts its agent."


def _tensorpipe_construct_rpc_backend_options_handler(
    rpc_timeout: float,
    init_method: str,
    num_worker_threads: int = constants.DEFAULT_NUM_WORKER_THREADS,
    _transports: Optional[List[str]] = None,
    _channels: Optional[List[str]] = None,
    **kwargs: Any,
) -> TensorPipeRpcBackendOptions:
    return TensorPipeRpcBackendOptions(
        rpc_timeout=rpc_timeout,
        init_method=init_method,
        num_worker_threads=num_worker_threads,
        _transports=_transports,
        _channels=_channels,
    )


def _tensorpipe_init_backend_handler(
    store: str, name: str, rank: int, world_size: int, rpc_backend_options: RpcBackendOptions
) -> TensorPipeAgent:
    """Start the Go agent: ``store`` is the rendezvous URL (``tcp://host:port`` or
    ``file:///path``). Returns the agent, not yet serving."""
    if not isinstance(rpc_backend_options, TensorPipeRpcBackendOptions):
        raise TypeError(
            f"TENSORPIPE backend needs TensorPipeRpcBackendOptions, got {type(rpc_backend_options).__name__}"
        )
    rpc_backend_options._check_devices()
    return start_agent(store, name, rank, world_size, rpc_backend_options)


class BackendType(enum.Enum):
    """The registered RPC backends; TENSORPIPE is built in. :func:`register_backend` adds
    members to this same class."""

    TENSORPIPE = BackendValue(_tensorpipe_construct_rpc_backend_options_handler, _tensorpipe_init_backend_handler)

    def __repr__(self) -> str:
        return f"BackendType.{self.name}"


def backend_registered(backend_name: str) -> bool:
    """Whether a backend of that name is registered."""
    return backend_name in BackendType.__members__


def register_backend(
    backend_name: str,
    construct_rpc_backend_options_handler: Callable[..., Any],
    init_backend_handler: Callable[..., Any],
) -> BackendType:
    """Register a backend and return its new :class:`BackendType` member.

    ``construct_rpc_backend_options_handler(rpc_timeout, init_method, **kwargs)`` builds its
    options; ``init_backend_handler(store, name, rank, world_size, rpc_backend_options)``
    starts it and returns its agent.
    """
    if backend_registered(backend_name):
        raise RuntimeError(f"RPC backend {backend_name}: already registered")
    value = BackendValue(construct_rpc_backend_options_handler, init_backend_handler)
    # Extend the class in place, so every existing reference to BackendType sees the member.
    member = object.__new__(BackendType)
    member._name_ = backend_name
    member._value_ = value
    setattr(member, "__objclass__", BackendType)  # as enum sets it; typeshed's Enum lacks it
    BackendType._member_names_.append(backend_name)
    BackendType._member_map_[backend_name] = member
    BackendType._value2member_map_[value] = member
    type.__setattr__(BackendType, backend_name, member)
    return member


def construct_rpc_backend_options(
    backend: BackendType,
    rpc_timeout: float = constants.DEFAULT_RPC_TIMEOUT_SEC,
    init_method: str = constants.DEFAULT_INIT_METHOD,
    **kwargs: Any,
) -> RpcBackendOptions:
    """Build the default options object of ``backend``."""
    options: RpcBackendOptions = backend.value.construct_rpc_backend_options_handler(rpc_timeout, init_method, **kwargs)
    return options


def init_backend(backend: BackendType, *args: Any, **kwargs: Any) -> TensorPipeAgent:
    """Start ``backend``'s agent with its init handler and return it."""
    # The package drives every agent through TensorPipeAgent's methods (api, rref).
    agent: TensorPipeAgent = backend.value.init_backend_handler(*args, **kwargs)
    return agent
