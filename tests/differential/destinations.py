"""Scenario run once on torch.distributed.rpc and once on tensorplay_rpc (the backend module is
the first argument): a one-worker world, calls to destinations of every kind. Prints one line
per destination: what came back or what was raised, type and message."""

import importlib
import os
import sys


def answer():
    return 1


def main() -> None:
    rpc = importlib.import_module(sys.argv[1])
    rpc.init_rpc("w0", rank=0, world_size=1, rpc_backend_options=rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{sys.argv[2]}"))
    me = rpc.get_worker_info()
    for to in [0, "w0", me, True, False, 5, -1, "nobody", 1.5, None, b"w0", rpc.WorkerInfo("w0", 3), rpc.WorkerInfo("nobody", 0)]:
        try:
            outcome = f"ok {rpc.rpc_sync(to, answer)}"
        except Exception as exc:  # the outcome is what is compared
            outcome = f"{type(exc).__name__}: {exc}"
        print(f"{to!r}\t{outcome}", flush=True)
    rpc.shutdown()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
