"""Payloads of every kind travel out of band and arrive as they were sent."""

import pickle

import numpy as np
import pytest
import torch

from conftest import expect_behaviours, run_world
from tensorplay_rpc.internal import deserialize, serialize

# Every world here runs once over shared memory and once over gRPC.
pytestmark = pytest.mark.usefixtures("each_transport")


@pytest.mark.parametrize(
    "value",
    [np.zeros(1 << 20, dtype=np.uint8), np.zeros((512, 1024))[:, ::2], b"x" * (1 << 20), bytearray(1 << 20),
     memoryview(b"y" * (1 << 20)), torch.zeros(1 << 18), torch.zeros(512, 512).t()],
    ids=["numpy", "numpy-strided", "bytes", "bytearray", "memoryview", "tensor", "tensor-transposed"],
)
def test_big_payloads_travel_beside_the_pickle(value):
    segments, _ = serialize(value)
    pickle_bytes, *buffers, kinds = segments
    assert len(pickle_bytes) < 1024, "the payload was copied into the pickle stream"
    assert len(buffers) == 1 and buffers[0].nbytes >= 1 << 20
    assert len(kinds) == 1
    back = deserialize(pickle_bytes, [bytearray(b) for b in buffers])
    assert type(back) is type(value)


def test_small_payloads_stay_in_the_pickle():
    segments, _ = serialize([b"abc", np.arange(3), bytearray(b"x")])
    assert len(segments) == 1


@pytest.mark.parametrize("make", [bytes, bytearray, lambda n: np.zeros(n, dtype=np.uint8)], ids=["bytes", "bytearray", "numpy"])
def test_buffers_from_1_kib_go_beside_the_pickle(make):
    under, _ = serialize([make(1023)])
    at, _ = serialize([make(1024)])
    assert len(under) == 1, "a 1023-byte buffer left the pickle"
    assert len(at) > 1 and 1024 in [memoryview(s).nbytes for s in at[1:]], "a 1024-byte buffer stayed in the pickle"


def test_pickling_state_is_clean_after_an_error():
    with pytest.raises(TypeError):
        serialize(__import__("threading").Lock())
    segments, _ = serialize({"ok": np.arange(1000)})
    assert pickle.loads(segments[0], buffers=segments[1:-1])["ok"].sum() == 499500


def test_numpy_round_trips():
    out = run_world("payloads:numpy_round_trips", 2)[0].value
    dtypes = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
              "float64", "complex64", "complex128", ">i4", "<M8[ns]", "m8[s]", "U7", "S3")
    cases = [f"dtype-{d}" for d in dtypes] + ["zero-d", "empty", "empty-2d", "big", "fortran", "strided", "transposed",
                                              "reversed", "structured", "object"]
    counts = ["lent_while_held", "lent_after", "lent_here"]
    assert sorted(out) == sorted(cases + counts), f"cases reported: {sorted(out)}"
    assert [k for k in cases if not out[k][0]] == [], "these came back different"
    assert [k for k in cases if not (out[k][1] and out[k][2])] == [], "these arrived read-only (back here, or there)"
    assert out["lent_while_held"] >= 1, "a received 8 MiB array was not lent in place"
    assert out["lent_after"] == 0 and out["lent_here"] == 0, "lent memory was not handed back"


def test_mid_size_messages_in_flight_arrive_intact():
    out = run_world("payloads:mid_size_in_flight", 2)[0].value
    assert out == {"calls": 256, "mismatches": 0}, out


def test_held_arrays_stay_intact_while_more_arrive(each_transport):
    """Over shared memory the first three land (the area takes three), so the callee maps at
    least 48 MiB of it; over gRPC no region is mapped at all."""
    sender, holder = (r.value for r in run_world("payloads:landed_arrays_held", 2))
    expect_behaviours({**sender, **holder}, {
        "echoes arrive as sent": lambda o: o["echoes_intact"],
        "every held array is as sent": lambda o: o["intact"] == [True] * 8,
        "held arrays are writable": lambda o: o["writable"],
        "held arrays are lent in place": lambda o: o["lent_held"] >= 8,
        "dropped arrays give their memory back": lambda o: o["lent_after_drop"] == 0,
        "arrays land in shared memory only over it":
            lambda o: o["shm_resident"] >= 48 << 20 if each_transport == "shm" else o["shm_resident"] == 0,
        "an array held past shutdown stays readable": lambda o: o["after_shutdown_intact"],
        "its region stays mapped until it is dropped, and no longer":
            lambda o: o["mapped_after_drop"] == 0 and (o["mapped_while_held"] >= 1 if each_transport == "shm" else True),
    })


def test_replies_to_dropped_futures_give_their_memory_back():
    out = run_world("payloads:abandoned_big_replies", 2)[0].value
    expect_behaviours(out, {
        "later replies arrive intact": lambda o: o["later_intact"],
        "no region stays mapped after shutdown": lambda o: o["mapped_after_shutdown"] == 0,
    })


