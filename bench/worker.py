"""One rank of a benchmark world: ``worker.py SYSTEM WORKLOAD OUTFILE [ARGS...]``.

SYSTEM is ``tensorplay`` (tensorplay_rpc, its transports as bench.py pins them) or ``torch``
(torch.distributed.rpc): both take the same script. RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from the environment. Rank 0
measures and writes its results as JSON to OUTFILE.
"""

import json
import os
import sys
import time

import numpy as np

from common import Counter, add, echo, idle_cpu_percent, make_payload, percentiles, sink, start_peak, stop_peak

SYSTEM, WORKLOAD, OUTFILE, *ARGS = sys.argv[1:]
if SYSTEM.startswith("torch"):
    import torch.distributed.rpc as rpc
else:
    import tensorplay_rpc as rpc

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])


def w_small(out):
    for _ in range(300):
        rpc.rpc_sync("w1", add, args=(1, 2))
    samples = []
    start = time.perf_counter()
    for _ in range(3000):
        t0 = time.perf_counter()
        rpc.rpc_sync("w1", add, args=(1, 2))
        samples.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    p50, p99 = percentiles(samples)
    out.update(sync_p50_us=p50 * 1e6, sync_p99_us=p99 * 1e6, sync_calls_per_s=len(samples) / elapsed)
    for inflight in (64, 256):
        rounds = max(4, 8192 // inflight)
        start = time.perf_counter()
        for _ in range(rounds):
            futs = [rpc.rpc_async("w1", add, args=(1, 2)) for _ in range(inflight)]
            for f in futs:
                f.wait()
        out[f"async{inflight}_calls_per_s"] = rounds * inflight / (time.perf_counter() - start)


def w_payload(out, kinds, sizes):
    for kind in kinds.split(","):
        for size in [int(s) for s in sizes.split(",")]:
            payload = make_payload(kind, size)
            reps = int(min(200, max(3, (256 << 20) // size)))
            for mode, fn in (("oneway", sink), ("echo", echo)):
                rpc.rpc_sync("w1", fn, args=(payload,))
                start = time.perf_counter()
                for _ in range(reps):
                    rpc.rpc_sync("w1", fn, args=(payload,))
                elapsed = time.perf_counter() - start
                moved = size * reps * (2 if mode == "echo" else 1)
                out[f"{mode}_{kind}_{size}_GBps"] = moved / elapsed / 1e9


def w_rref(out):
    for _ in range(100):
        rpc.remote("w1", add, args=(1, 2)).to_here()
    samples = []
    for _ in range(1000):
        t0 = time.perf_counter()
        rpc.remote("w1", add, args=(1, 2)).to_here()
        samples.append(time.perf_counter() - t0)
    out["remote_to_here_p50_us"] = percentiles(samples)[0] * 1e6
    counter = rpc.remote("w1", Counter)
    counter.rpc_sync().inc()
    samples = []
    for _ in range(1000):
        t0 = time.perf_counter()
        counter.rpc_sync().inc()
        samples.append(time.perf_counter() - t0)
    out["rref_method_p50_us"] = percentiles(samples)[0] * 1e6
    del counter


def fanin_client(seconds=3.0):
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        futs = [rpc.rpc_async("w0", add, args=(1, 2)) for _ in range(64)]
        for f in futs:
            f.wait()
        done += 64
    return done / (time.perf_counter() - start)


def w_contention(out):
    """p99 of small calls while a 256 MiB transfer to the same peer is in flight."""
    big = np.ones(256 << 20, dtype=np.uint8)
    rpc.rpc_sync("w1", sink, args=(np.ones(1 << 20, dtype=np.uint8),))
    fut = rpc.rpc_async("w1", sink, args=(big,))
    samples = []
    while not fut.done() and len(samples) < 5000:
        t0 = time.perf_counter()
        rpc.rpc_sync("w1", add, args=(1, 2))
        samples.append(time.perf_counter() - t0)
    fut.wait()
    out["during_transfer_calls"] = len(samples)
    if samples:
        out["during_transfer_p99_ms"] = percentiles(samples)[1] * 1e3


def w_rss(out):
    size = 128 << 20
    payload = np.ones(size, dtype=np.uint8)
    rpc.rpc_sync("w1", echo, args=(np.ones(1 << 20, dtype=np.uint8),))
    idle_callee = rpc.rpc_sync("w1", start_peak)
    idle_caller = start_peak()
    for _ in range(3):
        back = rpc.rpc_sync("w1", echo, args=(payload,))
        del back
    caller_peak = stop_peak()
    callee_peak = rpc.rpc_sync("w1", stop_peak)
    # The caller's idle RSS is measured with the payload already allocated.
    out["rss_caller_over_payload"] = (caller_peak - idle_caller) * 1024 / size
    out["rss_callee_over_payload"] = (callee_peak - idle_callee) * 1024 / size


def w_training(out):
    """Training steps per second of torch's distributed RNN and parameter-server tutorials
    (median and mean of per-step times)."""
    import statistics

    import training

    if SYSTEM.startswith("torch"):
        import torch.distributed.autograd as dist_autograd
        from torch.distributed.optim import DistributedOptimizer
    else:
        import tensorplay_rpc.autograd as dist_autograd
        from tensorplay_rpc.optim import DistributedOptimizer
    for name, run in (("rnn", training.rnn_step_times), ("ps", training.parameter_server_step_times)):
        samples = run(rpc, dist_autograd, DistributedOptimizer)
        out[f"{name}_steps_per_s_p50"] = 1 / statistics.median(samples)
        out[f"{name}_steps_per_s_mean"] = len(samples) / sum(samples)


def w_idle(out):
    rpc.rpc_sync("w1", add, args=(1, 2))
    out["idle_cpu_percent"] = rpc.rpc_sync("w1", idle_cpu_percent)


def main():
    out = {}
    # perf_counter is CLOCK_MONOTONIC, one clock for every process on the host: bench.py times
    # a world's init from the last rank's call, not from the first rank that finished importing.
    out["init_called_at"] = time.perf_counter()
    rpc.init_rpc(f"w{RANK}", rank=RANK, world_size=WORLD, rpc_backend_options=rpc.TensorPipeRpcBackendOptions(rpc_timeout=300))
    out["init_returned_at"] = time.perf_counter()
    if WORKLOAD == "fanin":
        if RANK > 0:
            out["calls_per_s"] = fanin_client()
    elif RANK == 0:
        {"small": w_small, "payload": w_payload, "rref": w_rref, "contention": w_contention, "rss": w_rss, "idle": w_idle, "training": w_training, "init": lambda o: None}[WORKLOAD](out, *ARGS)
    t0 = time.perf_counter()
    rpc.shutdown()
    out["shutdown_s"] = time.perf_counter() - t0
    with open(OUTFILE, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
