"""python -m tensorplay_rpc.run (issue 14): workers started with torchrun's variables, their
output prefixed with their rank, a failure ending the world, Ctrl-C passed on."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import end_processes

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(TESTS_DIR, "launcher_worker.py")
LAUNCH = [sys.executable, "-m", "tensorplay_rpc.run"]


def launch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*LAUNCH, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(120)
def test_workers_get_their_ranks_and_their_lines_are_prefixed():
    done = launch("--nproc", "3", WORKER, "ok")
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    want = "sees [(0, 0, 3), (1, 1, 3), (2, 2, 3)]"
    assert lines == [f"[{r}]: {want}" for r in range(3)], done.stdout


@pytest.mark.timeout(120)
def test_a_second_node_numbers_its_workers_after_the_first():
    done = launch("--nproc", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3", "--master-port", "29999", WORKER, "env")
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        f"[{r}]: RANK={r} WORLD_SIZE=4 LOCAL_RANK={r - 2} LOCAL_WORLD_SIZE=2 MASTER_ADDR=10.1.2.3 MASTER_PORT=29999" for r in (2, 3)
    ], done.stdout
    # Between machines the port must be given: no one could guess a free one.
    done = launch("--nproc", "2", "--nnodes", "2", WORKER, "env")
    assert done.returncode == 2 and "--master-port" in done.stderr, done.stderr


@pytest.mark.timeout(120)
def test_a_closed_output_pipe_blocks_no_worker():
    # head exits after two lines: the launcher must drain the workers' output, not stop reading.
    command = " ".join([*LAUNCH, "--nproc", "2", WORKER, "spam"]) + " | head -n 2; echo status=${PIPESTATUS[0]}"
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[2] == "status=0", done.stdout[-500:] + done.stderr[-2000:]


@pytest.mark.timeout(120)
def test_a_failed_worker_ends_the_world_with_its_status():
    started = time.monotonic()
    done = launch("--nproc", "3", WORKER, "fail")
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert "[1]: rank 1 fails on purpose" in done.stderr
    assert "worker 1 exited with status 3" in done.stderr
    assert time.monotonic() - started < 30  # the others were ended, not waited for


@pytest.mark.timeout(120)
def test_ctrl_c_reaches_every_worker(tmp_path):
    launcher = subprocess.Popen([*LAUNCH, "--nproc", "2", WORKER, "wait", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not all((tmp_path / f"ready{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and launcher.poll() is None, "the workers never got ready"
            time.sleep(0.05)
        launcher.send_signal(signal.SIGINT)
        out, err = launcher.communicate(timeout=30)
    finally:
        end_processes([launcher])
    assert launcher.returncode == 130, (launcher.returncode, err)
    assert err.count("KeyboardInterrupt") == 2, err  # each worker got one Ctrl-C, and only one
    # The workers' own processes got it too (each worker leads a process group).
    children = [int((tmp_path / f"child{r}").read_text()) for r in range(2)]
    alive = [pid for pid in children if _alive(pid)]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"processes {alive} of the workers outlived Ctrl-C"


def _alive(pid: int) -> bool:
    """Whether process pid still runs (not a zombie: an orphan is reaped by init)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
