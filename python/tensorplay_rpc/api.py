"""The public RPC calls: init_rpc, shutdown, rpc_sync, rpc_async and worker look-ups."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, Optional, Tuple, Union
from urllib.parse import parse_qs, urlparse

from . import constants
from ._agent import CALL, PythonAgent
from ._native import pybind as _native
from .backend_registry import BackendType
from .futures import Future
from .options import RpcBackendOptions, TensorPipeRpcBackendOptions
from .worker_info import WorkerInfo

logger = logging.getLogger(__name__)

Destination = Union[str, int, WorkerInfo]

_agent_lock = threading.Lock()
_agent: Optional[PythonAgent] = None


def _require_agent() -> PythonAgent:
    agent = _agent
    if agent is None:
        raise RuntimeError("RPC has not been initialized. Call tensorplay_rpc.init_rpc first.")
    return agent


def _env_rendezvous_error(var: str) -> ValueError:
    return ValueError(
        f"Error initializing tensorplay_rpc using env:// rendezvous: environment variable {var} expected, but not set"
    )


def _rendezvous_args(init_method: str, rank: int, world_size: Optional[int]) -> Tuple[str, int, int]:
    """Fill in rank and world_size as torch's rendezvous does: from the environment for
    ``env://``, from the URL's query for ``tcp://``. Returns the store's ``tcp://`` URL too:
    the Go runtime sees only the environment the process started with, not later changes to
    ``os.environ``, so ``env://`` is resolved here."""
    url = urlparse(init_method)
    if url.scheme == "env":
        if rank == -1:
            if "RANK" not in os.environ:
                raise _env_rendezvous_error("RANK")
            rank = int(os.environ["RANK"])
        if world_size is None:
            if "WORLD_SIZE" not in os.environ:
                raise _env_rendezvous_error("WORLD_SIZE")
            world_size = int(os.environ["WORLD_SIZE"])
        for var in ("MASTER_ADDR", "MASTER_PORT"):
            if not os.environ.get(var):
                raise _env_rendezvous_error(var)
        host = os.environ["MASTER_ADDR"]
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        init_method = f"tcp://{host}:{os.environ['MASTER_PORT']}"
    elif url.scheme == "tcp":
        query = parse_qs(url.query)
        if rank == -1 and "rank" in query:
            rank = int(query["rank"][0])
        if world_size is None and "world_size" in query:
            world_size = int(query["world_size"][0])
        if rank == -1:
            raise ValueError(f"rank parameter missing: pass rank= or add ?rank= to {init_method}")
    else:
        raise ValueError(f"init_method {init_method!r} is not supported: use env:// or tcp://host:port")
    if world_size is None:
        raise ValueError("world_size must be given (dynamic world membership is not supported)")
    return init_method, int(rank), int(world_size)


def _check_devices(options: TensorPipeRpcBackendOptions) -> None:
    """This build moves no accelerator memory: refuse any device other than the CPU."""

    def is_cpu(device: Any) -> bool:
        return str(device) == "cpu"

    bad = [d for d in options.devices if not is_cpu(d)]
    for dest, mapping in options.device_maps.items():
        bad += [f"{dest}: {k}->{v}" for k, v in mapping.items() if not (is_cpu(k) and is_cpu(v))]
    if bad:
        raise ValueError(
            f"tensorplay_rpc was built without accelerator support; these devices cannot be used: {bad}"
        )


