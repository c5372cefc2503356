"""init_rpc and shutdown: bad arguments, use before init and after shutdown, worlds made and
left again. Each scenario makes the worlds it needs (WORLD = 0)."""

import operator
import os
import time

import harness
from harness import differs, scenario

WORLD = 0


def alone(**kwargs):
    """Join a world of one as w0 (options may be replaced through ``kwargs``)."""
    args = dict(rank=0, world_size=1, rpc_backend_options=harness.options(harness.port()))
    args.update(kwargs)
    harness.rpc.init_rpc("w0", **args)


def with_peer(names, run):
    """A world of ``names`` (this process is the first, the others processes of their own);
    ``run()`` runs in it, then everyone shuts down."""
    port = harness.port()
    peers = harness.start_peers(__name__, port, range(1, len(names)), len(names), names[1:])
    try:
        harness.rpc.init_rpc(names[0], rank=0, world_size=len(names), rpc_backend_options=harness.options(port))
        try:
            return run()
        finally:
            harness.rpc.shutdown()
    finally:
        harness.end_peers(peers)


@scenario
def call_before_init():
    return harness.rpc.rpc_sync("w1", operator.add, args=(1, 1))


@scenario
def get_worker_info_before_init():
    return harness.rpc.get_worker_info()


@scenario
def shutdown_before_init():
    return harness.rpc.shutdown()


@scenario
def remote_before_init():
    return harness.rpc.remote("w1", operator.add, args=(1, 1))


@scenario
def rref_before_init():
    return harness.rpc.RRef(1)


@scenario
def get_rpc_timeout_before_init():
    return harness.rpc.get_rpc_timeout()


@scenario
def is_agent_set_before_init():
    return harness.rpc._is_current_rpc_agent_set()


@scenario
def init_backend_not_a_backend_type():
    return harness.rpc.init_rpc("w0", backend="TENSORPIPE", rank=0, world_size=1)


@scenario
def init_options_of_wrong_type():
    return harness.rpc.init_rpc("w0", rank=0, world_size=1, rpc_backend_options={"rpc_timeout": 1})


@scenario
def init_name_not_a_string():
    return harness.rpc.init_rpc(5, rank=0, world_size=1, rpc_backend_options=harness.options(harness.port()))


@scenario
def init_bad_name():
    return harness.rpc.init_rpc("bad name!", rank=0, world_size=1, rpc_backend_options=harness.options(harness.port()))


@scenario
def init_float_rank():
    return harness.rpc.init_rpc("w0", rank=1.7, world_size=2, rpc_backend_options=harness.options(harness.port()))


@differs("torch waits forever for a world that cannot form; we refuse the rank at once", ours='RuntimeError: rank 3 is out of range for world_size 2: ranks run from 0 to 1', torch_hangs=True)
def init_rank_not_below_world_size():
    return harness.rpc.init_rpc("w0", rank=3, world_size=2, rpc_backend_options=harness.options(harness.port()))


@scenario
def init_env_without_variables():
    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k in os.environ}
    try:
        return harness.rpc.init_rpc("w0")
    finally:
        os.environ.update(saved)


@scenario
def init_env_without_master_port():
    os.environ.update(MASTER_ADDR="127.0.0.1")
    try:
        return harness.rpc.init_rpc("w0", rank=0, world_size=1)
    finally:
        del os.environ["MASTER_ADDR"]


@scenario
def init_and_use_alone():
    alone()
    try:
        return (harness.rpc.rpc_sync("w0", operator.add, args=(1, 2)), harness.rpc.get_worker_info().name)
    finally:
        harness.rpc.shutdown()


@scenario
def init_twice():
    alone()
    try:
        return alone()
    finally:
        harness.rpc.shutdown()


@scenario
def call_after_shutdown():
    alone()
    harness.rpc.shutdown()
    return harness.rpc.rpc_sync("w0", operator.add, args=(1, 1))


@scenario
def shutdown_twice():
    alone()
    harness.rpc.shutdown()
    return harness.rpc.shutdown()


@scenario
def init_again_after_shutdown():
    alone()
    harness.rpc.shutdown()
    alone()
    try:
        return harness.rpc.rpc_sync(0, operator.mul, args=(3, 3))
    finally:
        harness.rpc.shutdown()


@scenario
def shutdown_not_graceful():
    alone()
    harness.rpc.rpc_sync("w0", operator.add, args=(1, 1))
    return harness.rpc.shutdown(graceful=False)


@scenario
def rpc_timeout_from_options():
    alone(rpc_backend_options=harness.options(harness.port(), rpc_timeout=7))
    try:
        return harness.rpc.get_rpc_timeout()
    finally:
        harness.rpc.shutdown()


@scenario
def world_of_two():
    return with_peer(["w0", "w1"], lambda: (harness.rpc.rpc_sync("w1", operator.add, args=(2, 2)), harness.rpc.get_worker_info("w1").id))


@scenario
def world_with_custom_names():
    return with_peer(["trainer", "ps"], lambda: harness.rpc.rpc_sync("ps", str, args=(harness.rpc.get_worker_info("ps"),)))


@scenario
def duplicate_names():
    return with_peer(["w0", "w0"], lambda: "joined")


def in_world_of_two(run):
    """What ``run()`` gave and what the shutdown after it gave, in a world of w0 (this
    process) and w1."""
    port = harness.port()
    peers = harness.start_peers(__name__, port, range(1, 2), 2)
    try:
        harness.rpc.init_rpc("w0", rank=0, world_size=2, rpc_backend_options=harness.options(port))
        return (harness.outcome(run), harness.outcome(harness.rpc.shutdown))
    finally:
        harness.end_peers(peers)


@scenario
def remote_timeout_to_here_at_once():
    return in_world_of_two(lambda: harness.rpc.remote("w1", time.sleep, args=(1,), timeout=0.3).to_here())


def to_here_after_creation_timed_out():
    rref = harness.rpc.remote("w1", time.sleep, args=(1,), timeout=0.2)
    time.sleep(0.5)
    return rref.to_here()


@scenario
def remote_timeout_then_to_here():
    return in_world_of_two(to_here_after_creation_timed_out)
