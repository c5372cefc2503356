"""init_rpc(name) with no rank or world size, under the launchers users run (issue 14): the
variables torchrun, Slurm's srun and Open MPI's mpirun set, as they set them."""

import json
import os
import subprocess
import sys

import pytest

from conftest import TESTS_DIR, end_processes, free_port
from tensorplay_rpc import api


@pytest.mark.parametrize(
    "env, expected",
    [
        # torchrun (and python -m tensorplay_rpc.run)
        ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1"},
         {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1"}),
        # srun: the first host of the job's node list is the master
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_JOB_NODELIST": "gpu[07-09,12],cpu1"},
         {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu07"}),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODELIST": "node-a,node-b"},
         {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "node-a"}),
        # a MASTER_ADDR that is set wins over the node list
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]", "MASTER_ADDR": "head"},
         {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "head"}),
        # mpirun (Open MPI)
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "MASTER_ADDR": "h"},
         {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "h"}),
        # torchrun's variables come first when several launchers' are there
        ({"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "7", "OMPI_COMM_WORLD_RANK": "9"},
         {"RANK": "1", "WORLD_SIZE": "2"}),
        ({}, {}),
    ],
)
def test_cluster_variables(env, expected):
    assert api.cluster_env(env) == expected


@pytest.mark.parametrize(
    "nodelist, first",
    [("a", "a"), ("a,b", "a"), ("x[3-5]", "x3"), ("x[003-005]y", "x003y"), ("p[1,4-6],q", "p1"),
     ("rack[1-2]-node[01-04]", "rack1-node01"), ("cn[1-2]-[1-4],z", "cn1-1"), ("node[1-3]-ib", "node1-ib"), ("gpu2[01-05]", "gpu201")],
)
def test_slurm_first_host(nodelist, first):
    assert api.slurm_first_host(nodelist) == first


def test_env_rendezvous_takes_slurm_variables(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "OMPI_COMM_WORLD_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29123")
    assert api._rendezvous_args("env://", -1, None) == ("tcp://127.0.0.1:29123", 1, 3)
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(ValueError, match="MASTER_PORT"):
        api._rendezvous_args("env://", -1, None)


@pytest.mark.timeout(120)
def test_under_a_real_mpirun(tmp_path):
    """Open MPI's own mpirun (Debian's openmpi-bin) starts three workers; each finds its
    rank and the world size in Open MPI's variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    command = [
        "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3",
        "-x", "MASTER_ADDR", "-x", "MASTER_PORT",
        sys.executable, os.path.join(TESTS_DIR, "cluster_worker.py"),
    ]
    proc = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=90)
    finally:
        end_processes([proc])
    assert proc.returncode == 0, out
    seen = sorted((json.loads(p.read_text()) for p in tmp_path.glob("seen-*.json")), key=lambda w: w["id"])
    assert seen == [{"name": f"w{i}", "id": i, "peer": [f"w{(i + 1) % 3}", (i + 1) % 3]} for i in range(3)], out