def init_rpc(
    name: str,
    backend: Optional[BackendType] = None,
    rank: int = -1,
    world_size: Optional[int] = None,
    rpc_backend_options: Optional[RpcBackendOptions] = None,
) -> None:
    """Join the RPC world as worker ``name`` and return once every worker has joined.

    Args:
        name: this worker's unique name (letters, digits, ``_``, ``-`` and ``:``).
        backend: a member of :class:`BackendType`; TENSORPIPE by default.
        rank: this worker's rank, from 0 to ``world_size - 1`` (default: ``$RANK``).
        world_size: number of workers (default: ``$WORLD_SIZE``).
        rpc_backend_options: a :class:`TensorPipeRpcBackendOptions`.
    """
    global _agent
    if backend is not None and not isinstance(backend, BackendType):
        raise TypeError("Argument backend must be a member of BackendType")
    if rpc_backend_options is not None and not isinstance(rpc_backend_options, RpcBackendOptions):
        raise TypeError("Argument rpc_backend_options must be an instance of RpcBackendOptions")
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    options = rpc_backend_options or TensorPipeRpcBackendOptions()
    if not isinstance(options, TensorPipeRpcBackendOptions):
        options = TensorPipeRpcBackendOptions(rpc_timeout=options.rpc_timeout, init_method=options.init_method)
    with _agent_lock:
        if _agent is not None:
            raise RuntimeError("RPC is already initialized")
        _check_devices(options)
        store_url, rank, world_size = _rendezvous_args(options.init_method, rank, world_size)
        init_timeout = options.rpc_timeout if options.rpc_timeout > 0 else constants.DEFAULT_RPC_TIMEOUT_SEC
        native = _native.Start(name, rank, world_size, store_url, int(init_timeout * 1000))
        _agent = PythonAgent(native, options.num_worker_threads, options.rpc_timeout)
        _agent.start()
    logger.debug("RPC agent %s joined a world of %d", name, world_size)


def shutdown(graceful: bool = True, timeout: float = constants.DEFAULT_SHUTDOWN_TIMEOUT) -> None:
    """Leave the RPC world.

    A graceful shutdown waits until every worker has called shutdown and no calls are in
    flight anywhere (at most ``timeout`` seconds if positive). A non-graceful one returns at
    once and fails this worker's pending calls.
    """
    global _agent
    agent = _require_agent()
    try:
        agent.shutdown(graceful, timeout)
    finally:
        with _agent_lock:
            if _agent is agent:
                _agent = None


def get_worker_info(worker_name: Optional[str] = None) -> WorkerInfo:
    """The :class:`WorkerInfo` of worker ``worker_name``, or of this worker."""
    agent = _require_agent()
    if worker_name is None:
        return agent.info
    return _destination(agent, worker_name)


def get_rpc_timeout() -> float:
    """The default timeout of calls, in seconds, as set in the backend options."""
    return _require_agent().rpc_timeout


def is_available() -> bool:
    """Whether RPC is built into this package (always True)."""
    return True


def _destination(agent: PythonAgent, to: Destination) -> WorkerInfo:
    me = agent.info
    if isinstance(to, WorkerInfo):
        found = agent.worker(to.name)
        if found is None or found.id != to.id:
            raise RuntimeError(f"name:{me.name},rank:{me.id} could not find destination {to}")
        return found
    if isinstance(to, str):
        found = agent.worker(to)
        if found is None:
            raise RuntimeError(f"name:{me.name},rank:{me.id} could not find destination name {to}")
        return found
    if isinstance(to, int) and not isinstance(to, bool):
        if not 0 <= to < len(agent.workers):
            raise RuntimeError(f"name:{me.name},rank:{me.id} could not find destination id {to}")
        return agent.workers[to]
    raise TypeError(f"to must be a worker name, id or WorkerInfo, got {type(to).__name__}")


def _send_call(
    to: Destination, func: Callable[..., Any], args: Optional[tuple], kwargs: Optional[dict], timeout: float, notify: bool
) -> Future:
    agent = _require_agent()
    if not callable(func):
        raise TypeError("function should be callable.")
    dest = _destination(agent, to)
    if timeout < 0:
        timeout = agent.rpc_timeout
    return agent.send(dest, (CALL, func, tuple(args or ()), dict(kwargs or {})), timeout, notify)


def rpc_async(
    to: Destination,
    func: Callable[..., Any],
    args: Optional[tuple] = None,
    kwargs: Optional[dict] = None,
    timeout: float = constants.UNSET_RPC_TIMEOUT,
) -> Future:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return a :class:`Future` of its
    result at once.

    ``timeout`` is in seconds: -1 uses the agent's rpc_timeout, 0 means no timeout.
    """
    return _send_call(to, func, args, kwargs, timeout, notify=True)


def rpc_sync(
    to: Destination,
    func: Callable[..., Any],
    args: Optional[tuple] = None,
    kwargs: Optional[dict] = None,
    timeout: float = constants.UNSET_RPC_TIMEOUT,
) -> Any:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return its result.

    ``timeout`` is in seconds: -1 uses the agent's rpc_timeout, 0 means no timeout. An
    exception raised by ``func`` is raised here with the remote traceback in its message.
    """
    return _send_call(to, func, args, kwargs, timeout, notify=False).wait()
