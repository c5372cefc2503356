"""Backend options: what ``init_rpc`` is configured with."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Union

from . import constants

__all__ = ["DEFAULT_TRANSPORTS", "DeviceType", "RpcBackendOptions", "TRANSPORTS_ENV", "TensorPipeRpcBackendOptions"]

DeviceType = Union[int, str]


def _device(device: DeviceType) -> str:
    """A device in its canonical text form: "cpu" or "<type>:<index>" (an int is a CUDA
    index, as in torch)."""
    if isinstance(device, bool):
        raise ValueError(f"invalid device {device!r}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"invalid device index {device}")
        return f"cuda:{device}"
    text = str(device)
    kind, _, index = text.partition(":")
    if not kind.isidentifier() or (index and not index.isdigit()):
        raise ValueError(f"invalid device {device!r}: expected 'cpu', 'cuda', 'cuda:N' or an index")
    if kind == "cpu":
        return "cpu"
    return f"{kind}:{index or 0}"


def _int_option(name: str, value: Any) -> int:
    """``value`` if it is an int (not a bool, not text that reads as one), else TypeError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return value


def _text_option(name: str, value: Any) -> Optional[str]:
    """``value`` if it is a str or None, else TypeError."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a str or None, got {type(value).__name__} {value!r}")
    return value


def _rpc_timeout(value: Any) -> float:
    """A timeout in seconds: a number, not negative (0: none). torch's words when it is not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"rpc_timeout must be a number of seconds, got {type(value).__name__} {value!r}")
    timeout = float(value)
    if not timeout >= 0:  # NaN too
        raise RuntimeError("RPC Timeout must be non-negative")
    return timeout


class RpcBackendOptions:
    """Options every backend has: the default RPC timeout and the rendezvous URL."""

    def __init__(
        self,
        rpc_timeout: float = constants.DEFAULT_RPC_TIMEOUT_SEC,
        init_method: str = constants.DEFAULT_INIT_METHOD,
    ) -> None:
        self.rpc_timeout = _rpc_timeout(rpc_timeout)
        if not isinstance(init_method, str):
            raise TypeError(f"init_method must be a str, got {type(init_method).__name__} {init_method!r}")
        self.init_method = init_method


TRANSPORTS_ENV = "TENSORPLAY_RPC_TRANSPORTS"
DEFAULT_TRANSPORTS = ("shm", "tcp", "grpc")
# torch's TensorPipe names for the same paths: "uv" is its TCP transport.
_TRANSPORT_ALIASES = {"shm": "shm", "tcp": "tcp", "uv": "tcp", "grpc": "grpc"}


def _transport_names(given: Sequence[Any], source: str) -> List[str]:
    """Check and normalise a list of transport names; ``source`` names where it came from."""
    if isinstance(given, (str, bytes)):
        raise TypeError(f"{source} must be a list of transport names, got the string {given!r}")
    names: List[str] = []
    for n in given:
        key = str(n).strip()
        if not key:
            continue
        if key not in _TRANSPORT_ALIASES:
            raise ValueError(f"{source}: unknown transport {key!r}; this build has {sorted(_TRANSPORT_ALIASES)}")
        if _TRANSPORT_ALIASES[key] not in names:
            names.append(_TRANSPORT_ALIASES[key])
    if not names:
        raise ValueError(f"{source} names no transport; this build has {sorted(_TRANSPORT_ALIASES)}")
    return names


