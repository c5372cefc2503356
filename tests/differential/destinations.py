"""Destinations and WorkerInfo: every kind of ``to``, the worker look-ups, WorkerInfo's rules."""

import pickle

import harness
from harness import same_type, scenario


PYBIND_TEXT = "torch's message is the list of overloads pybind11 makes up"


def answer():
    return 1


def whoami():
    return str(harness.rpc.get_worker_info())


def call(to):
    return harness.rpc.rpc_sync(to, whoami)


@scenario
def to_own_name():
    return call("w0")


@scenario
def to_peer_name():
    return call("w1")


@scenario
def to_peer_rank():
    return call(2)


@scenario
def to_own_rank():
    return call(0)


@scenario
def to_worker_info():
    return call(harness.rpc.get_worker_info("w2"))


@scenario
def to_true():
    return call(True)


@scenario
def to_false():
    return call(False)


@scenario
def to_rank_out_of_range():
    return call(5)


@scenario
def to_negative_rank():
    return call(-1)


@scenario
def to_unknown_name():
    return call("nobody")


@scenario
def to_float():
    return call(1.5)


@scenario
def to_none():
    return call(None)


@scenario
def to_bytes():
    return call(b"w1")


@scenario
def to_worker_info_wrong_id():
    return call(harness.rpc.WorkerInfo("w1", 7))


@scenario
def to_worker_info_unknown_name():
    return call(harness.rpc.WorkerInfo("nobody", 0))


@scenario
def get_worker_info_self():
    info = harness.rpc.get_worker_info()
    return (info.name, info.id, str(info), repr(info))


@scenario
def get_worker_info_unknown():
    return harness.rpc.get_worker_info("nobody")


@scenario
def get_worker_info_equal_and_hashable():
    a, b = harness.rpc.get_worker_info("w1"), harness.rpc.get_worker_info("w1")
    return (a == b, hash(a) == hash(b), a == harness.rpc.get_worker_info("w2"), len({a, b}))


@scenario
def worker_info_travels():
    info = harness.rpc.rpc_sync("w1", harness.rpc.get_worker_info)
    return (info.name, info.id)


@scenario
def worker_info_pickles():
    info = pickle.loads(pickle.dumps(harness.rpc.WorkerInfo("w9", 9)))
    return (info.name, info.id)


@scenario
def worker_info_bad_characters():
    return harness.rpc.WorkerInfo("bad name!", 0)


@scenario
def worker_info_empty_name():
    return harness.rpc.WorkerInfo("", 0)


@scenario
def worker_info_name_127_chars():
    return len(harness.rpc.WorkerInfo("a" * 127, 0).name)


@scenario
def worker_info_name_128_chars():
    return harness.rpc.WorkerInfo("a" * 128, 0)


@same_type(PYBIND_TEXT)
def worker_info_id_not_int():
    return harness.rpc.WorkerInfo("w", "1")


@scenario
def worker_info_allowed_punctuation():
    return harness.rpc.WorkerInfo("a-b_c:d", 3).name
