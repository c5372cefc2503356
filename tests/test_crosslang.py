"""Go programs in a world of Python workers (issue 13): Python calls Go functions by name
(rpc.remote_function), Go calls functions Python exposes (rpc.expose), with msgpack values
and errors that cross both ways. The Go worker is examples/goworker, built here."""

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Dict, List

import pytest

from conftest import end_processes, free_port

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
WORLD = os.path.join(TESTS_DIR, "crosslang_world.py")
WORLD_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def goworker(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The example Go worker, built from examples/goworker."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    out = str(tmp_path_factory.mktemp("goworker") / "goworker")
    proc = subprocess.run([go, "build", "-o", out, "./examples/goworker"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"go build failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def run_mixed_world(goworker: str, tmp: str) -> "tuple[Dict, List[Dict]]":
    """Run the trainer, the helper and the Go worker; the trainer's outcomes and the Go
    worker's printed lines."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    out = os.path.join(tmp, "trainer.json")
    procs = [
        subprocess.Popen([sys.executable, WORLD, "0", out], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        subprocess.Popen([sys.executable, WORLD, "1", os.path.join(tmp, "helper.json")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        subprocess.Popen([goworker, "-name", "feature-store", "-rank", "2", "-world-size", "3", "-python", "trainer"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
    ]
    try:
        outputs = []
        deadline = time.monotonic() + WORLD_TIMEOUT_S
        for p in procs:
            stdout, stderr = p.communicate(timeout=max(1, deadline - time.monotonic()))
            assert p.returncode == 0, f"{p.args} ended with {p.returncode}:\n{stdout}\n{stderr[-3000:]}"
            outputs.append(stdout)
    finally:
        end_processes(procs)
    with open(out) as f:
        trainer = json.load(f)
    return trainer, [json.loads(line) for line in outputs[2].splitlines() if line.strip()]


@pytest.fixture(scope="module")
def mixed_world(goworker, tmp_path_factory):
    return run_mixed_world(goworker, str(tmp_path_factory.mktemp("mixed")))


@pytest.mark.timeout(WORLD_TIMEOUT_S + 60)
@pytest.mark.parametrize(
    "call, value",
    [
        ("add", 5.5),
        ("add_async", 2.25),
        ("lookup", {"3": [3.0, 1.5], "4": [4.0, 2.0]}),
        ("python_by_name", [1, "a", 1, "a"]),
        ("late", "late"),
        ("remote_to_here", [7, 7, "feature-store"]),
        ("remote_passed_on", 7),
        ("remote_array", [0.0, 3.0, 6.0, 9.0]),
        ("remote_on_python", 42),
        ("import_allowed", 42),
        ("helper_owns_after_release", [0, 0]),
        ("bad_names", ["ValueError"] * 5),
        ("owned_after_release", 0),
        ("after_calls", 1.5),
    ],
)
def test_python_calls_functions_by_name(mixed_world, call, value):
    got = mixed_world[0][call]
    assert got.get("value") == value, got


@pytest.mark.timeout(WORLD_TIMEOUT_S + 60)
@pytest.mark.parametrize(
    "call, error_type, words",
    [
        # A Go handler's error: a RuntimeError naming the Go worker, with the handler's text.
        ("lookup_error", "RuntimeError", ["feature-store", "no features for id -7"]),
        ("wrong_arg_count", "RuntimeError", ["feature-store", "takes 2 argument(s), got 1"]),
        ("wrong_arg_type", "RuntimeError", ["feature-store", "argument 1 does not decode into float64"]),
        ("no_such_function", "RuntimeError", ["feature-store", "serves no function named 'nope'"]),
        ("timeout", "RuntimeError", ["timed out", "feature-store"]),
        # Refused before sending: what cannot cross is an error on the side that tried.
        ("kwargs", "TypeError", ["by position only", "['b']"]),
        ("unsendable", "TypeError", ["cannot be sent as msgpack"]),
        ("remote_error", "RuntimeError", ["feature-store", "no features for id -1"]),
        # Importable functions only where the worker allows them.
        ("import_refused", "RuntimeError", ["helper", "serves no function named 'operator:mul'"]),
        ("import_missing", "RuntimeError", ["trainer", "AttributeError", "no_such_thing"]),
        ("remote_proxy", "TypeError", ["kept as msgpack", "use to_here()"]),
        # A Python function's exception, called by name: its type, message and traceback.
        ("python_by_name_error", "RuntimeError", ["On worker trainer: ValueError: boom: self", "Remote traceback", "in explode"]),
    ],
)
def test_errors_cross_and_name_what_failed(mixed_world, call, error_type, words):
    got = mixed_world[0][call]
    assert got.get("type") == error_type, got
    for w in words:
        assert w in got["message"], (w, got)


ARRAY_CASES = [f"stats_{d}" for d in ("float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool", "big", "strided", "tensor")]


@pytest.mark.timeout(WORLD_TIMEOUT_S + 60)
@pytest.mark.parametrize("call", ARRAY_CASES)
def test_arrays_reach_go_whole(mixed_world, call):
    got = mixed_world[0][call]
    assert got.get("value") == got["expected"], got


@pytest.mark.timeout(WORLD_TIMEOUT_S + 60)
@pytest.mark.parametrize("call", ["scale_small", "scale_big"])
def test_arrays_come_back_from_go_as_numpy_arrays(mixed_world, call):
    got = mixed_world[0][call]
    assert got.get("value", {}).get("equal") is True and got["value"]["dtype"] == "float32" and got["value"]["writable"], got


@pytest.mark.timeout(WORLD_TIMEOUT_S + 60)
def test_an_array_of_another_dtype_is_refused_before_sending(mixed_world):
    got = mixed_world[0]["complex"]
    assert got.get("type") == "TypeError" and "complex64" in got["message"] and "float32" in got["message"], got


@pytest.mark.timeout(WORLD_TIMEOUT_S + 60)
def test_remote_values_are_kept_while_referenced(mixed_world):
    # kept, scaled_rref, and the failed creation's slot until its RRef was collected
    assert mixed_world[0]["owned_while_held"].get("value", 0) >= 2, mixed_world[0]["owned_while_held"]


@pytest.mark.timeout(WORLD_TIMEOUT_S + 60)
def test_a_timed_out_go_call_returns_on_time(mixed_world):
    assert mixed_world[0]["timeout"]["seconds"] < 10, mixed_world[0]["timeout"]


@pytest.mark.timeout(WORLD_TIMEOUT_S + 60)
def test_go_calls_functions_python_exposes(mixed_world):
    lines = {line["call"]: line for line in mixed_world[1]}
    step = lines["train_step"]
    assert step["error"] == "", step
    assert step["result"] == {"loss": pytest.approx(6.5 * 0.1), "n": 3.0}, step
    norm = lines["normalize"]
    assert norm["error"] == "" and norm["dtype"] == "float64" and norm["shape"] == [3], norm
    assert norm["result"] == pytest.approx([0.125, 0.375, 0.5]), norm
    assert lines["math:hypot"] == {"call": "math:hypot", "result": 5.0, "error": ""}, lines["math:hypot"]
    slow = lines["slow"]
    assert slow["timeout"] and "trainer" in slow["error"] and slow["seconds"] < 10, slow
    boom = lines["boom"]
    assert boom.get("type") == "ValueError", boom
    assert boom["message"] == "boom: on purpose" and boom["worker"] == "trainer", boom
    assert "in explode" in boom["traceback"] and "ValueError: boom: on purpose" in boom["traceback"], boom


@pytest.mark.timeout(WORLD_TIMEOUT_S + 60)
def test_a_go_worker_killed_mid_call_fails_the_call_at_once_naming_it(goworker, tmp_path):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    out = str(tmp_path / "trainer.json")
    trainer = subprocess.Popen([sys.executable, WORLD, "0", out, "killed"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    go = subprocess.Popen([goworker, "-name", "feature-store", "-rank", "1", "-world-size", "2"], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # The Go worker logs when the call reaches it; then it dies.
        deadline = time.monotonic() + WORLD_TIMEOUT_S
        for line in go.stderr:
            if "sleeping 60 s" in line:
                break
            assert time.monotonic() < deadline, "the call never reached the Go worker"
        else:
            pytest.fail(f"the Go worker ended before the call reached it (exit {go.wait()})")
        go.kill()
        stdout, stderr = trainer.communicate(timeout=max(1, deadline - time.monotonic()))
        assert trainer.returncode == 0, f"the trainer ended with {trainer.returncode}:\n{stdout}\n{stderr[-3000:]}"
    finally:
        end_processes([trainer, go])
    with open(out) as f:
        killed = json.load(f)["killed"]
    assert killed.get("type") == "RuntimeError" and "feature-store" in killed["message"], killed
    assert killed["seconds"] < 10, killed  # failed by the death, not by a timeout (there is none)


def _array(dtype, shape, where):
    import msgpack

    from tensorplay_rpc import crosslang

    return msgpack.packb(msgpack.ExtType(crosslang.ARRAY_EXT, msgpack.packb([dtype, shape, where])))


@pytest.mark.parametrize(
    "payload, buffers, words",
    [
        (_array("float32", [2], -1), [b"\0" * 8, b"\1" * 8], "buffer -1, but the message has 2"),
        (_array("float32", [2], 2), [b"\0" * 8, b"\1" * 8], "buffer 2, but the message has 2"),
        (_array("float32", [2], True), [b"\0" * 8, b"\1" * 8], "buffer True"),
        (_array("float32", [3], 0), [b"\0" * 8], "needs 12 bytes, its buffer has 8"),
        (_array("float32", [1 << 62, 1 << 62], 0), [b"\0" * 8], "its buffer has 8"),
        (_array("float32", [-2, -1], 0), [b"\0" * 8], "non-negative integers"),
        (_array("complex64", [1], 0), [b"\0" * 8], "dtype 'complex64'"),
        (_array(["float32"], [1], 0), [b"\0" * 8], "dtype ['float32']"),
        (_array("float32", [2], b"\0" * 7), [], "needs 8 bytes, its buffer has 7"),
        (_array("float32", "2", 0), [b"\0" * 8], "shape '2'"),
        # An array extension nested inside another's header.
        (__import__("msgpack").packb(__import__("msgpack").ExtType(1, __import__("msgpack").packb([__import__("msgpack").ExtType(1, b"x"), [1], 0]))), [b"\0" * 4], "dtype ExtType"),
        (__import__("msgpack").packb(__import__("msgpack").ExtType(1, b"\xc1")), [], "header is not msgpack"),
        (__import__("msgpack").packb(__import__("msgpack").ExtType(1, __import__("msgpack").packb([1, 2]))), [], "not [dtype, shape, buffer]"),
    ],
)
def test_a_malformed_array_from_a_peer_is_refused_saying_why(payload, buffers, words):
    """A peer's array that points at a buffer the message does not have (a negative index
    silently took another buffer before), or a shape its buffer does not fill, is refused with
    a ValueError naming what is wrong, never decoded into something else."""
    from tensorplay_rpc import crosslang

    with pytest.raises(ValueError) as info:
        crosslang.unpack(payload, buffers)
    assert words in str(info.value)


def test_a_wellformed_array_still_decodes_over_its_buffer():
    import numpy as np

    from tensorplay_rpc import crosslang

    got = crosslang.unpack(_array("int32", [2, 2], 1), [b"", np.arange(4, dtype=np.int32).tobytes()])
    assert got.tolist() == [[0, 1], [2, 3]]
