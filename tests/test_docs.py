"""Every code block of docs/*.md runs (issue 14). A block is run as the comment before it
says:

- ``<!-- file: NAME -->``: saved as NAME in the page's scratch directory (a later block runs it);
- ``<!-- run -->``: a Python block run as a script there; ``<!-- run: nproc=N -->`` under the
  launcher, as a world of N;
- a ``sh`` block runs in bash there, with this venv's ``python`` first on PATH and ``REPO`` set;
- ``<!-- output -->``: each line of the block must be in the output of the run before it.

A block with no comment is refused: each page's code either runs or says how it is used."""

import importlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import List, Optional

import pytest

from conftest import end_processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")
BLOCK = re.compile(r"(?:<!--\s*(?P<directive>[^>]*?)\s*-->\s*\n)?```(?P<lang>\w*)\n(?P<code>.*?)```", re.S)


@dataclass
class Block:
    page: str
    line: int
    lang: str
    directive: str
    code: str


def blocks(page: str) -> List[Block]:
    text = open(os.path.join(DOCS, page)).read()
    return [
        Block(page, text.count("\n", 0, m.start("code")), m.group("lang"), (m.group("directive") or "").strip(), m.group("code"))
        for m in BLOCK.finditer(text)
    ]


PAGES = sorted(p for p in os.listdir(DOCS) if p.endswith(".md"))


def run(command: List[str], cwd: str, timeout: float) -> str:
    env = dict(os.environ, REPO=REPO, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"], GLOO_SOCKET_IFNAME="lo")
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTEST_CURRENT_TEST"):
        env.pop(var, None)
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        end_processes([proc])
    assert proc.returncode == 0, f"{' '.join(command)} exited {proc.returncode}:\n{out[-4000:]}"
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", [p for p in PAGES if p != "ARCHITECTURE.md"])
def test_every_code_block_of_the_page_runs(page: str, tmp_path) -> None:
    found = blocks(page)
    assert found, f"{page} has no code blocks"
    output: Optional[str] = None
    for i, b in enumerate(found):
        where = f"{page}:{b.line}"
        if b.directive.startswith("file:"):
            (tmp_path / b.directive.split(":", 1)[1].strip()).write_text(b.code)
        elif b.directive == "output":
            assert output is not None, f"{where}: an output block follows no run"
            for line in b.code.strip().splitlines():
                assert line.strip() in output, f"{where}: {line.strip()!r} not in the output:\n{output[-3000:]}"
        elif b.directive.startswith("run") and b.lang == "python":
            script = tmp_path / f"block{i}.py"
            script.write_text(b.code)
            nproc = re.search(r"nproc=(\d+)", b.directive)
            command = [sys.executable, str(script)]
            if nproc:
                command = [sys.executable, "-m", "tensorplay_rpc.run", "--nproc", nproc.group(1), str(script)]
            output = run(command, str(tmp_path), 300)
        elif b.lang in ("sh", "bash"):
            output = run(["bash", "-euo", "pipefail", "-c", b.code], str(tmp_path), 500)
        else:
            pytest.fail(f"{where}: a {b.lang or 'plain'} block with no directive (file:, run, output:) or not sh")


def test_architecture_page_blocks_are_diagrams_only() -> None:
    # ARCHITECTURE.md's blocks are drawings of the layout, not code.
    assert all(b.lang == "" for b in blocks("ARCHITECTURE.md"))


def test_the_api_reference_names_every_public_name() -> None:
    import tensorplay_rpc

    text = open(os.path.join(DOCS, "api.md")).read()
    headings = set(re.findall(r"^### `([^`]+)`", text, re.M))
    # The layers built on RPC are modules of their own (they need torch): their names are
    # headed as module.name, and RRef's method for them as RRef.backward.
    layers = {f"{m}.{n}" for m in ("autograd", "optim", "nn") for n in importlib.import_module(f"tensorplay_rpc.{m}").__all__}
    expected = set(tensorplay_rpc.__all__) | layers | {"RRef.backward"}
    assert headings == expected, f"missing: {sorted(expected - headings)}; not there: {sorted(headings - expected)}"


def test_the_architecture_page_names_every_file() -> None:
    """The map cannot drift: every Go file of core/ and pybind/ (those directly in core/ by
    name, the others as package/file.go) and every module of the package is on the page."""
    text = open(os.path.join(DOCS, "ARCHITECTURE.md")).read()
    missing = []
    for top in ("core", "pybind"):
        for directory, _, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                if not name.endswith(".go") or name.endswith("_test.go"):
                    continue
                parent = os.path.basename(directory)
                wanted = name if parent == "core" else f"{parent}/{name}"
                if wanted not in text:
                    missing.append(os.path.relpath(os.path.join(directory, name), REPO))
    package = os.path.join(REPO, "python", "tensorplay_rpc")
    for name in os.listdir(package):
        module = name[:-3]
        if name.endswith(".py") and name != "__init__.py" and not re.search(rf"(?<![\w.]){re.escape(module)}(?!\w)", text):
            missing.append(f"python/tensorplay_rpc/{name}")
    assert not missing, f"docs/ARCHITECTURE.md does not name: {sorted(missing)}"
