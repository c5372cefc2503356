"""Futures awaited in asyncio code (issue 14): the loop goes on while calls are pending."""

import pytest

from conftest import run_world


@pytest.fixture(scope="module")
def awaited():
    return run_world("aio:await_calls", 2, timeout=60)[0].value


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "what, expected",
    [
        ("gather", True),  # 1,000 calls awaited with asyncio.gather
        ("then", 42),
        ("collect_all", [2, 4]),
        ("error", ["ValueError", True]),  # the remote error, raised at the await
        ("slow", 0.5),
        ("ticks_while_waiting", True),  # the event loop was not blocked
        ("cancelled", True),
        ("after_cancel", 0.3),  # the future of a cancelled await still completes
        ("already_done", 0.3),
        ("callbacks_left", 0),  # 20 awaits given up by wait_for took their callbacks back
    ],
)
def test_futures_can_be_awaited(awaited, what, expected):
    assert awaited[what] == expected, awaited
