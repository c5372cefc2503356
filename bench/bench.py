"""`make bench`: tensorplay_rpc over each transport, torch.distributed.rpc and a raw-TCP floor,
measured in one run on this machine with real worker processes on loopback.

``tensorplay`` is our default (shared memory between workers on one host, as here);
``tensorplay-tcp`` pins TENSORPLAY_RPC_TRANSPORTS=tcp, our path between hosts, and
``tensorplay-grpc`` pins gRPC. torch runs with its default transports (shared memory included).

Prints a table of values and ratios, writes bench/out/results.json and draws
bench/out/bench.png. Every world is ended by PID if it outlives its time limit.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "out")
SIZES = [1 << 10, 1 << 20, 16 << 20, 128 << 20]
TRAINING_ROUNDS = 3
KINDS = ["numpy", "bytes", "tensor"]
# What each system runs as: the worker script's system argument and its environment.
SYSTEMS = {
    "tensorplay": ("tensorplay", {"TENSORPLAY_RPC_TRANSPORTS": "shm,grpc"}),
    "tensorplay-grpc": ("tensorplay", {"TENSORPLAY_RPC_TRANSPORTS": "grpc"}),
    "tensorplay-tcp": ("tensorplay", {"TENSORPLAY_RPC_TRANSPORTS": "tcp"}),
    "torch": ("torch", {}),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(system, workload, world_size, args=(), timeout=600):
    """Run one benchmark world; returns each rank's JSON results."""
    script_system, system_env = SYSTEMS[system]
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="tensorplay-bench-")
    procs, outs = [], []
    for rank in range(world_size):
        out = os.path.join(tmp, f"{rank}.json")
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size), **system_env)
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py"), script_system, workload, out, *args],
                                      cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        outs.append(out)
    return _collect(procs, outs, timeout, f"{system} {workload}")


def _collect(procs, outs, timeout, what):
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    results = []
    for p, out in zip(procs, outs):
        if p.returncode != 0 or not os.path.exists(out):
            err = p.stderr.read().decode(errors="replace")[-2000:] if p.stderr else ""
            raise RuntimeError(f"{what}: a rank failed (exit {p.returncode})\n{err}")
        with open(out) as f:
            results.append(json.load(f))
    return results


def run_rawtcp(kinds, sizes, timeout=600):
    port = free_port()
    out = os.path.join(tempfile.mkdtemp(prefix="tensorplay-bench-"), "raw.json")
    server = subprocess.Popen([sys.executable, os.path.join(HERE, "rawtcp.py"), "server", str(port)], cwd=HERE, stderr=subprocess.PIPE)
    client = subprocess.Popen([sys.executable, os.path.join(HERE, "rawtcp.py"), "client", str(port), kinds, sizes, out], cwd=HERE, stderr=subprocess.PIPE)
    return _collect([client, server], [out, out], timeout, "raw tcp")[0]


def measure(systems, quick):
    sizes = SIZES[:3] if quick else SIZES
    size_arg = ",".join(str(s) for s in sizes)
    res = {}
    for system in systems:
        r = {}
        print(f"[{system}] small calls", flush=True)
        r.update(run_world(system, "small", 2)[0])
        print(f"[{system}] payloads", flush=True)
        r.update(run_world(system, "payload", 2, args=(",".join(KINDS), size_arg))[0])
        print(f"[{system}] remote and rref methods", flush=True)
        r.update(run_world(system, "rref", 2)[0])
        for n in (2, 4, 8):
            print(f"[{system}] init world of {n}", flush=True)
            ranks = run_world(system, "init", n)
            # From the moment the last rank called init_rpc until every rank has returned: the
            # ranks start importing at once, and on two cores the last one can finish importing
            # torch a second after the first, which a rank's own init time would count.
            r[f"init{n}_s"] = max(x["init_returned_at"] for x in ranks) - max(x["init_called_at"] for x in ranks)
            r[f"shutdown{n}_s"] = max(x["shutdown_s"] for x in ranks)
        print(f"[{system}] fan-in", flush=True)
        r["fanin_calls_per_s"] = sum(x.get("calls_per_s", 0) for x in run_world(system, "fanin", 4))
        print(f"[{system}] small calls during a 256 MiB transfer", flush=True)
        r.update(run_world(system, "contention", 2)[0])
        print(f"[{system}] peak RSS of a 128 MiB echo", flush=True)
        r.update(run_world(system, "rss", 2)[0])
        print(f"[{system}] idle CPU", flush=True)
        r.update(run_world(system, "idle", 2)[0])
        res[system] = r
    # Training steps swing with this VM's phase over minutes: the systems take turns, three
    # rounds, and each keeps the median of its rounds.
    runs = {system: [] for system in systems}
    for round_ in range(TRAINING_ROUNDS):
        for system in systems:
            print(f"[{system}] training steps (distributed RNN, parameter server), round {round_ + 1}", flush=True)
            runs[system].append(run_world(system, "training", 2)[0])
    for system, rounds in runs.items():
        for key in rounds[0]:
            if "steps_per_s" in key:
                res[system][key] = statistics.median(r[key] for r in rounds)
    print("[raw tcp] floor", flush=True)
    res["rawtcp"] = run_rawtcp(",".join(KINDS), size_arg)
    res["rawtcp"]["memcpy_GBps"] = memcpy_gbps()
    return res, sizes


