"""`make bench`: tensorplay_rpc, torch.distributed.rpc and a raw-TCP floor, measured in one run
on this machine with real worker processes on loopback.

Prints a table of values and ratios, writes bench/out/results.json and draws
bench/out/bench.png. Every world is ended by PID if it outlives its time limit.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "out")
SIZES = [1 << 10, 1 << 20, 16 << 20, 128 << 20]
KINDS = ["numpy", "bytes", "tensor"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(system, workload, world_size, args=(), timeout=600):
    """Run one benchmark world; returns each rank's JSON results."""
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="tensorplay-bench-")
    procs, outs = [], []
    for rank in range(world_size):
        out = os.path.join(tmp, f"{rank}.json")
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "worker.py"), system, workload, out, *args],
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
            r[f"init{n}_s"] = max(x["init_s"] for x in ranks)
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
    print("[raw tcp] floor", flush=True)
    res["rawtcp"] = run_rawtcp(",".join(KINDS), size_arg)
    return res, sizes


TARGETS = [
    # (label, metric, comparison against, test) where test(ours, other) -> bool
    ("small-call p50 <= 1/3 of torch", "sync_p50_us", "torch", lambda a, b: a <= b / 3),
    ("rpc_async calls/s (64 in flight) >= 3x torch", "async64_calls_per_s", "torch", lambda a, b: a >= 3 * b),
    ("rpc_async calls/s (256 in flight) >= 3x torch", "async256_calls_per_s", "torch", lambda a, b: a >= 3 * b),
    ("remote()+to_here() p50 <= 1/2 of torch", "remote_to_here_p50_us", "torch", lambda a, b: a <= b / 2),
    ("init_rpc of 8 <= 1/2 of torch", "init8_s", "torch", lambda a, b: a <= b / 2),
]


def table(res, sizes):
    ours, torch_r, raw = res.get("tensorplay", {}), res.get("torch", {}), res.get("rawtcp", {})
    rows = []
    keys = ["sync_p50_us", "sync_p99_us", "sync_calls_per_s", "async64_calls_per_s", "async256_calls_per_s",
            "remote_to_here_p50_us", "rref_method_p50_us", "init2_s", "init4_s", "init8_s", "shutdown2_s",
            "fanin_calls_per_s", "during_transfer_p99_ms", "rss_caller_over_payload", "rss_callee_over_payload",
            "idle_cpu_percent"]
    keys += [f"{m}_{k}_{s}_GBps" for m in ("oneway", "echo") for k in KINDS for s in sizes]
    for k in keys:
        a, b, c = ours.get(k), torch_r.get(k), raw.get(k)
        ratio = f"{a / b:8.2f}x" if a is not None and b else "       -"
        rows.append(f"{k:34s} {_fmt(a):>12s} {_fmt(b):>12s} {_fmt(c):>12s} {ratio}")
    head = f"{'metric':34s} {'tensorplay':>12s} {'torch':>12s} {'raw tcp':>12s} {'ours/torch':>9s}"
    return "\n".join([head, "-" * len(head)] + rows)


def _fmt(v):
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def verdicts(res, sizes):
    ours, torch_r, raw = res.get("tensorplay", {}), res.get("torch", {}), res.get("rawtcp", {})
    lines = []
    for label, key, other, test in TARGETS:
        a, b = ours.get(key), res.get(other, {}).get(key)
        if a is not None and b is not None:
            lines.append(f"{'MET ' if test(a, b) else 'MISS'} {label}: {_fmt(a)} vs {_fmt(b)}")
    for kind in ("numpy", "bytes"):
        for s in [s for s in sizes if s >= 1 << 20]:
            k = f"oneway_{kind}_{s}_GBps"
            if k in ours and k in torch_r:
                lines.append(f"{'MET ' if ours[k] >= 30 * torch_r[k] else 'MISS'} {kind} {s >> 20} MiB one-way >= 30x torch: {ours[k] / torch_r[k]:.1f}x")
    big = max(sizes)
    k = f"oneway_tensor_{big}_GBps"
    if k in ours and k in torch_r:
        lines.append(f"{'MET ' if ours[k] >= 1.5 * torch_r[k] else 'MISS'} tensor {big >> 20} MiB >= 1.5x torch: {ours[k] / torch_r[k]:.2f}x")
    for s in [s for s in sizes if s >= 16 << 20]:
        k = f"oneway_numpy_{s}_GBps"
        if k in ours and k in raw:
            lines.append(f"{'MET ' if ours[k] >= 0.5 * raw[k] else 'MISS'} numpy {s >> 20} MiB one-way >= 1/2 raw TCP: {ours[k] / raw[k]:.2f}x")
    if "during_transfer_p99_ms" in ours:
        lines.append(f"{'MET ' if ours['during_transfer_p99_ms'] < 20 else 'MISS'} small-call p99 during 256 MiB transfer < 20 ms: {ours['during_transfer_p99_ms']:.1f} ms")
    for side in ("caller", "callee"):
        k = f"rss_{side}_over_payload"
        if k in ours:
            lines.append(f"{'MET ' if ours[k] <= 3 else 'MISS'} {side} peak RSS in 128 MiB echo <= 3x payload: {ours[k]:.2f}x")
    if "idle_cpu_percent" in ours:
        lines.append(f"{'MET ' if ours['idle_cpu_percent'] < 1 else 'MISS'} idle CPU < 1% of a core: {ours['idle_cpu_percent']:.2f}% (torch {torch_r.get('idle_cpu_percent', float('nan')):.1f}%)")
    return "\n".join(lines)


def chart(res, sizes, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    systems = [s for s in ("tensorplay", "torch", "rawtcp") if s in res]
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
    fig.suptitle("tensorplay_rpc vs torch.distributed.rpc vs raw TCP (one run, this machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="skip the 128 MiB payloads")
    parser.add_argument("--systems", default="tensorplay,torch")
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
