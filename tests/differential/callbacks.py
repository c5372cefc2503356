"""Futures and callbacks, and async_execution functions."""

import operator
import threading
import time

import harness
from harness import differs, same_type, scenario


PYBIND_TEXT = "torch's message is the list of overloads pybind11 makes up"


def fail(message):
    raise ValueError(message)


def returns_future():
    fut = harness.futures.Future()
    fut.set_result(5)
    return fut


def takes_future(fut):
    return fut.wait()


def async_add(to, x, y):
    return harness.rpc.rpc_async(to, operator.add, args=(x, y)).then(lambda fut: fut.wait() * 10)


def async_not_future():
    return 5


def async_fails_later():
    fut = harness.futures.Future()
    threading.Timer(0.1, lambda: fut.set_exception(ValueError("later"))).start()
    return fut


def async_chain(to, x):
    return harness.rpc.rpc_async(to, operator.neg, args=(x,)).then(lambda fut: fut.wait() - 1)


class AsyncOps:
    @staticmethod
    def static_add(to, x, y):
        return harness.rpc.rpc_async(to, operator.add, args=(x, y))

    @classmethod
    def class_add(cls, to, x, y):
        return harness.rpc.rpc_async(to, operator.add, args=(x, y))


def decorate():
    """async_execution is applied on import of this module on every rank, once the backend is
    known."""
    ae = harness.rpc.functions.async_execution
    global async_add, async_not_future, async_fails_later, async_chain
    async_add = ae(async_add)
    async_not_future = ae(async_not_future)
    async_fails_later = ae(async_fails_later)
    async_chain = ae(async_chain)
    AsyncOps.static_add = staticmethod(ae(AsyncOps.__dict__["static_add"].__func__))
    AsyncOps.class_add = classmethod(ae(AsyncOps.__dict__["class_add"].__func__))


if harness.rpc is not None:  # None where the module is imported only to read its scenarios
    decorate()


def show(fn):
    try:
        return ("ok", fn())
    except Exception as exc:
        return (type(exc).__name__,)


@same_type(PYBIND_TEXT)
def then_none():
    return harness.futures.Future().then(None)


@same_type(PYBIND_TEXT)
def add_done_callback_not_callable():
    return harness.futures.Future().add_done_callback(3)


@scenario
def collect_all_of_two_failures():
    a, b = harness.futures.Future(), harness.futures.Future()
    combined = harness.futures.collect_all([a, b])
    b.set_exception(KeyError("b failed first"))
    a.set_exception(ValueError("a failed second"))
    return combined.wait()


@scenario
def collect_all_of_values():
    a, b = harness.futures.Future(), harness.futures.Future()
    combined = harness.futures.collect_all([a, b])
    a.set_result(1)
    b.set_result(2)
    return [f.wait() for f in combined.wait()]


@scenario
def collect_all_empty():
    return harness.futures.collect_all([]).wait()


@scenario
def wait_all_with_a_failure():
    a, b = harness.futures.Future(), harness.futures.Future()
    threading.Timer(0.3, lambda: b.set_result(5)).start()
    a.set_exception(ValueError("first"))
    start = time.monotonic()
    return (show(lambda: harness.futures.wait_all([a, b])), time.monotonic() - start >= 0.25)


@scenario
def wait_all_of_rpcs():
    return harness.futures.wait_all([harness.rpc.rpc_async("w1", operator.add, args=(i, i)) for i in range(4)])


@scenario
def set_result_twice():
    done = harness.futures.Future()
    done.set_result(1)
    return done.set_result(2)


@scenario
def set_exception_not_an_exception():
    return harness.futures.Future().set_exception("oops")


@scenario
def value_of_pending_future():
    return show(lambda: harness.futures.Future().value())


@scenario
def done_and_value():
    fut = harness.futures.Future()
    before = fut.done()
    fut.set_result("v")
    return (before, fut.done(), fut.value(), fut.wait())


@scenario
def then_chain_of_rpc():
    fut = harness.rpc.rpc_async("w1", operator.add, args=(1, 2))
    return fut.then(lambda f: f.wait() * 2).then(lambda f: f.wait() + 1).wait()


@scenario
def then_callback_raises():
    fut = harness.futures.Future()
    chained = fut.then(lambda f: fail("in callback"))
    fut.set_result(1)
    return chained.wait()


@scenario
def then_sees_remote_error():
    fut = harness.rpc.rpc_async("w1", fail, args=("remote",))
    return fut.then(lambda f: show(f.wait)).wait()


@scenario
def add_done_callback_order():
    seen = []
    fut = harness.futures.Future()
    for i in range(3):
        fut.add_done_callback(lambda f, i=i: seen.append(i))
    fut.set_result(None)
    return seen


@scenario
def callback_on_completed_future_runs_at_once():
    seen = []
    fut = harness.futures.Future()
    fut.set_result(3)
    fut.add_done_callback(lambda f: seen.append(f.value()))
    return seen


@scenario
def rpc_future_done_after_wait():
    fut = harness.rpc.rpc_async("w2", operator.add, args=(1, 1))
    fut.wait()
    return fut.done()


@scenario
def function_returns_future_without_async_execution():
    return harness.rpc.rpc_sync("w1", returns_future)


@scenario
def future_as_argument():
    fut = harness.futures.Future()
    fut.set_result(1)
    return harness.rpc.rpc_sync("w1", takes_future, args=(fut,))


@scenario
def async_execution_sync():
    return harness.rpc.rpc_sync("w1", async_add, args=("w2", 1, 2))


@scenario
def async_execution_async():
    return harness.rpc.rpc_async("w1", async_chain, args=("w2", 5)).wait()


@scenario
def async_execution_remote():
    return harness.rpc.remote("w1", async_add, args=("w2", 3, 4)).to_here()


@scenario
def async_execution_not_a_future():
    return harness.rpc.rpc_sync("w1", async_not_future)


@differs("torch returns the failed future's exception as the call's value; we raise it", ours="ok ('ValueError',)")
def async_execution_fails_later():
    return show(lambda: harness.rpc.rpc_sync("w1", async_fails_later))


@scenario
def async_execution_static_method():
    return harness.rpc.rpc_sync("w1", AsyncOps.static_add, args=("w2", 2, 2))


@scenario
def async_execution_class_method():
    return harness.rpc.rpc_sync("w1", AsyncOps.class_add, args=("w2", 3, 3))


@scenario
def async_execution_marker():
    return hasattr(async_add, "_wrapped_async_rpc_function")
