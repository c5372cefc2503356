"""Runs a module of differential scenarios in a world of real worker processes, on one backend.

    python harness.py <backend module> <scenario module> <port>

The backend module is ``torch.distributed.rpc`` or ``tensorplay_rpc``. This process is rank 0
(``w0``); it starts ranks 1 .. WORLD-1 as processes of its own and every rank joins through
``tcp://127.0.0.1:<port>``. Rank 0 then runs the module's scenarios in order and prints one line
per scenario, ``name<TAB>outcome``: ``ok <repr of what it returned>`` or ``<exception type>:
<message>``, the message normalised (addresses, RRef ids, traceback frames) so that only what a
user can rely on is compared. A module whose ``WORLD`` is 0 runs its scenarios before any
``init_rpc``, each in a process of its own: they make the worlds they need themselves, on
ports drawn by :func:`port`.

Scenario modules name the backend through this module (``harness.rpc``, ``harness.futures``),
which is set before they run on every rank.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from ports import free_port  # noqa: E402 - tests/ is on the path only from here

# Set on every rank before any scenario runs: the RPC module and its futures module, and the
# layers built on RPC (distributed autograd, DistributedOptimizer, RemoteModule).
rpc: Any = None
futures: Any = None
dist_autograd: Any = None
DistributedOptimizer: Any = None
RemoteModule: Any = None
backend: str = ""

# Scenario modules run as every rank's ``__main__``, as a user's script is: their functions and
# classes are ``__main__``'s, which both backends send by reference and resolve in the callee's
# own ``__main__``.
RUN_AS_MAIN = {"dist_autograd", "calls", "errors", "rrefs", "callbacks"}
# Scenario modules that use the layers built on RPC (they import torch, which changes what our
# futures are: the other modules run without it).
LAYERS = {"dist_autograd"}

WORLD_TIMEOUT_S = 60.0
# A scenario of a WORLD = 0 module that gives no outcome in this time hangs.
SCENARIO_TIMEOUT_S = 20.0


@dataclass
class Scenario:
    """One scenario: a function of no arguments, run on rank 0."""

    name: str
    run: Callable[[], Any]
    # Set where we differ from torch on purpose: the one-line reason, and how the outcome line
    # we give starts.
    differs: Optional[str] = None
    ours: Optional[str] = None
    # torch does not finish this scenario (it hangs): it is not run there.
    torch_hangs: bool = False
    # Only the exception's type is compared; the reason says why the messages cannot agree.
    type_only: Optional[str] = None


def scenario(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Register ``fn`` as a scenario of its module; both backends must give the same outcome."""
    _registry(fn).append(Scenario(fn.__name__, fn))
    return fn


def differs(reason: str, ours: str, torch_hangs: bool = False) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    """Register a scenario where we differ from torch on purpose: ``reason`` says why, in one
    line; our outcome line must start with ``ours`` (torch's is printed, not compared)."""

    def register(fn: Callable[[], Any]) -> Callable[[], Any]:
        _registry(fn).append(Scenario(fn.__name__, fn, reason, ours, torch_hangs))
        return fn

    return register


def same_type(reason: str) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    """Register a scenario whose outcomes must agree in the exception's type only: ``reason``
    says why the messages cannot (torch's is text pybind11 makes up, say)."""

    def register(fn: Callable[[], Any]) -> Callable[[], Any]:
        _registry(fn).append(Scenario(fn.__name__, fn, type_only=reason))
        return fn

    return register


def _registry(fn: Callable[..., Any]) -> List[Scenario]:
    module = sys.modules[fn.__module__]
    if not hasattr(module, "SCENARIOS"):
        module.SCENARIOS = []
    return module.SCENARIOS


def port() -> int:
    """A loopback port that was free a moment ago (tests/ports.py)."""
    return free_port()


def options(world_port: int, **kwargs: Any) -> Any:
    """Backend options joining through ``tcp://127.0.0.1:<world_port>``."""
    return rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{world_port}", **kwargs)


def start_peers(module: str, world_port: int, ranks: range, world_size: int, names: Optional[List[str]] = None) -> List[subprocess.Popen]:
    """Start processes that join a world as the given ranks (named ``w<rank>`` unless
    ``names`` says otherwise), serve until everyone shuts down, and exit."""
    peers = []
    for i, rank in enumerate(ranks):
        name = names[i] if names else f"w{rank}"
        peers.append(
            subprocess.Popen(
                [sys.executable, __file__, backend, module, str(world_port), "--peer", str(rank), str(world_size), name],
                stdout=subprocess.DEVNULL,
            )
        )
    return peers


def end_peers(peers: List[subprocess.Popen], timeout: float = WORLD_TIMEOUT_S) -> List[int]:
    """Wait for ``peers`` to exit (killing, by PID, any still running after ``timeout``);
    their exit codes."""
    deadline = time.monotonic() + timeout
    codes = []
    for peer in peers:
        try:
            peer.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            peer.kill()
            peer.wait()
        codes.append(peer.returncode)
    return codes


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_RREF_ID = re.compile(r"(created_on|local_id)=\d+")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\n(?:(?:  |\s*\^).*\n)*")
# pybind11 appends the Python frames an error crossed in torch's C++ ("\n\nAt:\n  file(line): fn"):
# they name torch's own files, and say nothing a user can rely on.
_LIBRARY = re.compile(r"torch\.distributed\.rpc|torch\.distributed|torch\.futures|tensorplay_rpc")
_PYBIND_FRAMES = re.compile(r"\n\nAt:\n(?:  .*(?:\n|$))*")
# pybind11's words before the message of a value it could not convert.
_PYBIND_CAST = re.compile(r"Unable to cast Python instance to C\+\+ type \(#define PYBIND11_DETAILED_ERROR_MESSAGES or compile in debug mode for details\)\. ")