def memcpy_gbps(size=128 << 20, reps=5):
    """The best of a few copies of a 128 MiB array into memory already touched."""
    import numpy as np

    src, dst = np.ones(size, dtype=np.uint8), np.zeros(size, dtype=np.uint8)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return size / best / 1e9


# (label, metric, system, test(value, torch's value)): the targets of issue 10, as ratios
# measured in one run.
TARGETS = [
    ("small-call p50 <= 1/3 of torch", "sync_p50_us", "tensorplay", lambda a, b: a <= b / 3),
    ("rpc_async calls/s (64 in flight) >= 3x torch", "async64_calls_per_s", "tensorplay", lambda a, b: a >= 3 * b),
    ("remote()+to_here() p50 <= 1/2 of torch", "remote_to_here_p50_us", "tensorplay", lambda a, b: a <= b / 2),
    ("[tcp] small-call p50 <= torch", "sync_p50_us", "tensorplay-tcp", lambda a, b: a <= b),
    ("[grpc] small-call p50 <= torch", "sync_p50_us", "tensorplay-grpc", lambda a, b: a <= b),
    # Issue 37: training steps of torch's RPC tutorials, at least torch's, on one host and over
    # the network path (pinned to it on this one host).
    ("distributed RNN steps/s (p50) >= torch", "rnn_steps_per_s_p50", "tensorplay", lambda a, b: a >= b),
    ("[tcp] distributed RNN steps/s (p50) >= torch", "rnn_steps_per_s_p50", "tensorplay-tcp", lambda a, b: a >= b),
    ("[grpc] distributed RNN steps/s (p50) >= torch", "rnn_steps_per_s_p50", "tensorplay-grpc", lambda a, b: a >= b),
    ("parameter-server steps/s (p50) >= torch", "ps_steps_per_s_p50", "tensorplay", lambda a, b: a >= b),
    ("[tcp] parameter-server steps/s (p50) >= torch", "ps_steps_per_s_p50", "tensorplay-tcp", lambda a, b: a >= b),
    ("[grpc] parameter-server steps/s (p50) >= torch", "ps_steps_per_s_p50", "tensorplay-grpc", lambda a, b: a >= b),
]
# Kept from before, on every transport.
KEPT = [
    ("init_rpc of 8 <= 1/2 of torch", "init8_s", lambda a, t: t is not None and a <= t / 2),
    ("small-call p99 during a 256 MiB transfer < 20 ms", "during_transfer_p99_ms", lambda a, t: a < 20),
    ("caller peak RSS in a 128 MiB echo <= 3x payload", "rss_caller_over_payload", lambda a, t: a <= 3),
    ("callee peak RSS in a 128 MiB echo <= 3x payload", "rss_callee_over_payload", lambda a, t: a <= 3),
    ("idle CPU < 1% of a core", "idle_cpu_percent", lambda a, t: a < 1),
]
OURS = ("tensorplay", "tensorplay-tcp", "tensorplay-grpc")


def table(res, sizes):
    torch_r = res.get("torch", {})
    systems = [s for s in (*OURS, "torch", "rawtcp") if s in res]
    keys = ["sync_p50_us", "sync_p99_us", "sync_calls_per_s", "async64_calls_per_s", "async256_calls_per_s",
            "remote_to_here_p50_us", "rref_method_p50_us", "init2_s", "init4_s", "init8_s", "shutdown2_s",
            "fanin_calls_per_s", "during_transfer_p99_ms", "rss_caller_over_payload", "rss_callee_over_payload",
            "idle_cpu_percent", "rnn_steps_per_s_p50", "rnn_steps_per_s_mean", "ps_steps_per_s_p50", "ps_steps_per_s_mean",
            "memcpy_GBps"]
    keys += [f"{m}_{k}_{s}_GBps" for m in ("oneway", "echo") for k in KINDS for s in sizes]
    ours = [s for s in OURS if s in res]
    head = f"{'metric':30s}" + "".join(f" {s:>15s}" for s in systems) + "".join(f" {s + '/torch':>21s}" for s in ours)
    rows = [head, "-" * len(head)]
    for k in keys:
        row = f"{k:30s}" + "".join(f" {_fmt(res[s].get(k)):>15s}" for s in systems)
        for s in ours:
            a, b = res[s].get(k), torch_r.get(k)
            row += f" {(f'{a / b:.2f}x' if a is not None and b else '-'):>21s}"
        rows.append(row)
    return "\n".join(rows)


