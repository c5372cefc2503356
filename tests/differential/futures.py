"""Scenario run on torch's futures and on tensorplay_rpc's (the backend module is the first
argument): callbacks that are not callable, collect_all and wait_all over failed futures.
Prints one line per case: the value, or the exception's type (and, for errors the test's own
code raised, their message: the library's own messages are worded differently)."""

import sys
import threading
import time

OWN_ERRORS = (ValueError, KeyError)


def main() -> None:
    if sys.argv[1] == "torch.distributed.rpc":
        from torch.futures import Future, collect_all, wait_all
    else:
        from tensorplay_rpc import Future, collect_all, wait_all

    def show(label, fn):
        try:
            value = fn()
            print(f"{label}\tok {value!r}", flush=True)
        except Exception as exc:  # the outcome is what is compared
            detail = f" {exc}" if isinstance(exc, OWN_ERRORS) else ""
            print(f"{label}\t{type(exc).__name__}{detail}", flush=True)

    show("then(None)", lambda: Future().then(None) and None)
    show("add_done_callback(3)", lambda: Future().add_done_callback(3))

    a, b = Future(), Future()
    combined = collect_all([a, b])
    b.set_exception(KeyError("b failed first"))
    a.set_exception(ValueError("a failed second"))
    show("collect_all of two failures", lambda: combined.wait())

    a, b = Future(), Future()
    combined = collect_all([a, b])
    a.set_result(1)
    b.set_result(2)
    show("collect_all of two values", lambda: [f.wait() for f in combined.wait()])

    a, b = Future(), Future()
    threading.Timer(0.3, lambda: b.set_result(5)).start()
    a.set_exception(ValueError("first"))
    start = time.monotonic()
    show("wait_all with a failure", lambda: wait_all([a, b]))
    show("wait_all waited for the rest", lambda: time.monotonic() - start >= 0.25)

    show("wait_all of values", lambda: wait_all([Future(), Future()][:0]))
    done = Future()
    done.set_result(1)
    show("set_result twice", lambda: done.set_result(2))


if __name__ == "__main__":
    main()