class TensorPipeRpcBackendOptions(RpcBackendOptions):
    """Options of the TENSORPIPE backend (here served by the Go agent: shared memory between
    workers on one host, gRPC between hosts).

    Args:
        num_worker_threads: Python threads that run incoming calls.
        rpc_timeout: default timeout of calls, in seconds; 0 means none.
        init_method: rendezvous URL: ``env://`` (MASTER_ADDR, MASTER_PORT) or
            ``tcp://host:port``.
        device_maps: per-destination device maps; this build has no accelerators, so only
            CPU-to-CPU maps can be used.
        devices: local devices; likewise CPU only.
        max_message_size: the most bytes (pickle plus buffers) one call or reply may carry,
            sent or received; bigger ones are refused before anything is sent.
        token: the world's shared secret (default: ``$TENSORPLAY_RPC_TOKEN``): every
            connection to the store and to every worker must present it before anything it
            sends is unpickled. Every worker of the world needs the same one.
        tls_cert, tls_key, tls_ca: PEM files of this worker's certificate and key and of the
            world's CA: with them, all store and worker traffic is mutual TLS, and a peer
            whose certificate the CA did not sign is refused.
        _transports: the transports that carry calls, in order of preference: ``"shm"``
            (shared memory, to workers on this host), ``"tcp"`` (plain TCP, to any worker;
            torch's ``"uv"`` means the same) and ``"grpc"`` (gRPC, to any worker). Default:
            ``$TENSORPLAY_RPC_TRANSPORTS`` (comma-separated) if set, else all three: shared
            memory to workers on this host, TCP to the others, gRPC to a worker that names
            only it. Workers that share no transport cannot call each other.
        _channels: accepted for compatibility with torch and ignored.
    """

    def __init__(
        self,
        *,
        num_worker_threads: int = constants.DEFAULT_NUM_WORKER_THREADS,
        rpc_timeout: float = constants.DEFAULT_RPC_TIMEOUT_SEC,
        init_method: str = constants.DEFAULT_INIT_METHOD,
        device_maps: Optional[Dict[str, Dict[DeviceType, DeviceType]]] = None,
        devices: Optional[List[DeviceType]] = None,
        _transports: Optional[List[str]] = None,
        _channels: Optional[List[str]] = None,
        max_message_size: int = constants.DEFAULT_MAX_MESSAGE_SIZE,
        token: Optional[str] = None,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        tls_ca: Optional[str] = None,
    ) -> None:
        super().__init__(rpc_timeout, init_method)
        # Every option is checked before any is kept: a refused one leaves nothing half set.
        if _int_option("num_worker_threads", num_worker_threads) < 1:
            raise RuntimeError(f"num_worker_threads must be positive, got {num_worker_threads}")  # torch's words
        if _int_option("max_message_size", max_message_size) < 1:
            raise ValueError(f"max_message_size must be a positive number of bytes, got {max_message_size}")
        for name, value in (("token", token), ("tls_cert", tls_cert), ("tls_key", tls_key), ("tls_ca", tls_ca)):
            _text_option(name, value)
        if any((tls_cert, tls_key, tls_ca)) and not all((tls_cert, tls_key, tls_ca)):
            raise ValueError("TLS needs all of tls_cert, tls_key and tls_ca")
        self.num_worker_threads = num_worker_threads
        self.max_message_size = max_message_size
        self.token = token
        self.tls_cert, self.tls_key, self.tls_ca = tls_cert, tls_key, tls_ca
        self.device_maps: Dict[str, Dict[str, str]] = {}
        for to, device_map in (device_maps or {}).items():
            self.set_device_map(to, device_map)
        self.devices: List[str] = []
        self.set_devices(list(devices or []))
        if _transports is not None:
            _transport_names(_transports, "_transports")
        self._transports = _transports
        self._channels = _channels

    def transport_names(self) -> List[str]:
        """The transports this worker uses, in order of preference: ``_transports`` if given,
        else ``$TENSORPLAY_RPC_TRANSPORTS``, else ``["shm", "tcp", "grpc"]``."""
        if self._transports is not None:
            return _transport_names(self._transports, "_transports")
        env = os.environ.get(TRANSPORTS_ENV, "")
        if env.strip():
            return _transport_names(env.split(","), TRANSPORTS_ENV)
        return list(DEFAULT_TRANSPORTS)

    def set_device_map(self, to: str, device_map: Dict[DeviceType, DeviceType]) -> None:
        """Set how this worker's devices map to worker ``to``'s devices for tensors sent
        there. The map must be one-to-one, and must agree with entries set before."""
        if not isinstance(to, str):
            raise TypeError(f"set_device_map: `to` must be a worker name, got {type(to).__name__}")
        full = {_device(k): _device(v) for k, v in device_map.items()}
        if len(set(full.values())) != len(full):
            raise ValueError(f"Device maps must be one-to-one, got {device_map} for {to}")
        current = self.device_maps.get(to, {})
        for k, v in full.items():
            if k in current and current[k] != v:
                raise ValueError(
                    f"`set_device_map` only supports 1-to-1 mapping, trying to map {k} to {v} and {current[k]}"
                )
        self.device_maps[to] = {**current, **full}

    def set_devices(self, devices: List[DeviceType]) -> None:
        """Set the local devices this worker's RPC agent may use."""
        self.devices = [_device(d) for d in devices]

    def _check_devices(self) -> None:
        """This build moves no accelerator memory: refuse to start with any device but the
        CPU, rather than silently send tensors elsewhere."""
        bad = [d for d in self.devices if d != "cpu"]
        for to, mapping in self.device_maps.items():
            bad += [f"{to}: {k}->{v}" for k, v in mapping.items() if k != "cpu" or v != "cpu"]
        if bad:
            raise ValueError(f"tensorplay_rpc was built without accelerator support; these devices cannot be used: {bad}")

    def __repr__(self) -> str:  # the token stays out of logs
        return (
            f"TensorPipeRpcBackendOptions(num_worker_threads={self.num_worker_threads}, "
            f"rpc_timeout={self.rpc_timeout}, init_method={self.init_method!r})"
        )