def test_bytes_like_round_trips():
    out = run_world("payloads:bytes_like_round_trips", 2)[0].value
    kinds = ("bytes-empty", "bytes-small", "bytes-1k", "bytes-big", "bytearray-empty", "bytearray-small", "bytearray-big",
             "memoryview-bytes", "memoryview-2d", "memoryview-strided", "mixed", "bytes-huge", "bytes-over-a-landing", "mixed-huge")
    assert sorted(out) == sorted(kinds), f"cases reported: {sorted(out)}"
    assert [k for k in kinds if out[k] is not True] == [], "these came back different"


def test_self_calls_copy_big_arguments():
    out = run_world("payloads:self_calls", 1)[0].value
    n = 4 << 20
    expect_behaviours(out, {
        "a call to oneself gets the big argument": lambda o: o["sum"] == n,
        "the callee's writes do not reach the caller's array": lambda o: o["mine_after"] == n,
        "a call to oneself times out as torch words it": lambda o: "ran for more than set timeout" in o["late"],
        # The handler ran after the caller gave up and freed its array: it read its own copy.
        "a handler running after its caller gave up reads its own copy of the argument": lambda o: o["late_sum"] == 3 * n,
        "a big result of a call to oneself arrives whole": lambda o: o["result_sum"] == 5 * n,
    })


def test_torch_round_trips():
    out = run_world("payloads:torch_round_trips", 2)[0].value
    dtypes = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool", "complex64")
    cases = [f"dtype-{d}" for d in dtypes] + ["zero-d", "empty", "transposed", "sliced", "big", "requires_grad", "writable"]
    assert sorted(out) == sorted(cases), f"cases reported: {sorted(out)}"
    assert [k for k in cases if out[k] is not True] == [], "these came back different"


@pytest.mark.timeout(360)
def test_a_call_over_two_gib():
    out = run_world("payloads:over_two_gib", 2, timeout=300)[0].value
    dtype, size, writable, mismatched_blocks = out["seen"]
    assert (dtype, size, writable) == ("uint64", out["sent"], True), f"the callee saw a {dtype} array of {size} elements, writable={writable}; {out['sent']} were sent"
    assert mismatched_blocks == [], "these blocks arrived different (first element index of each)"


def test_a_big_requests_memory_goes_back_before_its_reply():
    out = run_world("payloads:request_memory_back_before_reply", 2)[0].value
    assert out["received"] == ["ndarray"] * 3, out
    # Its arguments are dropped before the reply leaves: nothing received is still in use.
    assert out["lent_at_reply"] == [0, 0, 0], out


def test_big_arguments_are_sent_in_place_and_big_messages_take_turns():
    out = run_world("payloads:in_place_and_turns", 2)[0].value
    assert out["sent"] == 256 << 20, f"the callee received {out['sent']} bytes of 256 MiB"
    # A copy at the boundary would add 256 MiB (262144 KiB) to the peak.
    assert out["peak_growth_kib"] < 64 << 10, f"the caller's peak RSS grew by {out['peak_growth_kib']} KiB sending 256 MiB"
    assert out["results"] == [48 << 20, 8 << 20], out
    assert out["arrived"] == ["8 MiB", "48 MiB"], "the 8 MiB call waited for the whole 48 MiB one"


def test_the_default_size_limit_is_4_gib():
    results = run_world("payloads:default_size_limit", 2)
    assert [r.value["default"] for r in results] == [4 << 30, 4 << 30], "the default max_message_size is not 4 GiB on every worker"
    over = results[0].value["over"]
    assert "over the 4294967296-byte limit" in over and "nothing was sent" in over and '"worker1"' in over, over


def test_size_limits_refuse_cleanly():
    out = run_world("payloads:size_limits", 2)[0].value
    expect_behaviours(out, {
        "an argument over the limit is refused before sending, naming the worker":
            lambda o: "too large" in o["too_big_arg"] and "nothing was sent" in o["too_big_arg"] and "worker1" in o["too_big_arg"],
        "a result over the limit fails the call, saying it was the reply": lambda o: "too large" in o["too_big_result"] and "reply" in o["too_big_result"],
        "a call at the limit still goes through after": lambda o: o["still_serving"] == 8 << 20,
    })


def test_dropped_futures_of_big_calls_keep_their_memory_until_sent(each_transport):
    out = run_world("payloads:dropped_big_requests", 2, timeout=180)[0].value
    expect_behaviours(out, {
        "every dropped call arrived": lambda o: o["calls"] == o["sent"] == 32,
        "each arrived as sent, not as what reused its memory": lambda o: o["wrong"] == 0,
        "the kept memory is let go once sent": lambda o: o["abandoned_left"] == 0 and o["dropped_arrays_alive"] == 0,
    })
