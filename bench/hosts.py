"""`make bench-hosts` (root): tensorplay_rpc, torch.distributed.rpc and the link's own limit
between two "hosts": network namespaces joined by a bridge, as machines on a LAN are, with
`tc netem` adding 0, 1 and 5 ms of delay each way (a real network). One run; on a real network
only the ratios to the link's limit matter.

``tensorplay`` runs with its default transports (plain TCP between hosts: shared memory does
not cross network namespaces), ``tensorplay-grpc`` pinned to gRPC, torch with its default
(TensorPipe's uv transport between hosts; it needs TP_SOCKET_IFNAME and GLOO_SOCKET_IFNAME
there, we need nothing), and ``link`` is bench/linklimit: a Go ping-pong and one-way transfer
on one TCP connection. Writes bench/out/hosts.json and bench/out/hosts.png.

A kernel built without netem (CONFIG_NET_SCH_NETEM, as this VM's) gets the delay from
bench/delaylink instead: the two hosts' links joined by a program that forwards every packet
after the delay, as the bridge would at once. It costs throughput (every packet crosses a
process), so the link's limit is measured over it too, and only ratios to it mean anything.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

from bench import HERE, OUT_DIR, _collect, free_port

SUBNET = "10.78.0"
DELAYS_MS = (0, 1, 5)
SIZE = 64 << 20
SYSTEMS = {
    "tensorplay": {},
    "tensorplay-grpc": {"TENSORPLAY_RPC_TRANSPORTS": "grpc"},
    "torch": {},
}


def ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class TwoHosts:
    """Namespaces a (SUBNET.1) and b (SUBNET.2), each with a veth on one bridge; removed on
    exit."""

    def __init__(self):
        tag = f"tpb{os.getpid() % 10000}"
        self.ns = {"a": f"{tag}a", "b": f"{tag}b"}
        self.dev = {"a": f"{tag}a0", "b": f"{tag}b0"}
        self.bridge = f"{tag}br"
        self.addr = {"a": f"{SUBNET}.1", "b": f"{SUBNET}.2"}
        self.relay = None  # the delaylink process, if the delay is its

    def __enter__(self):
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("link", "set", self.bridge, "up")
            for h in ("a", "b"):
                ns, dev, peer = self.ns[h], self.dev[h], self.dev[h][:-1] + "1"
                ip("netns", "add", ns)
                ip("link", "add", dev, "type", "veth", "peer", "name", peer)
                ip("link", "set", dev, "netns", ns)
                ip("link", "set", peer, "master", self.bridge)
                ip("link", "set", peer, "up")
                ip("-n", ns, "addr", "add", f"{self.addr[h]}/24", "dev", dev)
                ip("-n", ns, "link", "set", "lo", "up")
                ip("-n", ns, "link", "set", dev, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        if self.relay is not None:
            self.relay.terminate()
            try:
                self.relay.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.relay.kill()
                self.relay.wait()
        for h in ("a", "b"):
            subprocess.run(["ip", "netns", "del", self.ns[h]], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)

    def delay(self, ms, delaylink):
        """ms of delay on each host's way out (so twice that per round trip): tc netem, or
        delaylink where the kernel has no netem. Returns which."""
        if not ms:
            return "none"
        for h in ("a", "b"):
            done = subprocess.run(["ip", "netns", "exec", self.ns[h], "tc", "qdisc", "add", "dev", self.dev[h], "root",
                                   "netem", "delay", f"{ms}ms", "limit", "100000"], capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                break
        else:
            return "netem"
        print(f"  tc netem: {done.stderr.strip()}; delaying with bench/delaylink instead", flush=True)
        for h in ("a", "b"):
            ip("link", "set", self.dev[h][:-1] + "1", "nomaster")
        self.relay = subprocess.Popen([delaylink, self.dev["a"][:-1] + "1", self.dev["b"][:-1] + "1", f"{ms}ms"],
                                      stdout=subprocess.PIPE, text=True)
        if self.relay.stdout.readline().strip() != "ready":
            raise RuntimeError("delaylink did not start")
        return "delaylink"

    def run(self, host, argv, **kw):
        return subprocess.Popen(["ip", "netns", "exec", self.ns[host], *argv], **kw)


def run_world(hosts, system, workload, args=(), timeout=900):
    """Rank 0 on host a, rank 1 on host b; rank 0's results."""
    script_system = "torch" if system == "torch" else "tensorplay"
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="tensorplay-bench-hosts-")
    procs, outs = [], []
    for rank, h in enumerate(("a", "b")):
        out = os.path.join(tmp, f"{rank}.json")
        env = dict(os.environ, MASTER_ADDR=hosts.addr["a"], MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", **SYSTEMS[system])
        if system == "tensorplay":  # its defaults, whatever the caller's environment pins
            env.pop("TENSORPLAY_RPC_TRANSPORTS", None)
        if system == "torch":
            env.update(TP_SOCKET_IFNAME=hosts.dev[h], GLOO_SOCKET_IFNAME=hosts.dev[h])
        procs.append(hosts.run(h, [sys.executable, os.path.join(HERE, "worker.py"), script_system, workload, out, *args],
                               cwd=HERE, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        outs.append(out)
    return _collect(procs, outs, timeout, f"{system} {workload} between hosts")[0]


def run_link(hosts, binary):
    port = free_port()
    addr = f"{hosts.addr['b']}:{port}"
    server = hosts.run("b", [binary, "serve", addr], stderr=subprocess.PIPE)
    try:
        done = subprocess.run(["ip", "netns", "exec", hosts.ns["a"], binary, "measure", addr, "3000", str(SIZE)],
                              capture_output=True, text=True, timeout=300)
    finally:
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if done.returncode != 0:
        raise RuntimeError(f"linklimit failed: {done.stderr}")
    r = json.loads(done.stdout)
    r["oneway_numpy_GBps"] = r["oneway_tensor_GBps"] = r.pop("oneway_GBps")
    return r


def measure(binary, delaylink):
    res = {}
    for ms in DELAYS_MS:
        with TwoHosts() as hosts:
            cond = res.setdefault(f"{ms}ms", {})
            cond["delayed_by"] = hosts.delay(ms, delaylink)
            print(f"[{ms} ms] link limit", flush=True)
            cond["link"] = run_link(hosts, binary)
            for system in SYSTEMS:
                print(f"[{ms} ms] {system}: small calls, 64 MiB numpy and tensors", flush=True)
                r = run_world(hosts, system, "small")
                p = run_world(hosts, system, "payload", args=("numpy,tensor", str(SIZE)))
                r.update({f"oneway_{k}_GBps": p[f"oneway_{k}_{SIZE}_GBps"] for k in ("numpy", "tensor")})
                cond[system] = r
    return res


KEYS = ("sync_p50_us", "sync_p99_us", "oneway_numpy_GBps", "oneway_tensor_GBps")


def table(res):
    systems = ["link", *SYSTEMS]
    lines = []
    for cond, r in res.items():
        head = f"{'delay ' + cond + ' (' + r['delayed_by'] + ')':22s}" + "".join(f" {s:>16s}" for s in systems) + f" {'ours/link':>10s} {'ours/torch':>10s}"
        lines += [head, "-" * len(head)]
        for k in KEYS:
            vals = [r.get(s, {}).get(k) for s in systems]
            ours, link, torch_v = r["tensorplay"].get(k), r["link"].get(k), r["torch"].get(k)
            lines.append(f"{k:22s}" + "".join(f" {v:16.3g}" if v is not None else f" {'-':>16s}" for v in vals)
                         + f" {ours / link:10.2f} {ours / torch_v:10.2f}")
        lines.append("")
    return "\n".join(lines)


def chart(res, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = ["link", *SYSTEMS]
    conds = list(res)
    res = {c: {s: v for s, v in r.items() if isinstance(v, dict)} for c, r in res.items()}
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    for ax, key, label in zip(axes, ("sync_p50_us", "oneway_numpy_GBps", "oneway_tensor_GBps"),
                              ("small rpc_sync p50 (us, lower is better)", "64 MiB numpy one way (GB/s)", "64 MiB tensor one way (GB/s)")):
        width = 0.8 / len(systems)
        for i, s in enumerate(systems):
            ax.bar([j + i * width for j in range(len(conds))], [res[c][s].get(key, 0) for c in conds], width, label=s)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(conds))], [f"delay {c}" for c in conds])
        ax.set_title(label)
        if key == "sync_p50_us":
            ax.set_yscale("log")
        ax.legend()
    fig.suptitle("between two network namespaces on a bridge (one run, this machine)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    if os.geteuid() != 0:
        print("make bench-hosts makes network namespaces: run it as root", file=sys.stderr)
        return 2
    os.makedirs(OUT_DIR, exist_ok=True)
    go = shutil.which("go") or "/usr/local/go/bin/go"
    binaries = {}
    for tool in ("linklimit", "delaylink"):
        binaries[tool] = os.path.join(OUT_DIR, tool)
        subprocess.run([go, "build", "-o", binaries[tool], f"./bench/{tool}"], cwd=os.path.dirname(HERE), check=True, timeout=600)
    res = measure(binaries["linklimit"], binaries["delaylink"])
    with open(os.path.join(OUT_DIR, "hosts.json"), "w") as f:
        json.dump(res, f, indent=1, sort_keys=True)
    print()
    print(table(res))
    chart(res, os.path.join(OUT_DIR, "hosts.png"))
    print(f"results: {os.path.join(OUT_DIR, 'hosts.json')}  chart: {os.path.join(OUT_DIR, 'hosts.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
