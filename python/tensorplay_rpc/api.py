"""The public RPC calls: init_rpc, shutdown, rpc_sync, rpc_async, remote, worker look-ups and
the all-gather helpers."""

from __future__ import annotations

import contextlib
import logging
import numbers
import os
import re
import threading
import time
from typing import Any, Callable, Dict, Optional, Set, Tuple, Union
from urllib.parse import parse_qs, urlparse

from . import backend_registry, constants
from ._agent import TensorPipeAgent, collect_for_wait_all, current_agent, current_agent_or_not_set, function_call, install_agent, require_agent, wait_all_on_exit
from .constants import DEFAULT_SHUTDOWN_TIMEOUT, UNSET_RPC_TIMEOUT
from .crosslang import RemoteFunction
from .backend_registry import BackendType
from .futures import Future, use_torch_futures
from .options import RpcBackendOptions
from .rref import RRef, remote_function_rref, remote_rref
from .worker_info import WorkerInfo

__all__ = [
    "AllGatherStates",
    "DYNAMIC_WORLD",
    "Destination",
    "cluster_env",
    "get_rpc_timeout",
    "get_worker_info",
    "init_rpc",
    "is_available",
    "metrics",
    "metrics_address",
    "remote",
    "rpc_async",
    "rpc_sync",
    "shutdown",
    "slurm_first_host",
]

logger = logging.getLogger(__name__)

Destination = Union[str, int, WorkerInfo]

_init_lock = threading.Lock()


def _env_rendezvous_error(var: str) -> ValueError:
    return ValueError(
        f"Error initializing tensorplay_rpc using env:// rendezvous: environment variable {var} expected, but not set"
    )


# The world size the Go agent takes for a dynamic world (torch's world_size=None).
DYNAMIC_WORLD = 0


