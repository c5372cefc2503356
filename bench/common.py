"""What the benchmark's workers call on each other (importable, so it goes by reference) and
the measuring helpers they share."""

import os
import resource
import threading
import time

import numpy as np
import torch


def add(a, b):
    return a + b


def sink(x):
    return None


def echo(x):
    return x


class Counter:
    def __init__(self):
        self.n = 0

    def inc(self):
        self.n += 1
        return self.n


def rss_kib():
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class PeakRss:
    """Samples this process's RSS every millisecond while active."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_kib())
            time.sleep(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


_peak_sampler = None


def start_peak():
    """Start sampling this process's peak RSS; returns the RSS now, in KiB."""
    global _peak_sampler
    _peak_sampler = PeakRss().__enter__()
    return rss_kib()


def stop_peak():
    """Stop sampling; returns the peak RSS seen, in KiB."""
    _peak_sampler.__exit__(None, None, None)
    return _peak_sampler.peak


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def percentiles(samples):
    s = sorted(samples)
    return s[len(s) // 2], s[min(len(s) - 1, int(len(s) * 0.99))]


def make_payload(kind, size):
    if kind == "numpy":
        return np.ones(size, dtype=np.uint8)
    if kind == "bytes":
        return b"\x01" * size
    return torch.ones(size, dtype=torch.uint8)



def idle_cpu_percent(seconds=5.0):
    """CPU this process used while idle, in percent of one core."""
    before, t0 = cpu_seconds(), time.perf_counter()
    time.sleep(seconds)
    return (cpu_seconds() - before) / (time.perf_counter() - t0) * 100


# The counter of calls into the Go extension, where phases.py installed one.
BOUNDARY_CALLS = [None]


def costs():
    """(calls into the Go extension, voluntary context switches) of this process so far."""
    import resource

    counter = BOUNDARY_CALLS[0]
    return (counter.calls if counter is not None else 0), resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


# When the callee's Python thread picked up the request being timed (phases.py).
PICKED_AT = [0.0]


def stamps(*payload):
    """Runs on the callee: when it picked the request up, and now (``payload`` is what the
    request carried, dropped)."""
    return PICKED_AT[0], time.perf_counter()
