"""A pytest plugin for code that uses RPC: a world of real worker processes per test module.

The package registers it (the ``pytest11`` entry point), so installing the package is enough::

    import pytest

    pytestmark = pytest.mark.rpc_world(workers=2, timeout=60)

    def test_add(rpc_world):
        assert rpc_world.run("w1", operator.add, 1, 2) == 3

The ``rpc_world`` fixture starts the workers (``w1`` .. ``wN``, each its own process) once per
module; the test process joins as ``w0`` (rank 0), so functions run on a chosen worker with
:meth:`World.run` and workers may call each other and ``w0``. Functions travel as torch's RPC
sends them: by reference, so the workers import the test module (they get the test
process's ``sys.path``). Every call has the world's deadline: a call that runs out of it, or
a worker that dies, kills the whole world by PID and fails with each worker's log tail. The
marker's arguments: ``workers`` (default 2), ``timeout`` (seconds, default 60), ``env`` (extra
environment for the workers) and ``options`` (keyword arguments of
:class:`~tensorplay_rpc.TensorPipeRpcBackendOptions` for every member).
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from . import api
from ._torch_store import RENDEZVOUS_ENV
from .options import TensorPipeRpcBackendOptions

__all__ = ["World", "WorldHung", "free_port", "rpc_world"]

logger = logging.getLogger(__name__)

MARKER = "rpc_world"
_LOG_TAIL_BYTES = 4000
# Workers that outlive the graceful shutdown get this long after SIGTERM before SIGKILL.
_GRACE_S = 2.0


def free_port() -> int:
    """A loopback TCP port that was free a moment ago, drawn from below the kernel's
    ephemeral range: a port the kernel handed out for port 0 could be handed out again (to
    another listener or an outgoing connection) before the world binds it."""
    first = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    lowest = 10000
    for _ in range(200):
        port = random.randrange(lowest, max(first, lowest + 1000))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in [{lowest}, {first}) after 200 tries")


@contextlib.contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """Set an environment variable of this process for the block, then put it back."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


class WorldHung(AssertionError):
    """A world's call ran out of its deadline, or a worker died: the world was killed, and
    the message holds each worker's log tail."""


