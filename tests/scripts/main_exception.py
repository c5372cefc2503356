"""Exception classes defined in __main__, raised by a function defined in __main__, run on
another worker: they travel by reference, and the caller catches the error as its own class, even
one whose __init__ takes more than a message (made without it: its attributes stay behind)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tensorplay_rpc as rpc  # noqa: E402


class MainError(Exception):
    """Defined in the caller's __main__, not importable anywhere."""


class CodedError(Exception):
    """One whose __init__ wants a code besides the message."""

    def __init__(self, message, code):
        super().__init__(message, code)
        self.code = code


def fail(code):
    if code % 2:
        raise MainError(f"raised in a __main__ function, code {code}")
    raise CodedError("raised with a code", code)


rank = int(os.environ["RANK"])
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2)
if rank == 0:
    calls = {
        MainError: lambda: rpc.rpc_sync("worker1", fail, args=(7,)),
        CodedError: lambda: rpc.rpc_async("worker1", fail, args=(8,)).wait(),
    }
    for kind, call in calls.items():
        try:
            call()
        except kind as exc:
            text = str(exc)
            print(type(exc).__name__, "On WorkerInfo(id=1, name=worker1)" in text, "Traceback" in text, "code" in text)
rpc.shutdown()
