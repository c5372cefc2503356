"""tensorplay_rpc: the ``tensorplay.distributed.rpc`` API on a Go agent.

Workers call functions on each other with :func:`rpc_sync` and :func:`rpc_async` after
:func:`init_rpc`; see the README for an example.
"""

from .api import (
    get_rpc_timeout,
    get_worker_info,
    init_rpc,
    is_available,
    rpc_async,
    rpc_sync,
    shutdown,
)
from .backend_registry import BackendType, BackendValue
from .futures import Future, collect_all, wait_all
from .options import RpcBackendOptions, TensorPipeRpcBackendOptions
from .worker_info import WorkerInfo

__all__ = [
    "BackendType",
    "BackendValue",
    "Future",
    "RpcBackendOptions",
    "TensorPipeRpcBackendOptions",
    "WorkerInfo",
    "collect_all",
    "get_rpc_timeout",
    "get_worker_info",
    "init_rpc",
    "is_available",
    "rpc_async",
    "rpc_sync",
    "shutdown",
    "wait_all",
]
