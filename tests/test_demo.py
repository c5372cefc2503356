"""`make demo` keeps working: it runs the seed's example and prints what each call returned."""

import os
import subprocess
import sys

from conftest import TESTS_DIR


def test_demo_prints_the_results():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "MASTER_PORT")}
    proc = subprocess.run(
        [sys.executable, os.path.join(TESTS_DIR, "demo.py")], capture_output=True, text=True, timeout=90, env=env
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "rpc_sync('trainer', add, args=(3, 4)) -> 7" in out
    assert "'hello, world?'" in out
    assert "raised ZeroDivisionError" in out and "On WorkerInfo(id=1, name=trainer)" in out
    assert "rpc_async x5 -> [0, 2, 4, 6, 8]" in out
    assert "then(double) -> 42" in out
    assert "sent by value -> 144" in out
    assert "rpc.remote('ps', Counter) -> UserRRef" in out
    assert "counter on ps: total=15 from 5 master and 5 trainer updates" in out
