"""Start the workers of a world on this machine, as torchrun does::

    python -m tensorplay_rpc.run --nproc 4 train.py --lr 0.1
    python -m tensorplay_rpc.run --nproc 4 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 -m mypkg.train

Each worker gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``
and ``MASTER_PORT`` (a free port when none is given on one node), so
``rpc.init_rpc(name)`` needs no rank or world size. Every line a worker prints is prefixed
with its rank. Ctrl-C (or SIGTERM) is passed on to every worker; when a worker fails, the
others are ended (by PID, SIGTERM then SIGKILL) and the launcher exits with the failed worker's
status.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Dict, List, Optional, Sequence

__all__ = ["END_GRACE_S", "free_port", "main", "parse_args", "worker_env"]

# How long workers have to end after SIGTERM (or after Ctrl-C is passed on) before SIGKILL.
END_GRACE_S = 5.0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The launcher's options, then the script (or ``-m module``) and its own arguments."""
    parser = argparse.ArgumentParser(prog="python -m tensorplay_rpc.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", "--nproc-per-node", "--nproc_per_node", type=int, default=1, help="workers on this machine")
    parser.add_argument("--nnodes", type=int, default=1, help="machines in the world")
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0, help="this machine's index, from 0")
    parser.add_argument("--master-addr", "--master_addr", default=None, help="host of rank 0 (default: $MASTER_ADDR or 127.0.0.1)")
    parser.add_argument("--master-port", "--master_port", type=int, default=None, help="port of the rendezvous (default: $MASTER_PORT, or a free one on one node)")
    parser.add_argument("-m", "--module", action="store_true", help="run the target as a module, as python -m does")
    parser.add_argument("target", help="the script (or module, with -m) each worker runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    ns = parser.parse_args(argv)
    if ns.nproc < 1 or ns.nnodes < 1:
        parser.error(f"--nproc and --nnodes must be at least 1, got {ns.nproc} and {ns.nnodes}")
    if not 0 <= ns.node_rank < ns.nnodes:
        parser.error(f"--node-rank {ns.node_rank} is out of range for --nnodes {ns.nnodes}")
    return ns


def free_port() -> int:
    """A TCP port that was free on loopback a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_env(ns: argparse.Namespace, local_rank: int, addr: str, port: int) -> Dict[str, str]:
    """The environment of worker ``local_rank`` of this machine."""
    env = dict(os.environ)
    env.update(
        RANK=str(ns.node_rank * ns.nproc + local_rank),
        WORLD_SIZE=str(ns.nnodes * ns.nproc),
        LOCAL_RANK=str(local_rank),
        LOCAL_WORLD_SIZE=str(ns.nproc),
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
        PYTHONUNBUFFERED="1",  # lines reach the prefixer as they are printed
    )
    return env


def _relay(stream: IO[bytes], out: IO[str], prefix: str) -> None:
    """Copy ``stream`` to ``out`` a line at a time, each line prefixed. If ``out`` cannot be
    written (a closed pipe: ``... | head``), the rest is read and dropped: a worker must
    never block on a full pipe no one reads."""
    writable = True
    for raw in iter(stream.readline, b""):
        if not writable:
            continue
        try:
            out.write(prefix + raw.decode(errors="replace"))
            out.flush()
        except (OSError, ValueError, UnicodeError):
            writable = False
    stream.close()


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig`` to worker ``p`` and the processes it started (its process group: each
    worker leads one), by the worker's PID."""
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:  # the group is gone
        pass


def _end(procs: List[subprocess.Popen[bytes]], sig: int) -> None:
    """Send ``sig`` to every worker still running, then SIGKILL those left after the grace."""
    for p in procs:
        if p.poll() is None:
            _signal_group(p, sig)
    deadline = time.monotonic() + END_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.wait()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the world's workers on this machine; return the exit status (0 if all succeeded)."""
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    addr = ns.master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    port = ns.master_port or int(os.environ.get("MASTER_PORT", "0"))
    if not port:
        if ns.nnodes > 1:
            print("python -m tensorplay_rpc.run: --master-port (or $MASTER_PORT) is needed with --nnodes > 1", file=sys.stderr)
            return 2
        port = free_port()
    command = [sys.executable, "-m", ns.target] if ns.module else [sys.executable, ns.target]
    command += ns.args
    procs: List[subprocess.Popen[bytes]] = []
    relays: List[threading.Thread] = []
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for local_rank in range(ns.nproc):
            env = worker_env(ns, local_rank, addr, port)
            # A session of its own: Ctrl-C at a terminal reaches the launcher alone, which passes
            # it on once, and never a worker twice.
            p = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            procs.append(p)
            prefix = f"[{env['RANK']}]: "
            for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
                t = threading.Thread(target=_relay, args=(stream, out, prefix), daemon=True)
                t.start()
                relays.append(t)
        status = 0
        while True:
            if stop.is_set():  # Ctrl-C or SIGTERM: passed on; the workers' own exits decide
                _end(procs, signal.SIGINT)
                status = 130
                break
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c is not None and c != 0]
            if failed:
                rank, status = failed[0]
                print(f"python -m tensorplay_rpc.run: worker {ns.node_rank * ns.nproc + rank} exited with status {status}; ending the others", file=sys.stderr)
                _end(procs, signal.SIGTERM)
                status = status if status > 0 else 128 - status  # killed by a signal: 128 + its number
                break
            if all(c == 0 for c in codes):
                break
            stop.wait(0.05)
    finally:
        _end(procs, signal.SIGKILL)  # nothing is left running, whatever happened above
        for s, handler in previous.items():
            signal.signal(s, handler)
        for t in relays:
            t.join(timeout=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
