"""tensorplay_rpc: the ``tensorplay.distributed.rpc`` API on a Go agent.

Workers call functions on each other with :func:`rpc_sync`, :func:`rpc_async` and
:func:`remote` after :func:`init_rpc`; see the README (and docs/getting-started.md) for an example.

This module only re-exports. Modules import each other in one direction, all at module top
(docs/ARCHITECTURE.md, "Python package")::

    api ──> backend_registry ──> _agent ──> _native (Go; only _agent, _call_future, _go_logs and _interrupts call it)
     │                            ^  │
     └──> rref ──> rref_proxy ────┘  ├──> _owner_table, internal, _buffers
                                     └──> crosslang, functions, futures, options, worker_info, constants
"""

from . import functions
from ._agent import RpcAgent, TensorPipeAgent
from .api import (
    AllGatherStates,
    _get_current_rpc_agent,
    _get_debug_info,
    _is_current_rpc_agent_set,
    _set_rpc_timeout,
    get_rpc_timeout,
    get_worker_info,
    init_rpc,
    is_available,
    metrics,
    metrics_address,
    remote,
    rpc_async,
    rpc_sync,
    shutdown,
)
from .backend_registry import (
    BackendType,
    BackendValue,
    backend_registered,
    construct_rpc_backend_options,
    init_backend,
    register_backend,
)
from .crosslang import RemoteFunction, expose, expose_imports, remote_function
from .constants import DEFAULT_INIT_METHOD as _DEFAULT_INIT_METHOD
from .constants import DEFAULT_NUM_WORKER_THREADS as _DEFAULT_NUM_WORKER_THREADS
from .constants import DEFAULT_RPC_TIMEOUT_SEC as _DEFAULT_RPC_TIMEOUT_SEC
from .constants import UNSET_RPC_TIMEOUT as _UNSET_RPC_TIMEOUT
from .futures import Future, collect_all, wait_all
from .options import RpcBackendOptions, TensorPipeRpcBackendOptions
from .rref import PyRRef, RRef, method_factory, new_method
from .version import __version__
from .worker_info import WorkerInfo

__all__ = [
    "AllGatherStates",
    "BackendType",
    "BackendValue",
    "Future",
    "PyRRef",
    "RemoteFunction",
    "RRef",
    "RpcAgent",
    "RpcBackendOptions",
    "TensorPipeAgent",
    "TensorPipeRpcBackendOptions",
    "WorkerInfo",
    "__version__",
    "backend_registered",
    "collect_all",
    "construct_rpc_backend_options",
    "expose",
    "expose_imports",
    "functions",
    "get_rpc_timeout",
    "get_worker_info",
    "init_backend",
    "init_rpc",
    "is_available",
    "method_factory",
    "metrics",
    "metrics_address",
    "new_method",
    "register_backend",
    "remote",
    "remote_function",
    "rpc_async",
    "rpc_sync",
    "shutdown",
    "wait_all",
]
