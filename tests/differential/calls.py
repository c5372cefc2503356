"""Calls: arguments, results, timeouts, what cannot be sent."""

import operator
import threading
import time

import harness
from harness import differs, scenario


TIMEOUT_TEXT = "our timeout error also names the worker that did not answer; torch's starts with an internal code, RPCErr:1:"


def echo(*args, **kwargs):
    return args, kwargs


def sleep_then(seconds, value):
    time.sleep(seconds)
    return value


def unpicklable_result():
    return threading.Lock()


def nested_call(to, value):
    return harness.rpc.rpc_sync(to, echo, args=(value,))


@scenario
def args_and_kwargs():
    return harness.rpc.rpc_sync("w1", echo, args=(1, "two"), kwargs={"three": 3.0})


@scenario
def args_as_list():
    return harness.rpc.rpc_sync("w1", echo, args=[1, 2])


@scenario
def no_args():
    return harness.rpc.rpc_sync("w1", echo)


@scenario
def builtin_function():
    return harness.rpc.rpc_sync("w1", operator.add, args=(2, 3))


@scenario
def builtin_method():
    return harness.rpc.rpc_sync("w1", max, args=([3, 9, 4],))


@scenario
def rpc_async_value():
    return harness.rpc.rpc_async("w2", operator.mul, args=(6, 7)).wait()


@scenario
def many_async_in_order():
    futs = [harness.rpc.rpc_async(f"w{1 + i % 2}", operator.add, args=(i, 1)) for i in range(20)]
    return [f.wait() for f in futs]


@scenario
def nested_rpc_on_callee():
    return harness.rpc.rpc_sync("w1", nested_call, args=("w2", "x"))


@scenario
def call_back_to_caller():
    return harness.rpc.rpc_sync("w1", nested_call, args=("w0", "back"))


@scenario
def big_bytes_result():
    data = harness.rpc.rpc_sync("w1", echo, args=(b"\x07" * (1 << 20),))[0][0]
    return (len(data), data[:2], type(data).__name__)


@scenario
def func_not_callable():
    return harness.rpc.rpc_sync("w1", 42)


@scenario
def args_not_a_tuple():
    return harness.rpc.rpc_sync("w1", echo, args=5)


@scenario
def kwargs_not_a_dict():
    return harness.rpc.rpc_sync("w1", echo, kwargs=[("a", 1)])


@scenario
def unpicklable_argument():
    return harness.rpc.rpc_sync("w1", echo, args=(threading.Lock(),))


@scenario
def unpicklable_result_on_callee():
    return harness.rpc.rpc_sync("w1", unpicklable_result)


@differs(
    "lambdas and closures travel by value (cloudpickle), as Ray's tasks do; torch's pickler refuses them",
    ours="ok 7",
)
def lambda_by_value():
    return harness.rpc.rpc_sync("w1", lambda x: x + 2, args=(5,))


@differs(TIMEOUT_TEXT, ours='RuntimeError: RPC ran for more than set timeout (300 ms) and will now be marked with an error: the call to worker w1 timed out')
def timeout_sync():
    return harness.rpc.rpc_sync("w1", sleep_then, args=(2, "late"), timeout=0.3)


@differs(TIMEOUT_TEXT, ours='RuntimeError: RPC ran for more than set timeout (300 ms) and will now be marked with an error: the call to worker w1 timed out')
def timeout_async():
    return harness.rpc.rpc_async("w1", sleep_then, args=(2, "late"), timeout=0.3).wait()


@scenario
def timeout_zero_means_none():
    return harness.rpc.rpc_sync("w1", sleep_then, args=(0.5, "waited"), timeout=0)


@scenario
def timeout_not_reached():
    return harness.rpc.rpc_sync("w1", sleep_then, args=(0.1, "in time"), timeout=5)


@scenario
def default_timeout():
    return harness.rpc.get_rpc_timeout()


@scenario
def remote_to_here_value():
    return harness.rpc.remote("w1", operator.add, args=(40, 2)).to_here()


@scenario
def remote_timeout():
    return harness.rpc.remote("w1", sleep_then, args=(2, "late"), timeout=0.3).to_here()


BAD_TIMEOUT = "the error names the timeout and what it got; torch's is pybind11's list of signatures"


@differs(BAD_TIMEOUT, ours="TypeError: timeout must be a number of seconds, got str '1'")
def timeout_as_text():
    return harness.rpc.rpc_sync("w1", operator.add, args=(2, 3), timeout="1")


@differs(BAD_TIMEOUT, ours="TypeError: timeout must be a number of seconds, got NoneType None")
def timeout_none():
    return harness.rpc.rpc_async("w1", operator.add, args=(2, 3), timeout=None).wait()


@differs("torch takes NaN for a deadline already past and fails the call naming a timeout of -2147483648 ms; we refuse it before sending", ours="ValueError: timeout must be a number of seconds, got nan")
def timeout_nan():
    return harness.rpc.rpc_sync("w1", operator.add, args=(2, 3), timeout=float("nan"))


@differs("torch's to_here() of a remote() given a NaN timeout never returns; we refuse it before sending", ours="ValueError: timeout must be a number of seconds, got nan", torch_hangs=True)
def timeout_nan_remote():
    return harness.rpc.remote("w1", operator.add, args=(2, 3), timeout=float("nan")).to_here()


@scenario
def timeout_zero_is_none():
    return harness.rpc.rpc_sync("w1", sleep_then, args=(0.2, "slept"), timeout=0)