class World:
    """A world of worker processes that the test process (``w0``) has joined."""

    def __init__(self, workers: int, timeout: float, env: Dict[str, str], options: Dict[str, Any]) -> None:
        if workers < 1:
            raise ValueError(f"an rpc_world needs at least one worker, got workers={workers}")
        self.timeout = float(timeout)
        self.names = [f"w{rank}" for rank in range(1, workers + 1)]
        self.killed: Optional[str] = None  # why the world was killed, once it was
        self._logdir = tempfile.mkdtemp(prefix="tensorplay-rpc-world-")
        self._logs: Dict[str, str] = {}
        self._procs: Dict[str, subprocess.Popen[bytes]] = {}
        self._killed_on_purpose: set[str] = set()
        port = free_port()
        worker_env = dict(os.environ)
        # By reference, as torch sends them: the workers import what the test process can.
        worker_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
        # Every member meets the same way: the test process may have imported torch (which
        # would make it meet at torch's store) while its workers have not.
        rendezvous = env.get(RENDEZVOUS_ENV) or os.environ.get(RENDEZVOUS_ENV) or "own"
        worker_env[RENDEZVOUS_ENV] = rendezvous
        worker_env.update(env)
        worker_env.update(PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(workers + 1))
        for rank, name in enumerate(self.names, start=1):
            log = os.path.join(self._logdir, f"{name}.log")
            self._logs[name] = log
            with open(log, "wb") as out:
                self._procs[name] = subprocess.Popen(
                    [sys.executable, "-m", __name__, name, str(rank), repr(options)],
                    env=dict(worker_env, RANK=str(rank)),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
        opts = TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", **options)
        opts.rpc_timeout = self.timeout
        try:
            with _environ(RENDEZVOUS_ENV, rendezvous):
                api.init_rpc("w0", rank=0, world_size=workers + 1, rpc_backend_options=opts)
        except Exception as e:
            self._kill(f"the world did not start: {e}")
            raise WorldHung(self._report()) from e

    @property
    def pids(self) -> Dict[str, int]:
        """Each worker's process id, by name."""
        return {name: p.pid for name, p in self._procs.items()}

    def run(self, to: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``func(*args, **kwargs)`` on worker ``to`` and return what it returned. An
        exception it raised is raised here (as ``rpc_sync`` raises it); a call that runs out
        of the world's deadline, or whose worker died, kills the world (:class:`WorldHung`)."""
        if self.killed:
            raise WorldHung(f"the world was killed before this call: {self.killed}")
        try:
            return api.rpc_sync(to, func, args=args, kwargs=kwargs, timeout=self.timeout)
        except RuntimeError as e:
            if not self._framework_failure(e):
                raise
            self._kill(f"calling {getattr(func, '__name__', func)} on {to} failed: {e}")
            raise WorldHung(self._report()) from e

    def run_all(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Dict[str, Any]:
        """Run ``func`` on every worker at once; what each returned, by name."""
        futs = {name: api.rpc_async(name, func, args=args, kwargs=kwargs, timeout=self.timeout) for name in self.names}
        return {name: self.run_future(fut, f"{getattr(func, '__name__', func)} on {name}") for name, fut in futs.items()}

    def run_future(self, fut: Any, what: str) -> Any:
        """Wait for ``fut`` (a call into this world) as :meth:`run` waits."""
        try:
            return fut.wait()
        except RuntimeError as e:
            if not self._framework_failure(e):
                raise
            self._kill(f"{what} failed: {e}")
            raise WorldHung(self._report()) from e

    def log_tail(self, name: str, size: int = _LOG_TAIL_BYTES) -> str:
        """The last ``size`` bytes of worker ``name``'s output."""
        with open(self._logs[name], "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")

    def kill(self, name: str) -> None:
        """SIGKILL worker ``name`` (to test what its peers do), by PID."""
        proc = self._procs[name]
        self._killed_on_purpose.add(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=self.timeout)

    def close(self) -> None:
        """Leave the world gracefully and wait for every worker; kill the late ones."""
        if not self.killed:
            try:
                api.shutdown(graceful=True, timeout=self.timeout)
            except Exception as e:  # a worker that was killed on purpose: leave at once
                logger.info("rpc_world: graceful shutdown failed (%s); leaving at once", e)
                if api._is_current_rpc_agent_set():
                    api.shutdown(graceful=False)
        self._end_processes(self.timeout)

    def _framework_failure(self, e: BaseException) -> bool:
        """Whether ``e`` is the world's failure (a deadline passed, a worker died) rather than
        the function's own exception, which the test may expect."""
        text = str(e)
        if "RPC ran for more than set timeout" in text:
            return True
        for name, proc in self._procs.items():
            if name in self._killed_on_purpose:
                continue
            # A worker that just died may not be reaped yet when its peers notice.
            try:
                proc.wait(timeout=2.0 if name in text else 0)
                return True
            except subprocess.TimeoutExpired:
                pass
        return False

    def _kill(self, why: str) -> None:
        self.killed = why
        if api._is_current_rpc_agent_set():
            api.shutdown(graceful=False)
        self._end_processes(_GRACE_S)

    def _end_processes(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds, every worker still running, by
        PID."""
        running = [p for p in self._procs.values() if p.poll() is None]
        deadline = time.monotonic() + grace
        for p in running:
            try:
                p.wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.terminate()
        for p in running:
            try:
                p.wait(timeout=_GRACE_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def _report(self) -> str:
        parts = [f"rpc_world killed: {self.killed}"]
        for name, proc in self._procs.items():
            parts.append(f"--- {name} (pid {proc.pid}, exit {proc.returncode}) ---\n{self.log_tail(name)}")
        return "\n".join(parts)


@pytest.fixture(scope="module")
def rpc_world(request: pytest.FixtureRequest) -> Iterator[World]:
    """A world of worker processes, once per module (see the module's docs for the
    ``rpc_world`` marker)."""
    marker = request.node.get_closest_marker(MARKER)
    kwargs: Dict[str, Any] = dict(marker.kwargs) if marker else {}
    world = World(
        workers=int(kwargs.pop("workers", 2)),
        timeout=float(kwargs.pop("timeout", 60.0)),
        env=dict(kwargs.pop("env", {})),
        options=dict(kwargs.pop("options", {})),
    )
    if kwargs:
        world.close()
        raise TypeError(f"unknown rpc_world marker arguments: {', '.join(sorted(kwargs))}")
    try:
        yield world
    finally:
        world.close()


def pytest_configure(config: pytest.Config) -> None:
    """Declare the marker (pytest's ``--strict-markers`` refuses unknown ones)."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(workers=2, timeout=60, env=None, options=None): the world the rpc_world fixture starts for this module",
    )


def _worker_main(argv: List[str]) -> int:
    """A worker of an rpc_world: join, serve until every member shuts down, leave."""
    import ast

    name, rank, options = argv[0], int(argv[1]), ast.literal_eval(argv[2])
    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s {name} %(name)s %(levelname)s %(message)s")
    port = os.environ["MASTER_PORT"]
    opts = TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", **options)
    api.init_rpc(name, rank=rank, world_size=int(os.environ["WORLD_SIZE"]), rpc_backend_options=opts)
    # Graceful shutdown is a barrier: this worker serves calls until w0 (the test) leaves.
    api.shutdown(graceful=True, timeout=0)
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
