"""`make demo`: a small world of workers on localhost calling each other.

Run without arguments, it picks a free port and starts the workers as child processes of its
own (each runs this file with RANK set), relays what rank 0 prints, and ends them by PID if
they outlive the time limit.
"""

import os
import socket
import subprocess
import sys
import time

import tensorplay_rpc as rpc

WORLD_SIZE = 3
NAMES = ["master", "trainer", "ps"]
TIME_LIMIT_S = 60


def add(a, b):
    return a + b


def greet(name, punctuation="!"):
    return f"hello, {name}{punctuation}"


def divide(a, b):
    return a / b


class Counter:
    """A parameter-server style object: it lives on "ps", the others update it remotely."""

    def __init__(self):
        self.total = 0
        self.updates = []

    def add(self, worker, amount):
        self.total += amount
        self.updates.append(worker)
        return self.total


def train_a_little(counter, steps):
    """Runs on "trainer": update the counter it was handed, through its RRef."""
    for _ in range(steps):
        counter.rpc_sync().add("trainer", 2)
    return counter.rpc_sync().add("trainer", 0)


def worker(rank: int) -> None:
    """The seed's example, then a few more calls."""
    # run on both workers, each with its own name:
    rpc.init_rpc(NAMES[rank], rank=rank, world_size=WORLD_SIZE)
    if rank == 0:
        me = rpc.get_worker_info()
        trainer = rpc.get_worker_info("trainer")
        print(f"{me} sees {trainer}")

        result = rpc.rpc_sync("trainer", add, args=(3, 4))
        print(f"rpc_sync('trainer', add, args=(3, 4)) -> {result}")

        print(f"rpc_sync with kwargs -> {rpc.rpc_sync('trainer', greet, args=('world',), kwargs={'punctuation': '?'})!r}")

        try:
            rpc.rpc_sync("trainer", divide, args=(1, 0))
        except ZeroDivisionError as exc:
            first_line = str(exc).splitlines()[0]
            print(f"rpc_sync('trainer', divide, args=(1, 0)) raised ZeroDivisionError: {first_line} ...")

        futures = [rpc.rpc_async("trainer", add, args=(i, i)) for i in range(5)]
        print(f"rpc_async x5 -> {[f.wait() for f in futures]}")

        doubled = rpc.rpc_async("trainer", add, args=(20, 1)).then(lambda f: f.value() * 2)
        print(f"rpc_async(...).then(double) -> {doubled.wait()}")

        print(f"a lambda, sent by value -> {rpc.rpc_sync('trainer', lambda x: x ** 2, args=(12,))}")

        counter = rpc.remote("ps", Counter)
        print(f"rpc.remote('ps', Counter) -> {counter}")
        trainer_done = rpc.rpc_async("trainer", train_a_little, args=(counter, 5))
        for _ in range(5):
            counter.rpc_sync().add("master", 1)
        print(f"trainer saw a total of {trainer_done.wait()} after its updates")
        final = counter.to_here()
        print(f"counter on ps: total={final.total} from {final.updates.count('master')} master and "
              f"{final.updates.count('trainer') - 1} trainer updates")

        start = time.perf_counter()
        n = 1000
        for _ in range(n):
            rpc.rpc_sync("trainer", add, args=(1, 2))
        print(f"{n} rpc_sync calls: {(time.perf_counter() - start) / n * 1e6:.0f} us per call")
    rpc.shutdown()


def launch() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(WORLD_SIZE):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env))
    deadline = time.monotonic() + TIME_LIMIT_S
    code = 0
    for p in procs:
        try:
            code |= p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            code = 1
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    return code


if __name__ == "__main__":
    if "RANK" in os.environ:
        worker(int(os.environ["RANK"]))
    else:
        sys.exit(launch())