def normalise(text: str) -> str:
    """What of a message both backends can be expected to agree on: tracebacks keep their
    header and last line (the frames differ: they run through each library's own code), the
    library's own name and addresses and ids are masked. Newlines are shown as \\n so an outcome stays one line."""
    text = _PYBIND_FRAMES.sub("", text)
    text = _PYBIND_CAST.sub("", text)
    text = _TRACEBACK.sub("Traceback (most recent call last):\n  ...\n", text)
    text = _ADDRESS.sub("0x?", text)
    text = _LIBRARY.sub("<rpc>", text)
    text = _RREF_ID.sub(r"\1=?", text)
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def outcome(fn: Callable[[], Any]) -> str:
    """The outcome line of running ``fn``."""
    try:
        value = fn()
    except Exception as exc:  # the outcome is what is compared
        try:
            text = str(exc)
        except Exception as err:  # an exception whose __str__ fails: that is its outcome
            text = f"<str() raised {type(err).__name__}>"
        return f"{type(exc).__name__}: {normalise(text)}"
    return f"ok {normalise(repr(value))}"


def _use_backend(name: str, layers: bool) -> None:
    """Use backend ``name``; with ``layers``, its modules built on RPC too (they import torch,
    which changes what our futures are: the other modules run without it)."""
    global rpc, futures, backend, dist_autograd, DistributedOptimizer, RemoteModule
    backend = name
    rpc = importlib.import_module(name)
    futures = importlib.import_module("torch.futures") if name.startswith("torch") else rpc
    if not layers:
        return
    if name.startswith("torch"):
        dist_autograd = importlib.import_module("torch.distributed.autograd")
        DistributedOptimizer = importlib.import_module("torch.distributed.optim").DistributedOptimizer
        RemoteModule = importlib.import_module("torch.distributed.nn").RemoteModule
    else:
        dist_autograd = importlib.import_module(f"{name}.autograd")
        DistributedOptimizer = importlib.import_module(f"{name}.optim").DistributedOptimizer
        RemoteModule = importlib.import_module(f"{name}.nn").RemoteModule


def _load(module_name: str) -> ModuleType:
    """Import a scenario module, or run it as this process's ``__main__`` (RUN_AS_MAIN)."""
    if module_name not in RUN_AS_MAIN:
        return importlib.import_module(module_name)
    path = os.path.join(HERE, module_name + ".py")
    module = ModuleType("__main__")
    module.__file__ = path
    sys.modules["__main__"] = module
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), module.__dict__)
    return module


def _peer(module_name: str, world_port: int, rank: int, world_size: int, name: str) -> None:
    _load(module_name)
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options(world_port))
    rpc.shutdown()


def _run_alone(module_name: str, s: Scenario) -> str:
    """The outcome line of scenario ``s`` run in a process of its own: torch cannot make a
    second world in a process that has had one, and a scenario that hangs is ended by its
    process group (its own PID) with whatever worlds it started."""
    child = subprocess.Popen(
        [sys.executable, __file__, backend, module_name, "0", "--scenario", s.name],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = child.communicate(timeout=SCENARIO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, 9)
        child.communicate()
        return f"hangs: no outcome in {SCENARIO_TIMEOUT_S:.0f} s"
    lines = out.splitlines()
    return lines[-1] if lines else f"died with exit code {child.returncode}"


def main(argv: List[str]) -> int:
    module_name, world_port = argv[1], int(argv[2])
    _use_backend(argv[0], layers=module_name in LAYERS)
    if len(argv) > 3 and argv[3] == "--peer":
        _peer(module_name, world_port, int(argv[4]), int(argv[5]), argv[6])
        return 0
    module: ModuleType = _load(module_name)
    if len(argv) > 3 and argv[3] == "--scenario":
        print(outcome(next(s.run for s in module.SCENARIOS if s.name == argv[4])), flush=True)
        return 0
    world = getattr(module, "WORLD", 3)
    peers: List[subprocess.Popen] = []
    joined = False
    try:
        if world:
            peers = start_peers(module_name, world_port, range(1, world), world)
            rpc.init_rpc("w0", rank=0, world_size=world, rpc_backend_options=options(world_port))
            joined = True
        for s in module.SCENARIOS:
            if s.torch_hangs and backend.startswith("torch"):
                line = "not run: torch hangs"
            elif world:
                line = outcome(s.run)
            else:
                line = _run_alone(module_name, s)
            print(f"{s.name}\t{line}", flush=True)
    finally:
        if joined:
            rpc.shutdown()
        # Peers of a world that never formed wait for rank 0 until their own init timeout.
        codes = end_peers(peers, WORLD_TIMEOUT_S if joined else 1.0)
    if any(codes):
        print(f"peers exited with {codes}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # Scenario modules import this file as ``harness``: run that module, not ``__main__``.
    sys.path.insert(0, HERE)
    import harness

    sys.exit(harness.main(sys.argv[1:]))
