"""RRefs: local and remote ones, their proxies, passing them around."""

import operator
import pickle
import time

import harness
from harness import scenario


class Counter:
    def __init__(self, start):
        self.count = start

    def add(self, n):
        self.count += n
        return self.count

    def get(self):
        return self.count


def fail(message):
    raise ValueError(message)


def fetch(rref):
    return rref.to_here()


def owner_name_of(rref):
    return (rref.owner_name(), rref.is_owner())


def make_local_rref(value):
    return harness.rpc.RRef(value)


@scenario
def local_rref():
    rref = harness.rpc.RRef([1, 2])
    return (rref.is_owner(), rref.owner_name(), rref.local_value(), rref.to_here(), rref.confirmed_by_owner())


@scenario
def remote_rref_basics():
    rref = harness.rpc.remote("w1", operator.add, args=(1, 2))
    return (rref.is_owner(), rref.owner_name(), str(rref.owner()), rref.to_here())


@scenario
def local_value_on_user():
    rref = harness.rpc.remote("w1", operator.add, args=(1, 2))
    rref.to_here()
    return rref.local_value()


@scenario
def rref_as_argument():
    rref = harness.rpc.remote("w1", operator.mul, args=(3, 5))
    return harness.rpc.rpc_sync("w2", fetch, args=(rref,))


@scenario
def rref_back_to_its_owner():
    rref = harness.rpc.remote("w1", operator.mul, args=(3, 5))
    return harness.rpc.rpc_sync("w1", owner_name_of, args=(rref,))


@scenario
def rref_returned_from_call():
    rref = harness.rpc.rpc_sync("w1", make_local_rref, args=("made on w1",))
    return (rref.owner_name(), rref.is_owner(), rref.to_here())


@scenario
def rref_failed_creation():
    return harness.rpc.remote("w1", fail, args=("no value",)).to_here()


@scenario
def rref_proxy_rpc_sync():
    rref = harness.rpc.remote("w1", Counter, args=(10,))
    return (rref.rpc_sync().add(5), rref.rpc_sync().get())


@scenario
def rref_proxy_rpc_async():
    rref = harness.rpc.remote("w1", Counter, args=(1,))
    return rref.rpc_async().add(2).wait()


@scenario
def rref_proxy_remote():
    rref = harness.rpc.remote("w1", Counter, args=(7,))
    return rref.remote().add(1).to_here()


@scenario
def rref_proxy_on_local_rref():
    rref = harness.rpc.RRef(Counter(4))
    return rref.rpc_sync().add(4)


@scenario
def rref_proxy_missing_method_sync():
    rref = harness.rpc.remote("w1", Counter, args=(0,))
    return rref.rpc_sync().missing_method()


@scenario
def rref_proxy_missing_method_async():
    rref = harness.rpc.remote("w1", Counter, args=(0,))
    return rref.rpc_async().missing_method().wait()


@scenario
def rref_proxy_missing_method_remote():
    rref = harness.rpc.remote("w1", Counter, args=(0,))
    return rref.remote().missing_method().to_here()


@scenario
def rref_proxy_method_raises():
    rref = harness.rpc.remote("w1", Counter, args=(0,))
    return rref.rpc_sync().add("not a number")


@scenario
def rref_pickled_outside_a_call():
    return pickle.dumps(harness.rpc.RRef(1))


@scenario
def rref_get_type_local():
    return harness.rpc.RRef(3)._get_type()


@scenario
def rref_get_type_remote():
    return harness.rpc.remote("w1", Counter, args=(0,))._get_type()


@scenario
def rref_get_future():
    rref = harness.rpc.remote("w1", operator.add, args=(1, 1))
    return rref._get_future().wait()


@scenario
def rref_to_here_with_timeout():
    return harness.rpc.remote("w1", operator.add, args=(2, 2)).to_here(timeout=5)


@scenario
def rref_many_forks():
    rref = harness.rpc.remote("w1", operator.add, args=(20, 1))
    return [harness.rpc.rpc_sync(f"w{i % 3}", fetch, args=(rref,)) for i in range(6)]


@scenario
def rref_is_pyrref():
    return isinstance(harness.rpc.RRef(1), harness.rpc.PyRRef)
