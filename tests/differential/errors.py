"""Remote exceptions: what the caller gets for each kind of error raised on the callee."""

import sys

import harness
from harness import differs, scenario


class CustomError(Exception):
    """A user's own exception class, importable on every worker."""


class TwoArgError(Exception):
    """Cannot be made again from one message."""

    def __init__(self, a, b):
        super().__init__(a, b)


class BadStrError(Exception):
    def __str__(self):
        raise ValueError("no text")


KEEPS_TYPE = (
    "the remote exception keeps its type (a project rule): torch keeps only ValueError and "
    "TypeError through a future and makes the rest RuntimeError, so `except MyError` never matches"
)


def raise_(exc):
    raise exc


def raise_local_class():
    class LocalError(Exception):
        pass

    raise LocalError("local")


def call_exit():
    sys.exit(3)


def sync(fn, *args):
    return harness.rpc.rpc_sync("w1", fn, args=args)


@scenario
def value_error():
    return sync(raise_, ValueError("boom"))


@scenario
def multi_line_message():
    return sync(raise_, ValueError("first line\nsecond line"))


@scenario
def message_with_quotes_and_tabs():
    return sync(raise_, RuntimeError("it's \"quoted\"\tand tabbed"))


@differs(KEEPS_TYPE, ours="KeyError: 'KeyError: On WorkerInfo(id=1, name=w1):")
def key_error():
    return sync(raise_, KeyError("missing"))


@differs(KEEPS_TYPE, ours="CustomError: CustomError: On WorkerInfo(id=1, name=w1):\\nCustomError('mine')\\nTraceback (most recent call last):\\n  ...\\nCustomError: mine\\n")
def custom_class():
    return sync(raise_, CustomError("mine"))


@differs(KEEPS_TYPE, ours="ok 'caught as CustomError'")
def custom_class_is_caught_by_type():
    try:
        sync(raise_, CustomError("mine"))
    except CustomError:
        return "caught as CustomError"


@differs(KEEPS_TYPE + "; a class whose __init__ wants more than the message is made without it (torch raises its __init__'s TypeError)",
         ours="TwoArgError: TwoArgError: On WorkerInfo(id=1, name=w1):\\nTwoArgError('a', 'b')\\nTraceback (most recent call last):\\n  ...\\nTwoArgError: ('a', 'b')\\n")
def two_argument_class():
    return sync(raise_, TwoArgError("a", "b"))


@differs(KEEPS_TYPE, ours='IndexError: IndexError: On WorkerInfo(id=1, name=w1):\\nIndexError()\\nTraceback (most recent call last):\\n  ...\\nIndexError\\n')
def exception_without_message():
    return sync(raise_, IndexError())


@differs(KEEPS_TYPE, ours="ZeroDivisionError: ZeroDivisionError: On WorkerInfo(id=1, name=w1):\\nZeroDivisionError('division by zero')\\nTraceback (most recent call last):\\n  ...\\nZeroDivisionError: division by zero\\n")
def zero_division():
    return sync(eval, "1/0")


@scenario
def type_error_of_bad_arguments():
    return sync(raise_)


@scenario
def from_rpc_async():
    return harness.rpc.rpc_async("w1", raise_, args=(ValueError("async boom"),)).wait()


@scenario
def from_remote_to_here():
    return harness.rpc.remote("w1", raise_, args=(ValueError("remote boom"),)).to_here()


@scenario
def traceback_names_the_callee():
    try:
        sync(raise_, ValueError("where"))
    except ValueError as exc:
        return ("On WorkerInfo(id=1, name=w1)" in str(exc), "Traceback" in str(exc), 'in raise_' in str(exc))


@scenario
def exception_in_nested_call():
    return harness.rpc.rpc_sync("w1", sync_on_w2)


def sync_on_w2():
    return harness.rpc.rpc_sync("w2", raise_, args=(ValueError("deep"),))


@scenario
def exception_after_exception():
    outcomes = []
    for _ in range(2):
        try:
            sync(raise_, ValueError("again"))
        except ValueError:
            outcomes.append("ValueError")
    outcomes.append(sync(str, 5))
    return outcomes


def raise_keyboard_interrupt():
    raise KeyboardInterrupt("interrupted")


@scenario
def remote_sys_exit():
    return sync(call_exit)


@scenario
def remote_keyboard_interrupt():
    return sync(raise_keyboard_interrupt)


@scenario
def callee_alive_after_base_exceptions():
    return sync(str, 42)


@differs(
    "an exception class defined in a function travels by value, as functions do; torch cannot pickle it and reports that",
    ours="LocalError: LocalError: On WorkerInfo(id=1, name=w1):\\nLocalError('local')\\nTraceback (most recent call last):\\n  ...\\nraise_local_class.<locals>.LocalError: local\\n",
)
def local_class():
    return sync(raise_local_class)


@differs("we rebuild the remote type, whose own __str__ fails on the caller too; torch reports pybind11's text", ours='BadStrError: <str() raised ValueError>')
def str_raises():
    return sync(raise_, BadStrError("x"))


@differs("torch decodes the message's UTF-8 as Latin-1 (café becomes cafÃ©); we keep the text", ours="ValueError: ValueError: On WorkerInfo(id=1, name=w1):\\nValueError('café ☕')")
def non_ascii_message():
    return sync(raise_, ValueError("café ☕"))
