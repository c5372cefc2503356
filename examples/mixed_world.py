"""A world of one Python worker and one Go worker (examples/goworker), on this machine.

    make demo-go        # or: python examples/mixed_world.py PATH_TO_GOWORKER

The Python worker ("trainer") exposes train_step to every language and calls the Go worker's
functions by name; the Go worker ("feature-store") calls train_step back.
"""

import logging
import os
import socket
import subprocess
import sys
import time

import numpy as np

import tensorplay_rpc as rpc

log = logging.getLogger("mixed_world")


@rpc.expose
def train_step(batch, lr):
    """Called from Go with a list of floats and a learning rate."""
    return {"loss": float(sum(batch)) * lr, "n": float(len(batch))}


@rpc.expose
def slow(seconds):
    time.sleep(seconds)


@rpc.expose
def normalize(x):
    """Called from Go with a float64 array (a numpy array here); returns one."""
    return x / x.sum()


@rpc.expose
def boom(why):
    raise ValueError(f"boom: {why}")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(env)
    go = subprocess.Popen([sys.argv[1], "-name", "feature-store", "-rank", "1", "-world-size", "2", "-python", "trainer"], env=env)
    try:
        rpc.init_rpc("trainer", rank=0, world_size=2)
        add, lookup = rpc.remote_function("add"), rpc.remote_function("lookup")
        log.info("add(2, 3.5) on Go = %s", rpc.rpc_sync("feature-store", add, args=(2, 3.5)))
        arr = np.arange(6, dtype=np.float32).reshape(2, 3)
        log.info("scale(%s, 10) on Go = %s", arr.tolist(), rpc.rpc_sync("feature-store", rpc.remote_function("scale"), args=(arr, 10)).tolist())
        log.info("stats of 4 M float32 on Go = %s", rpc.rpc_sync("feature-store", rpc.remote_function("stats"), args=(np.ones(1 << 22, dtype=np.float32),)))
        log.info("lookup([1, 2]) on Go = %s", rpc.rpc_async("feature-store", lookup, args=([1, 2],)).wait())
        try:
            rpc.rpc_sync("feature-store", lookup, args=([-1],))
        except RuntimeError as exc:
            log.info("lookup([-1]) on Go raised: %s", exc)
        rpc.shutdown()  # a barrier: the Go worker has made its calls when this returns
        go.wait(timeout=60)
    finally:
        if go.poll() is None:
            go.kill()
            go.wait()


if __name__ == "__main__":
    main()
