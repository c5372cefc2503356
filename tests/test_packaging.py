"""The package as pip builds and installs it (issue 15): a wheel tagged for the interpreter and
platform that built it, holding only what runs; an sdist that builds without the network; no
step that changes the system; a clear stop under an interpreter that cannot build it.

Each build starts from a clean copy of the tracked files, as a clone has them, and each install
goes into a fresh venv used from a directory outside the source tree."""

import glob
import os
import re
import shutil
import subprocess
import sysconfig
import tarfile
import zipfile
from typing import Dict, List

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEBIAN_PYTHON = "/usr/bin/python3"
# Interpreters on this machine that are not Debian's (pyenv's), which lack pybindgen.
OTHER_PYTHONS = sorted(glob.glob("/root/.pyenv/versions/3.1[12].*/bin/python3"))

# A two-worker world started by the package's launcher, run from outside the source tree.
TWO_WORKERS = '''
import os
import tensorplay_rpc as rpc

def add(a, b):
    return a + b

rank = int(os.environ["RANK"])
rpc.init_rpc(f"w{rank}")
print("FROM", rpc.__file__)
print("RESULT", rpc.rpc_sync(f"w{1 - rank}", add, args=(rank, 40)))
rpc.shutdown()
'''


def offline_env(**extra: str) -> Dict[str, str]:
    """No index for pip, and a proxy that refuses every connection for anything else."""
    env = dict(os.environ)
    for name in ("PIP_FIND_LINKS", "PYTHONPATH"):
        env.pop(name, None)
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9")
    env.update(extra)
    return env


def run(cmd: List[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture
def clean_copy(tmp_path) -> str:
    """The tracked files, copied as a fresh clone has them (no _native, no venv, no bin)."""
    dest = str(tmp_path / "src" / "tensorplay-rpc")
    files = run(["git", "-C", ROOT, "ls-files", "-z"], 30).stdout.split("\0")
    for rel in filter(None, files):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))
    return dest


def fresh_venv(path: str) -> str:
    run([DEBIAN_PYTHON, "-m", "venv", "--system-site-packages", path], 120)
    return os.path.join(path, "bin", "python")


def check_two_workers(python: str, venv: str, workdir: str) -> None:
    """The installed package, not a source tree, runs a two-worker call."""
    os.makedirs(workdir, exist_ok=True)
    script = os.path.join(workdir, "two_workers.py")
    with open(script, "w") as f:
        f.write(TWO_WORKERS)
    done = run([python, "-m", "tensorplay_rpc.run", "--nproc", "2", script], 120, cwd=workdir, env=offline_env())
    assert sorted(re.findall(r"RESULT (\d+)", done.stdout)) == ["40", "41"], done.stdout + done.stderr
    for where in re.findall(r"FROM (\S+)", done.stdout):
        assert where.startswith(venv) and not where.startswith(ROOT), f"imported from {where}, not the venv {venv}"
    # The venv sees Debian's packages, some with their own unmet dependencies (pygobject's
    # pycairo): pip check must report nothing about this package.
    check = subprocess.run([python, "-m", "pip", "check"], capture_output=True, text=True, timeout=60, env=offline_env())
    ours = [line for line in (check.stdout + check.stderr).splitlines() if "tensorplay" in line.lower()]
    assert not ours, check.stdout + check.stderr


def elf_has_symbol_table(path: str) -> bool:
    with open(path, "rb") as f:
        return b".symtab\0" in f.read()


