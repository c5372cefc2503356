"""torch's parameter-server pattern, run as __main__ on both workers: functions and classes
defined in __main__ go by reference and are resolved in the callee's own __main__, so the
callee uses its own globals (a lock, a lazily made server), its own classes and Enum members,
and module state that persists across calls. Lambdas and closures still go by value. A name
only the caller's __main__ has fails with an error naming it and the callee."""

import enum
import json
import os
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import numpy as np  # noqa: E402

import tensorplay_rpc as rpc  # noqa: E402

param_server = None
global_lock = threading.Lock()
bumps = []
BIG = np.zeros(4 << 20, dtype=np.uint8)  # 4 MiB that a by-value function would carry


class ParameterServer:
    def __init__(self):
        self.made_on = rpc.get_worker_info().name
        self.calls = 0

    def step(self):
        self.calls += 1
        return self.calls


def get_parameter_server():
    global param_server
    with global_lock:
        if not param_server:
            param_server = ParameterServer()
        return param_server


def step_server():
    server = get_parameter_server()
    return server.made_on, server.step()


def bump():
    bumps.append(len(bumps) + 1)
    return list(bumps)


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Point:
    def __init__(self, x):
        self.x = x


def inspect(point, color):
    return isinstance(point, Point), type(point) is Point, color is Color.RED, point.x


def mark_big(value):
    BIG[0] = value
    return int(BIG[0])


def read_big():
    return int(BIG[0])


def make_scaler(factor):
    def scale(x):
        return x * factor

    return scale


rank = int(os.environ["RANK"])
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)

if rank == 0:

    def only_on_the_caller():  # the callee's __main__ never runs this line
        return "unreachable"

    out = {}
    out["server"] = [rpc.rpc_sync("worker1", step_server) for _ in range(3)]
    out["server_async"] = rpc.rpc_async("worker1", step_server).wait()
    out["bumps"] = [rpc.rpc_sync("worker1", bump) for _ in range(3)][-1]
    out["bumps_here"] = bumps
    out["inspect"] = rpc.rpc_sync("worker1", inspect, args=(Point(5), Color.RED))
    out["returned_enum_is_ours"] = rpc.rpc_sync("worker1", Color, args=(2,)) is Color.GREEN
    out["returned_instance_is_ours"] = type(rpc.rpc_sync("worker1", Point, args=(3,))) is Point
    sent_before = rpc.api.metrics()["peers"][1]["bytes_sent"]
    out["big_marked"] = rpc.rpc_sync("worker1", mark_big, args=(7,))
    out["big_read"] = rpc.rpc_sync("worker1", read_big)
    out["big_here"] = int(BIG[0])
    out["bytes_for_two_calls"] = rpc.api.metrics()["peers"][1]["bytes_sent"] - sent_before
    out["lambda"] = rpc.rpc_sync("worker1", lambda x: x + 1, args=(41,))
    out["closure"] = rpc.rpc_sync("worker1", make_scaler(3), args=(5,))
    rref = rpc.remote("worker1", get_parameter_server)
    out["rref_proxy"] = rref.rpc_sync().step()
    try:
        rpc.rpc_sync("worker1", only_on_the_caller)
        out["missing"] = None
    except Exception as exc:
        out["missing"] = [type(exc).__name__, str(exc)]
    print("RESULT " + json.dumps(out))

rpc.shutdown()
