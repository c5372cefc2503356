"""Backend options: what ``init_rpc`` is configured with."""

from __future__ import annotations

from typing import Dict, List, Optional, Union

from . import constants

DeviceType = Union[int, str]


class RpcBackendOptions:
    """Options every backend has: the default RPC timeout and the rendezvous URL."""

    def __init__(
        self,
        rpc_timeout: float = constants.DEFAULT_RPC_TIMEOUT_SEC,
        init_method: str = constants.DEFAULT_INIT_METHOD,
    ) -> None:
        self.rpc_timeout = float(rpc_timeout)
        self.init_method = init_method


class TensorPipeRpcBackendOptions(RpcBackendOptions):
    """Options of the TENSORPIPE backend (here served by the Go agent over gRPC).

    Args:
        num_worker_threads: Python threads that run incoming calls.
        rpc_timeout: default timeout of calls, in seconds; 0 means none.
        init_method: rendezvous URL: ``env://`` (MASTER_ADDR, MASTER_PORT) or
            ``tcp://host:port``.
        device_maps: per-destination device maps; this build has no accelerators, so only
            CPU-to-CPU maps can be used.
        devices: local devices; likewise CPU only.
        _transports, _channels: accepted for compatibility with torch and ignored.
    """

    def __init__(
        self,
        *,
        num_worker_threads: int = constants.DEFAULT_NUM_WORKER_THREADS,
        rpc_timeout: float = constants.DEFAULT_RPC_TIMEOUT_SEC,
        init_method: str = constants.DEFAULT_INIT_METHOD,
        device_maps: Optional[Dict[str, Dict[DeviceType, DeviceType]]] = None,
        devices: Optional[List[DeviceType]] = None,
        _transports: Optional[List] = None,
        _channels: Optional[List] = None,
    ) -> None:
        super().__init__(rpc_timeout, init_method)
        if int(num_worker_threads) < 1:
            raise ValueError(f"num_worker_threads must be at least 1, got {num_worker_threads}")
        self.num_worker_threads = int(num_worker_threads)
        self.device_maps: Dict[str, Dict[DeviceType, DeviceType]] = dict(device_maps or {})
        self.devices: List[DeviceType] = list(devices or [])
        self._transports = _transports
        self._channels = _channels

    def __repr__(self) -> str:
        return (
            f"TensorPipeRpcBackendOptions(num_worker_threads={self.num_worker_threads}, "
            f"rpc_timeout={self.rpc_timeout}, init_method={self.init_method!r})"
        )
