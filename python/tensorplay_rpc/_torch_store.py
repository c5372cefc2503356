"""Meeting at torch's store: one MASTER_PORT for a torch process group (or torchrun's agent)
and this package's rendezvous.

torch serves a multi-tenant ``TCPStore`` on ``MASTER_PORT``: its process groups and its RPC
share it, and under torchrun (``TORCHELASTIC_USE_AGENT_STORE=True``) the launcher's agent
already holds it. Our rendezvous store speaks gRPC, so it cannot take that port. When the
program uses torch, rank 0 serves our store on a free port and publishes its address through
torch's store; the other ranks read it there and join as usual. A program that never imports
torch never meets here and never imports it.

``TENSORPLAY_RPC_RENDEZVOUS`` chooses: ``auto`` (the default: meet at torch's store when
torch is imported before ``init_rpc`` or torchrun's agent holds the port), ``torch`` (always)
or ``own`` (never: our store on ``MASTER_PORT``, as Go workers expect).
"""

import datetime
import logging
import os
import socket
import sys
import time
from typing import Any, Optional
from urllib.parse import urlparse

__all__ = ["RENDEZVOUS_ENV", "TorchMeeting", "meeting_for"]

logger = logging.getLogger(__name__)

RENDEZVOUS_ENV = "TENSORPLAY_RPC_RENDEZVOUS"
_CHOICES = ("auto", "torch", "own")
_KEY_PREFIX = "tensorplay_rpc"
# Each init_rpc of this process meets under its own key: ranks call init_rpc in the same
# order, and a key left from an earlier world must not send a rank to a store that is gone.
_rounds = 0
_SLICE = datetime.timedelta(milliseconds=200)


def _uses_agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)


def _choice() -> str:
    choice = os.environ.get(RENDEZVOUS_ENV, "auto").strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"{RENDEZVOUS_ENV}={choice!r} is not one of {', '.join(_CHOICES)}")
    return choice


class TorchMeeting:
    """A rendezvous through torch's ``TCPStore`` at the store address our own would use."""

    def __init__(self, host: str, port: int, rank: int, timeout_s: float) -> None:
        import torch.distributed as dist  # imported by the program already, or asked for

        self.host, self.port, self.rank, self.timeout_s = host, port, rank, timeout_s
        global _rounds
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.key = f"{_KEY_PREFIX}/attempt_{restart}/round_{_rounds}/store"
        _rounds += 1
        timeout = datetime.timedelta(seconds=timeout_s)
        # Under torchrun the agent serves the store; otherwise rank 0 does, sharing it with
        # any process group of this process that is (or will be) on the same port.
        serve = rank == 0 and not _uses_agent_store()
        self.serving = serve
        if not serve:
            _wait_until_listening(host, port, time.monotonic() + timeout_s)
        try:
            self.store: Any = dist.TCPStore(
                host, port, None, serve, timeout, wait_for_workers=False, multi_tenant=True
            )
        except RuntimeError as e:
            raise RuntimeError(
                f"could not {'serve' if serve else 'reach'} torch's store at {host}:{port} "
                f"(MASTER_ADDR/MASTER_PORT) to meet the other ranks: {e}"
            ) from e

    def free_port_url(self) -> str:
        """The store URL rank 0 serves ours at: the same host, a free port."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"tcp://{host}:0"

    def publish(self, addr: str) -> None:
        """Rank 0: tell the others where our store listens."""
        self.store.set(self.key, addr)
        logger.debug("published the rendezvous store %s at torch's store %s:%d", addr, self.host, self.port)
        self._let_go()  # a served store stays: members of a dynamic world may still read it

    def read(self) -> str:
        """The others: wait for rank 0's address (in slices: Ctrl-C reaches Python between
        them) and return the URL of our store."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                self.store.wait([self.key], _SLICE)
                # In the same slices: torch 1.13's wait leaves its timeout on the client's
                # socket, and a get the loaded server answers later than that fails.
                addr: str = self.store.get(self.key).decode()
                break
            except RuntimeError as e:
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"rank {self.rank}: rank 0 did not publish its rendezvous store at torch's "
                        f"store {self.host}:{self.port} within {self.timeout_s:g} s (is rank 0 "
                        f"running, with torch imported or {RENDEZVOUS_ENV}=torch? Every rank must meet the "
                        f"same way: set {RENDEZVOUS_ENV} alike on all)"
                    ) from e
        self._let_go()
        return f"tcp://{addr}"

    def _let_go(self) -> None:
        """Close a client of torch's store once it is of no more use: torch 1.13's client
        keeps a thread that spins on a core once the store's server is gone."""
        if not self.serving:
            self.store = None


def _wait_until_listening(host: str, port: int, deadline: float) -> None:
    """Wait for torch's store to listen: a torch 1.13 client that finds no server yet retries
    only after a second, which would add that second to most joins."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.01)


def meeting_for(store_url: str, rank: int, timeout_s: float) -> Optional[TorchMeeting]:
    """The meeting at torch's store this join should use, or None for our own store."""
    choice = _choice()
    url = urlparse(store_url)
    if choice == "own" or url.scheme != "tcp":
        return None
    if choice == "auto" and not (_uses_agent_store() or "torch" in sys.modules):
        return None
    if url.hostname is None or url.port is None:
        return None
    return TorchMeeting(url.hostname, url.port, rank, timeout_s)