@pytest.mark.timeout(900)
def test_the_wheel_is_tagged_for_this_interpreter_and_holds_only_what_runs(clean_copy, tmp_path):
    dist = str(tmp_path / "dist")
    run([DEBIAN_PYTHON, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", dist, clean_copy], 600, env=offline_env())
    wheels = glob.glob(os.path.join(dist, "*.whl"))
    assert len(wheels) == 1, wheels
    version = run([DEBIAN_PYTHON, "-c", "import runpy; print(runpy.run_path('python/tensorplay_rpc/version.py')['__version__'])"], 30, cwd=clean_copy).stdout.strip()
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert os.path.basename(wheels[0]) == f"tensorplay_rpc-{version}-cp311-cp311-{platform}.whl"
    with zipfile.ZipFile(wheels[0]) as whl:
        names = whl.namelist()
        wheel_meta = whl.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        libraries = [n for n in names if n.endswith(".so")]
        assert libraries == ["tensorplay_rpc/_native/_pybind.cpython-311-x86_64-linux-gnu.so"], libraries
        whl.extract(libraries[0], str(tmp_path / "unpacked"))
    assert "Root-Is-Purelib: false" in wheel_meta and "Tag: cp311-cp311-" in wheel_meta, wheel_meta
    assert "tensorplay_rpc/py.typed" in names
    extra = [n for n in names if not n.startswith("tensorplay_rpc-") and not re.fullmatch(r"tensorplay_rpc/[\w/.-]*\.(py|so)|tensorplay_rpc/py\.typed", n)]
    assert not extra, f"files that do not run: {extra}"
    assert "tensorplay_rpc/_native/build.py" not in names, "gopy's build script ships"
    assert not elf_has_symbol_table(str(tmp_path / "unpacked" / libraries[0])), "the library is not stripped"
    for requirement in ("Requires-Dist: cloudpickle", "Requires-Dist: msgpack", "Provides-Extra: numpy", "Provides-Extra: torch"):
        assert requirement in metadata, metadata

    venv = str(tmp_path / "venv")
    python = fresh_venv(venv)
    run([python, "-m", "pip", "install", "--no-deps", wheels[0]], 120, env=offline_env())
    check_two_workers(python, venv, str(tmp_path / "elsewhere"))


@pytest.mark.timeout(900)
def test_the_sdist_builds_and_installs_without_the_network(clean_copy, tmp_path):
    dist = str(tmp_path / "dist")
    # Making the sdist bundles the Go modules: it may use the module proxy, as a release would.
    run([DEBIAN_PYTHON, "-m", "build", "--sdist", "--no-isolation", "-o", dist, clean_copy], 600)
    sdists = glob.glob(os.path.join(dist, "*.tar.gz"))
    assert len(sdists) == 1, sdists
    with tarfile.open(sdists[0]) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    for needed in ("setup.py", "go.mod", "go.sum", "core/agent.go", "pybind/agent.go", "tools/tools.go", "python/tensorplay_rpc/py.typed"):
        assert needed in names, f"the sdist lacks {needed}"
    assert any(n.startswith("gomodules/google.golang.org/grpc/@v/") and n.endswith(".zip") for n in names), "the sdist does not carry the Go modules"
    assert not [n for n in names if "/_native/" in n or n.endswith(".so")], "the sdist carries built files"

    # Built with an empty module cache and every connection refused: only the sdist's modules.
    venv = str(tmp_path / "venv")
    python = fresh_venv(venv)
    modcache = str(tmp_path / "empty-modcache")
    try:
        run([python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", sdists[0]], 900, env=offline_env(GOMODCACHE=modcache, GOFLAGS="-modcacherw"))
    finally:
        shutil.rmtree(modcache, ignore_errors=True)
    check_two_workers(python, venv, str(tmp_path / "elsewhere"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("python", OTHER_PYTHONS + ["a venv without Debian's packages"])
def test_another_interpreter_gets_a_working_wheel_or_an_immediate_clear_stop(clean_copy, tmp_path, python):
    """This machine's other Pythons (pyenv's) and a venv that does not see Debian's packages
    lack pybindgen, wheel or setuptools: pip stops at once, naming what is missing, and builds
    nothing for the wrong interpreter."""
    if not os.path.isabs(python):
        run([DEBIAN_PYTHON, "-m", "venv", str(tmp_path / "bare")], 120)
        python = str(tmp_path / "bare" / "bin" / "python")
    done = subprocess.run(
        [python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(tmp_path / "dist"), clean_copy],
        capture_output=True, text=True, timeout=240, env=offline_env(PIP_DEFAULT_TIMEOUT="5"),
    )
    output = done.stdout + done.stderr
    if done.returncode == 0:
        wheel = glob.glob(str(tmp_path / "dist" / "*.whl"))[0]
        tag = run([python, "-c", "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"], 30).stdout.strip()
        assert f"-{tag}-{tag}-" in os.path.basename(wheel), wheel
        return
    has_setuptools = subprocess.run([python, "-c", "import setuptools"], capture_output=True).returncode == 0
    if has_setuptools:
        assert "cannot build the Go extension for " + python in output and "pybindgen" in output, output[-3000:]
        assert "building the Go extension" not in output, "it started building before it stopped"
    else:
        assert "setuptools" in output, output[-3000:]
