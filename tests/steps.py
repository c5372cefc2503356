"""Steps the processes of a multi-process test take in a set order: a process marks a step
done by making a file in a directory they share, and others wait for it, for a bounded time."""

import os
import sys
import time

STEP_WAIT_S = 60


class Steps:
    """The steps of one run, as files in ``directory``; ``who`` names this process in errors."""

    def __init__(self, directory: str, who: str) -> None:
        self.directory, self.who = directory, who

    def mark(self, step: str) -> None:
        """Say that ``step`` is done."""
        open(os.path.join(self.directory, step), "w").close()

    def wait(self, step: str) -> None:
        """Wait until ``step`` is done; after STEP_WAIT_S, exit at once with status 3 (an
        orderly exit could wait on an RPC agent's shutdown, which may be what is stuck)."""
        deadline = time.monotonic() + STEP_WAIT_S
        while not os.path.exists(os.path.join(self.directory, step)):
            if time.monotonic() > deadline:
                print(f"{self.who}: gave up waiting for {step}", file=sys.stderr, flush=True)
                os._exit(3)
            time.sleep(0.02)
