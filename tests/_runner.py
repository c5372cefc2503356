"""Runs one rank of a test world: ``_runner.py module:function outfile [args...]``.

The scenario is called with its rank, world size and extra args; what it returns (or the
traceback it raised) is pickled to outfile for the test to read.
"""

import faulthandler
import importlib
import logging
import os
import pickle
import signal
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
logging.basicConfig(level=logging.WARNING, format="%(asctime)s rank" + os.environ.get("RANK", "?") + " %(name)s %(levelname)s %(message)s")


# A world that runs out of time gets SIGTERM first: every thread's stack goes to the log.
faulthandler.register(signal.SIGTERM, all_threads=True)


def main() -> int:
    target, outfile, *args = sys.argv[1:]
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(f"worlds.{module_name}"), func_name)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        outcome = {"value": func(rank, world_size, *args)}
        code = 0
    except BaseException:
        outcome = {"error": traceback.format_exc()}
        traceback.print_exc()
        code = 1
    with open(outfile, "wb") as f:
        pickle.dump(outcome, f)
    return code


if __name__ == "__main__":
    sys.exit(main())