def _fmt(v):
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def _verdict(ok, text):
    return f"{'MET ' if ok else 'MISS'} {text}"


def verdicts(res, sizes):
    ours = res.get("tensorplay", {})
    torch_r, raw = res.get("torch", {}), res.get("rawtcp", {})
    lines = []
    for label, key, system, test in TARGETS:
        a, b = res.get(system, {}).get(key), torch_r.get(key)
        if a is not None and b is not None:
            lines.append(_verdict(test(a, b), f"{label}: {_fmt(a)} vs {_fmt(b)}"))
    if "sync_p50_us" in ours and "sync_p50_us" in raw:
        a, r = ours["sync_p50_us"], raw["sync_p50_us"]
        lines.append(_verdict(a <= 4 * r, f"(stretch) small-call p50 <= 4x the raw-TCP ping-pong: {a / r:.1f}x"))
    for s in [s for s in sizes if s >= 16 << 20]:
        k = f"oneway_numpy_{s}_GBps"
        if k in ours and k in torch_r:
            lines.append(_verdict(ours[k] >= 30 * torch_r[k], f"numpy {s >> 20} MiB one-way >= 30x torch: {ours[k] / torch_r[k]:.1f}x"))
        k = f"oneway_tensor_{s}_GBps"
        if k in ours and k in torch_r:
            lines.append(_verdict(ours[k] >= 1.5 * torch_r[k], f"tensor {s >> 20} MiB one-way >= 1.5x torch: {ours[k] / torch_r[k]:.2f}x"))
        k = f"oneway_numpy_{s}_GBps"
        if k in ours and "memcpy_GBps" in raw:
            lines.append(_verdict(ours[k] >= raw["memcpy_GBps"] / 2, f"(stretch) numpy {s >> 20} MiB within 2x of memcpy ({raw['memcpy_GBps']:.1f} GB/s): {ours[k]:.2f} GB/s"))
    big = f"oneway_numpy_{128 << 20}_GBps"
    for name in ("tcp", "grpc"):
        r = res.get(f"tensorplay-{name}", {})
        if big in r and big in torch_r:
            lines.append(_verdict(r[big] >= 5 * torch_r[big], f"[{name}] numpy 128 MiB one-way >= 5x torch: {r[big] / torch_r[big]:.1f}x"))
    for system in OURS:
        for label, key, test in KEPT:
            if key in res.get(system, {}):
                a = res[system][key]
                lines.append(_verdict(test(a, torch_r.get(key)), f"[{system}] {label}: {_fmt(a)}" + (f" (torch {_fmt(torch_r[key])})" if key in torch_r else "")))
    return "\n".join(lines)


def chart(res, sizes, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    systems = [s for s in (*OURS, "torch", "rawtcp") if s in res]
    for ax, kind in zip(axes, KINDS):
        for system in systems:
            ys = [res[system].get(f"oneway_{kind}_{s}_GBps") for s in sizes]
            if any(y is not None for y in ys):
                ax.plot([s / 1024 for s in sizes], [y or 0 for y in ys], marker="o", label=system)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("payload (KiB)")
        ax.set_ylabel("one-way GB/s")
        ax.set_title(f"{kind} payloads")
        ax.legend()
    fig.suptitle("tensorplay_rpc (shared memory; TCP and gRPC pinned) vs torch.distributed.rpc vs raw TCP (one run, this machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="skip the 128 MiB payloads")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"some of {', '.join(SYSTEMS)}")
    args = parser.parse_args()
    os.makedirs(OUT_DIR, exist_ok=True)
    res, sizes = measure(args.systems.split(","), args.quick)
    with open(os.path.join(OUT_DIR, "results.json"), "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    print()
    print(table(res, sizes))
    print()
    print(verdicts(res, sizes))
    chart(res, sizes, os.path.join(OUT_DIR, "bench.png"))
    print(f"\nresults: {os.path.join(OUT_DIR, 'results.json')}  chart: {os.path.join(OUT_DIR, 'bench.png')}")


if __name__ == "__main__":
    main()
