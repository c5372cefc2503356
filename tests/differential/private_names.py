"""The private names torch's own tests and real code use, all-gather and barriers, options and
the backend registry."""

import operator
import pickle

import harness
from errors import KEEPS_TYPE
from harness import differs, scenario


def agent_view():
    agent = harness.rpc._get_current_rpc_agent()
    return (str(agent.get_worker_info()), sorted(str(w) for w in agent.get_worker_infos()))


@scenario
def current_agent_worker_infos():
    return agent_view()


@scenario
def current_agent_on_a_peer():
    return harness.rpc.rpc_sync("w2", agent_view)


@scenario
def current_agent_worker_info_by_name_and_id():
    agent = harness.rpc._get_current_rpc_agent()
    return (str(agent.get_worker_info("w1")), str(agent.get_worker_info(2)))


@scenario
def current_agent_is_tensorpipe_agent():
    agent = harness.rpc._get_current_rpc_agent()
    return (isinstance(agent, harness.rpc.TensorPipeAgent), isinstance(agent, harness.rpc.RpcAgent))


@scenario
def current_agent_set():
    return harness.rpc._is_current_rpc_agent_set()


@scenario
def debug_info_keys():
    info = harness.rpc._get_debug_info()
    return (type(info).__name__, info["num_owner_rrefs"], info["agent.thread_pool_size"])


@scenario
def set_rpc_timeout():
    harness.rpc._set_rpc_timeout(12.5)
    try:
        return harness.rpc.get_rpc_timeout()
    finally:
        harness.rpc._set_rpc_timeout(60)


@scenario
def default_constants():
    rpc = harness.rpc
    return (rpc._DEFAULT_RPC_TIMEOUT_SEC, rpc._DEFAULT_NUM_WORKER_THREADS, rpc._DEFAULT_INIT_METHOD, rpc._UNSET_RPC_TIMEOUT, rpc.api.DEFAULT_SHUTDOWN_TIMEOUT, rpc.constants.DEFAULT_RPC_TIMEOUT_SEC)


@scenario
def to_worker_info():
    api = harness.rpc.api
    return (str(api._to_worker_info("w1")), str(api._to_worker_info(2)), str(api._to_worker_info(harness.rpc.WorkerInfo("x", 9))))


@scenario
def to_worker_info_float():
    return harness.rpc.api._to_worker_info(1.5)


@scenario
def wait_all_context_manager():
    with harness.rpc.api._wait_all():
        futs = [harness.rpc.rpc_async("w1", operator.add, args=(i, 1)) for i in range(3)]
    return [f.done() for f in futs]


@differs(KEEPS_TYPE, ours="ZeroDivisionError: ZeroDivisionError: On WorkerInfo(id=1, name=w1):\\nZeroDivisionError('division by zero')\\nTraceback (most recent call last):\\n  ...\\nZeroDivisionError: division by zero\\n")
def wait_all_context_manager_failure():
    with harness.rpc.api._wait_all():
        harness.rpc.rpc_async("w1", operator.truediv, args=(1, 0))


def all_gather_value(value):
    return harness.rpc.api._all_gather(value)


@differs("torch's all-gather started by RPCs on the followers never completes (it times out after 60 s)", ours="ok ([('w0', 0), ('w1', 10), ('w2', 20)], [[('w0', 0), ('w1', 10), ('w2', 20)], [('w0', 0), ('w1', 10), ('w2', 20)]])", torch_hangs=True)
def all_gather_from_everyone():
    futs = [harness.rpc.rpc_async(f"w{i}", all_gather_value, args=(i * 10,)) for i in (1, 2)]
    mine = harness.rpc.api._all_gather(0)
    return (sorted(mine.items()), [sorted(f.wait().items()) for f in futs])


def barrier(names):
    harness.rpc.api._barrier(names)
    return "passed"


@scenario
def barrier_of_two():
    fut = harness.rpc.rpc_async("w1", barrier, args=(["w0", "w1"],))
    harness.rpc.api._barrier(["w0", "w1"])
    return fut.wait()