def slurm_first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``node[07-09,12],gpu1`` gives ``node07``."""
    first = ""
    depth = 0
    for ch in nodelist:  # the first entry: up to a comma outside brackets
        if ch == "," and depth == 0:
            break
        depth += {"[": 1, "]": -1}.get(ch, 0)
        first += ch
    # Every bracket group gives its first item: rack[1-2]-node[01-04] is rack1-node01.
    return re.sub(r"\[([^\]]*)\]", lambda m: m.group(1).split(",")[0].split("-")[0], first)


def cluster_env(env: "os._Environ[str] | Dict[str, str]") -> Dict[str, str]:
    """``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``MASTER_ADDR`` as torchrun sets them, from
    the first launcher whose variables are there: torchrun's own (or tensorplay_rpc.run's),
    then Slurm's (``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, the first host of the
    job's node list), then Open MPI's (``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``,
    ``OMPI_COMM_WORLD_LOCAL_RANK``). A ``MASTER_ADDR`` that is set is kept."""
    found: Dict[str, str] = {}
    if "RANK" in env:
        found = {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k in env}
    elif "SLURM_PROCID" in env:
        found = {"RANK": env["SLURM_PROCID"]}
        for ours, theirs in (("WORLD_SIZE", "SLURM_NTASKS"), ("LOCAL_RANK", "SLURM_LOCALID")):
            if theirs in env:
                found[ours] = env[theirs]
        # The step's own nodes first: a step may run on some of the job's only.
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if nodelist:
            found["MASTER_ADDR"] = slurm_first_host(nodelist)
    elif "OMPI_COMM_WORLD_RANK" in env:
        found = {"RANK": env["OMPI_COMM_WORLD_RANK"]}
        for ours, theirs in (("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"), ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")):
            if theirs in env:
                found[ours] = env[theirs]
    if env.get("MASTER_ADDR"):
        found["MASTER_ADDR"] = env["MASTER_ADDR"]
    return found


def _rendezvous_args(init_method: str, rank: int, world_size: Optional[int]) -> Tuple[str, int, int]:
    """Fill in rank and world_size as torch's rendezvous does: from the environment for
    ``env://``, from the URL's query for ``tcp://`` and ``file://``; a world size found
    nowhere makes a dynamic world (``DYNAMIC_WORLD``). Returns the store URL the Go agent uses
    too: the Go runtime sees only the environment the process started with, not later changes
    to ``os.environ``, so ``env://`` is resolved here."""
    url = urlparse(init_method)
    if url.scheme == "env":
        cluster = cluster_env(os.environ)
        if rank == -1:
            if "RANK" not in cluster:
                raise _env_rendezvous_error("RANK")
            rank = int(cluster["RANK"])
        if world_size is None and "WORLD_SIZE" in cluster:
            world_size = int(cluster["WORLD_SIZE"])
        if not cluster.get("MASTER_ADDR"):
            raise _env_rendezvous_error("MASTER_ADDR")
        if not os.environ.get("MASTER_PORT"):
            raise _env_rendezvous_error("MASTER_PORT")
        host = cluster["MASTER_ADDR"]
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        store = f"tcp://{host}:{os.environ['MASTER_PORT']}"
    elif url.scheme in ("tcp", "file"):
        query = parse_qs(url.query)
        if rank == -1 and "rank" in query:
            rank = int(query["rank"][0])
        if world_size is None and "world_size" in query:
            world_size = int(query["world_size"][0])
        if rank == -1:
            raise ValueError(f"rank parameter missing: pass rank= or add ?rank= to {init_method}")
        store = url._replace(query="").geturl()
    else:
        raise ValueError(f"init_method {init_method!r} is not supported: use env://, tcp://host:port or file:///path")
    # As torch's rendezvous: a rank of 1.7 is refused, not rounded.
    if not isinstance(rank, numbers.Integral):
        raise RuntimeError(f"`rank` must be an integer. {rank}")
    if world_size is None:
        if url.scheme == "file":
            raise ValueError(
                f"a dynamic world (world_size=None) needs a tcp:// or env:// init_method, whose rank 0 "
                f"holds the membership; {init_method} names a file"
            )
        if rank < 0:
            raise ValueError(f"rank must be 0 or more, got {rank}")
        return store, int(rank), DYNAMIC_WORLD
    if not isinstance(world_size, numbers.Integral):
        raise RuntimeError(f"`world_size` must be an integer. {world_size}")
    return store, int(rank), int(world_size)


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
        rank: this worker's rank, from 0 to ``world_size - 1`` (default: ``$RANK``); in a
            dynamic world any rank no member holds.
        world_size: number of workers (default: ``$WORLD_SIZE``, or the ``world_size`` of a
            ``tcp://`` URL's query). None with neither makes a dynamic world, as torch's:
            workers join one at a time and leave with :func:`shutdown`, which then waits for
            this worker's own calls only. Its rank 0 holds the membership (a ``tcp://`` or
            ``env://`` init_method) and should leave last.
        rpc_backend_options: the backend's options, e.g. :class:`TensorPipeRpcBackendOptions`.
    """
    if backend is not None and not isinstance(backend, BackendType):
        raise TypeError("Argument backend must be a member of BackendType")
    if rpc_backend_options is not None and not isinstance(rpc_backend_options, RpcBackendOptions):
        raise TypeError("Argument rpc_backend_options must be an instance of RpcBackendOptions")
    if not isinstance(name, str):
        raise RuntimeError(f"Argument {name} must be of type {str} but got type {type(name)}")
    WorkerInfo(name, 0)  # the name's rules, checked (and worded) as torch's WorkerInfo does
    if backend is None:
        backend = BackendType.TENSORPIPE
    if rpc_backend_options is None:
        rpc_backend_options = backend_registry.construct_rpc_backend_options(backend)
    with _init_lock:
        if current_agent() is not None:
            raise RuntimeError("RPC is already initialized")
        use_torch_futures()  # a program that uses torch gets torch futures from here on
        store, rank, world_size = _rendezvous_args(rpc_backend_options.init_method, rank, world_size)
        agent = backend_registry.init_backend(
            backend, store=store, name=name, rank=rank, world_size=world_size, rpc_backend_options=rpc_backend_options
        )
        install_agent(agent)
        try:
            agent.start()
        except BaseException:  # leave no half-started worker behind: init_rpc may be called again
            install_agent(None, expected=agent)
            agent.shutdown(graceful=False, timeout=0)
            raise
    logger.debug("RPC agent %s joined a world of %s", name, world_size or "dynamic membership")


def shutdown(graceful: bool = True, timeout: float = constants.DEFAULT_SHUTDOWN_TIMEOUT) -> None:
    """Leave the RPC world.

    A graceful shutdown is a barrier: it returns once every worker has called shutdown and no
    calls are in flight anywhere. With a positive ``timeout`` it waits at most that many seconds,
    then leaves without the workers that did not come (a warning names them), as torch's does. A
    non-graceful one returns at once and fails this worker's pending calls. Afterwards every
    call raises. In a dynamic world (``world_size=None``) there is no barrier: this worker
    waits for its own calls (if graceful), then leaves, and every other worker hears of it.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        # Checked before anything changes: the agent stays up and installed.
        raise TypeError(f"shutdown(): timeout must be a number of seconds, got {type(timeout).__name__}")
    agent = require_agent()
    try:
        agent.shutdown(bool(graceful), timeout)
    finally:
        install_agent(None, expected=agent)


def get_worker_info(worker_name: Optional[str] = None) -> WorkerInfo:
    """The :class:`WorkerInfo` of worker ``worker_name``, or of this worker."""
    return require_agent().get_worker_info(worker_name)


def get_rpc_timeout() -> float:
    """The default timeout of calls, in seconds, as set in the backend options."""
    return _get_current_rpc_agent().rpc_timeout


def _set_rpc_timeout(rpc_timeout: float) -> None:
    """Set the default timeout of calls, in seconds (torch's private helper)."""
    _get_current_rpc_agent().rpc_timeout = float(rpc_timeout)


def _get_current_rpc_agent() -> TensorPipeAgent:
    """This process's agent (torch's private accessor); raises before ``init_rpc``."""
    return current_agent_or_not_set()


def _is_current_rpc_agent_set() -> bool:
    """Whether ``init_rpc`` has run and ``shutdown`` has not."""
    return current_agent() is not None


def metrics() -> Dict[str, Any]:
    """A snapshot of this worker's traffic and memory: ``peers``, one dict per worker of the
    world (``name``, ``id``, ``calls_sent``, ``calls_served``, ``bytes_sent``,
    ``bytes_received``, ``in_flight``, ``calls_waiting`` (its calls read here that wait for
    a slot: it has the most in service at once), ``errors`` by kind: remote, timeout, peer_lost,
    canceled, other; ``latency_us``: upper bounds of p50, p90 and p99 of the calls made to
    it), then ``outstanding`` (calls not complete), ``receive_bytes_in_use`` and
    ``receive_budget`` (big messages being received), ``owned_rrefs``, ``lent_messages``
    (received buffers Python still uses in place) and ``pending_futures``."""
    return require_agent().metrics()


def metrics_address() -> Optional[str]:
    """``host:port`` of this worker's Prometheus endpoint (``/metrics``), served when the
    environment variable ``TENSORPLAY_RPC_METRICS_PORT`` is set; None when it is not."""
    return require_agent().metrics_address


def _get_debug_info() -> Dict[str, str]:
    """This worker's counters, by name, as strings (see :meth:`RpcAgent.get_debug_info`)."""
    return _get_current_rpc_agent().get_debug_info()


def _to_worker_info(to: Destination) -> WorkerInfo:
    """The WorkerInfo ``to`` names: a WorkerInfo as it is, a name or a rank looked up."""
    if isinstance(to, WorkerInfo):
        return to
    if isinstance(to, (str, int)):
        return require_agent().get_worker_info(to)  # what get_worker_info does, for an id too
    raise ValueError(f"Cannot get WorkerInfo from name {to}")


def _wait_all() -> "contextlib.AbstractContextManager[None]":
    """A context manager that waits, on exit, for every future ``rpc_async`` (or an RRef's
    ``rpc_async()`` proxy) returned on this thread inside it (torch's private helper)."""
    return wait_all_on_exit()


def _wait_all_workers(timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
    """Block until every worker has reached this call (an all-gather of nothing)."""
    _all_gather(None, timeout=timeout)


def is_available() -> bool:
    """Whether RPC is built into this package (always True)."""
    return True


def rpc_async(
    to: Destination,
    func: Union[Callable[..., Any], RemoteFunction],
    args: Optional[Tuple[Any, ...]] = None,
    kwargs: Optional[Dict[str, Any]] = None,
    timeout: float = constants.UNSET_RPC_TIMEOUT,
) -> Future[Any]:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return a :class:`Future` of its
    result at once.

    ``timeout`` is in seconds: -1 uses the agent's rpc_timeout, 0 means no timeout.
    """
    agent = require_agent()
    if isinstance(func, RemoteFunction):
        fut = agent.call_function(agent.destination(to), func, args, kwargs, timeout)
    else:
        fut = agent.rpc_async(agent.destination(to), function_call(func, args, kwargs), timeout)
    collect_for_wait_all(fut)
    return fut


def rpc_sync(
    to: Destination,
    func: Union[Callable[..., Any], RemoteFunction],
    args: Optional[Tuple[Any, ...]] = None,
    kwargs: Optional[Dict[str, Any]] = None,
    timeout: float = constants.UNSET_RPC_TIMEOUT,
) -> Any:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return its result.

    ``timeout`` is in seconds: -1 uses the agent's rpc_timeout, 0 means no timeout. An
    exception raised by ``func`` is raised here with the remote traceback in its message.
    """
    agent = require_agent()
    if isinstance(func, RemoteFunction):
        return agent.call_function(agent.destination(to), func, args, kwargs, timeout, internal=True).wait()
    return agent.rpc_sync(agent.destination(to), function_call(func, args, kwargs), timeout)


def remote(
    to: Destination,
    func: Union[Callable[..., Any], RemoteFunction],
    args: Optional[Tuple[Any, ...]] = None,
    kwargs: Optional[Dict[str, Any]] = None,
    timeout: float = constants.UNSET_RPC_TIMEOUT,
) -> RRef[Any]:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return at once an :class:`RRef` to
    the result, which is kept on ``to`` (its owner).

    An error raised by ``func`` is raised by ``to_here()`` and the RRef's proxies. ``timeout``
    bounds the creation: if it passes, ``to_here()`` raises a timeout error.
    """
    agent = require_agent()
    if isinstance(func, RemoteFunction):
        return remote_function_rref(agent, agent.destination(to), func, args, kwargs, timeout)
    return remote_rref(agent, agent.destination(to), function_call(func, args, kwargs), timeout)


class AllGatherStates:
    """One all-gather round on one worker: the objects gathered so far, by worker name, and
    the event set once they are all there."""

    def __init__(self) -> None:
        self.gathered_objects: Dict[str, Any] = {}
        self.proceed_signal = threading.Event()


_all_gather_lock = threading.Lock()
_all_gather_rounds: Dict[str, int] = {}
_all_gather_states: Dict[str, AllGatherStates] = {}


def _states(round_id: str) -> AllGatherStates:
    states = _all_gather_states.get(round_id)
    if states is None:
        states = _all_gather_states[round_id] = AllGatherStates()
    return states


def _gather_to_leader(round_id: str, worker_name: str, obj: Any, worker_names: Set[str]) -> None:
    """Runs on the leader: record one worker's object."""
    with _all_gather_lock:
        states = _states(round_id)
        if worker_name in states.gathered_objects:
            raise RuntimeError(f"worker {worker_name} joined all-gather round {round_id} twice")
        states.gathered_objects[worker_name] = obj
        if set(states.gathered_objects) == set(worker_names):
            states.proceed_signal.set()


def _broadcast_to_followers(round_id: str, objects: Dict[str, Any]) -> None:
    """Runs on each follower: the leader's complete result."""
    with _all_gather_lock:
        states = _states(round_id)
        states.gathered_objects = objects
        states.proceed_signal.set()


def _all_gather(obj: Any, worker_names: Optional[Set[str]] = None, timeout: float = constants.UNSET_RPC_TIMEOUT) -> Dict[str, Any]:
    """Gather ``obj`` from every worker of ``worker_names`` (default: the whole world); every
    one of them gets the same dict of worker name to object. The worker whose name sorts first
    leads."""
    agent = require_agent()
    names = set(worker_names) if worker_names else {w.name for w in agent.get_worker_infos()}
    me = agent.info.name
    if me not in names:
        raise ValueError(f"worker {me} is not among the workers of the all-gather: {sorted(names)}")
    leader = min(names)
    if timeout == constants.UNSET_RPC_TIMEOUT:
        timeout = agent.rpc_timeout
    # One deadline for the whole round, not one per step.
    deadline = time.monotonic() + timeout if timeout > 0 else None
    with _all_gather_lock:
        key = ",".join(sorted(names))
        round_id = f"{key}#{_all_gather_rounds.get(key, 0)}"
        _all_gather_rounds[key] = _all_gather_rounds.get(key, 0) + 1
    if me == leader:
        _gather_to_leader(round_id, me, obj, names)
    else:
        rpc_sync(leader, _gather_to_leader, args=(round_id, me, obj, names), timeout=timeout)
    with _all_gather_lock:
        states = _states(round_id)
    if not states.proceed_signal.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
        with _all_gather_lock:
            _all_gather_states.pop(round_id, None)
        raise RuntimeError(f"all-gather round {round_id} timed out after {timeout}s on worker {me}")
    if me == leader:
        futures = [
            rpc_async(name, _broadcast_to_followers, args=(round_id, states.gathered_objects), timeout=0 if deadline is None else max(0.001, deadline - time.monotonic()))
            for name in sorted(names - {leader})
        ]
        errors = []
        for name, fut in zip(sorted(names - {leader}), futures):
            try:
                fut.wait()
            except Exception as exc:
                errors.append(f"{name}: {exc}")
        if errors:
            raise RuntimeError(f"all-gather round {round_id} could not reach every follower: {errors}")
    with _all_gather_lock:
        _all_gather_states.pop(round_id, None)
    return states.gathered_objects


def _barrier(worker_names: Set[str]) -> None:
    """Wait until every worker of ``worker_names`` has reached this barrier."""
    _all_gather(None, set(worker_names))


def _owned_rref_count() -> Tuple[int, int]:
    """RRefs this worker owns: values kept by Python, entries counted by Go (for tests)."""
    return require_agent().owned_rref_count()