@scenario
def future_pickled():
    return pickle.dumps(harness.futures.Future())


@scenario
def future_set_unwrap_func():
    fut = harness.futures.Future()
    fut._set_unwrap_func(lambda v: v * 2)
    fut.set_result(21)
    return fut.wait()


@scenario
def backend_registered():
    return (harness.rpc.backend_registry.backend_registered("TENSORPIPE"), harness.rpc.backend_registry.backend_registered("NOPE"))


@scenario
def backend_type_names():
    return [b.name for b in harness.rpc.BackendType]


@scenario
def register_backend_twice():
    reg = harness.rpc.backend_registry
    return reg.register_backend("TENSORPIPE", lambda *a: None, lambda *a: None)


@scenario
def options_fields():
    opts = harness.rpc.TensorPipeRpcBackendOptions()
    return (opts.rpc_timeout, opts.init_method, opts.num_worker_threads, opts.device_maps, opts.devices)


@scenario
def options_rpc_timeout_set():
    opts = harness.rpc.TensorPipeRpcBackendOptions(rpc_timeout=5, num_worker_threads=4)
    return (opts.rpc_timeout, opts.num_worker_threads)


@scenario
def options_num_worker_threads_zero():
    return harness.rpc.TensorPipeRpcBackendOptions(num_worker_threads=0)


@scenario
def options_num_worker_threads_negative():
    return harness.rpc.TensorPipeRpcBackendOptions(num_worker_threads=-3)


@differs("the error names the option and what it got; torch's is pybind11's list of signatures", ours="TypeError: num_worker_threads must be an int, got str '4'")
def options_num_worker_threads_text():
    return harness.rpc.TensorPipeRpcBackendOptions(num_worker_threads="4")


@differs("the error names the option and what it got; torch's is pybind11's list of signatures", ours="TypeError: num_worker_threads must be an int, got float 4.0")
def options_num_worker_threads_float():
    return harness.rpc.TensorPipeRpcBackendOptions(num_worker_threads=4.0)


@scenario
def options_rpc_timeout_negative():
    return harness.rpc.TensorPipeRpcBackendOptions(rpc_timeout=-5)


@scenario
def options_rpc_timeout_nan():
    return harness.rpc.TensorPipeRpcBackendOptions(rpc_timeout=float("nan"))


@scenario
def options_rpc_timeout_infinite():
    return harness.rpc.TensorPipeRpcBackendOptions(rpc_timeout=float("inf")).rpc_timeout


@differs("the error names the option and what it got; torch's is pybind11's list of signatures", ours="TypeError: rpc_timeout must be a number of seconds, got str '5'")
def options_rpc_timeout_text():
    return harness.rpc.TensorPipeRpcBackendOptions(rpc_timeout="5")


@differs("the error names the option and what it got; torch's is pybind11's list of signatures", ours="TypeError: rpc_timeout must be a number of seconds, got NoneType None")
def options_rpc_timeout_none():
    return harness.rpc.TensorPipeRpcBackendOptions(rpc_timeout=None)


@differs("the error names the option and what it got; torch's is pybind11's list of signatures", ours="TypeError: init_method must be a str, got int 5")
def options_init_method_not_text():
    return harness.rpc.TensorPipeRpcBackendOptions(init_method=5)


@differs("device maps keep the device names given (CPU only); torch makes torch.device objects, which would need torch imported", ours="ok {'w1': {'cpu': 'cpu'}}")
def options_set_device_map_cpu():
    opts = harness.rpc.TensorPipeRpcBackendOptions()
    opts.set_device_map("w1", {"cpu": "cpu"})
    return opts.device_maps


@scenario
def options_is_rpc_backend_options():
    return isinstance(harness.rpc.TensorPipeRpcBackendOptions(), harness.rpc.RpcBackendOptions)


@scenario
def is_available():
    return harness.rpc.is_available()
