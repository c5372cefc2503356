"""Builds the Go extension (gopy) for the interpreter that runs the build.

A package build never changes the system: it checks for the tools it needs (Go, a C compiler,
this interpreter's headers, pybindgen) and stops at once, naming what is missing, before any
work. `make native` (the development build) runs the same step: `python setup.py build_native`.

A build from an sdist takes the Go modules from its `gomodules/`, a module proxy directory made
by this file's sdist command, so it needs no network; a build from a checkout uses Go's own
module cache and proxy. (Not `go mod vendor`: gopy builds with -mod=mod, which ignores it.)
"""

import hashlib
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile

from setuptools import Command, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))
NATIVE_DIR = os.path.join(ROOT, "python", "tensorplay_rpc", "_native")
STAMP = os.path.join(NATIVE_DIR, ".built")
TOOLS_DIR = os.path.join(ROOT, "tools")
TOOLS_BIN = os.path.join(ROOT, "bin")
GO_MODULES = os.path.join(ROOT, "gomodules")
# The commands that compile; sdist and egg_info only collect files and need no tools.
# dist_info is how pip starts a wheel build (its metadata), so a missing tool stops it there.
COMPILING_COMMANDS = {"build", "build_py", "build_native", "bdist_wheel", "dist_info", "install", "develop", "editable_wheel"}


class BuildToolMissing(SystemExit):
    """A tool the build needs is not there: the message says which and how to get it."""


def find_go() -> str:
    """The go command: on PATH, or where Go's own installer puts it."""
    for candidate in (shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return ""


def missing_build_tools() -> list:
    """What the build of the extension needs and cannot find, each with how to get it."""
    missing = []
    if not find_go():
        missing.append("Go 1.26 or newer (the `go` command): https://go.dev/dl (Debian 12's golang-go is too old)")
    cc = os.environ.get("CC", "gcc").split()[0]
    if not shutil.which(cc):
        missing.append(f"a C compiler ({cc}): Debian's gcc")
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if not os.path.exists(headers):
        missing.append(f"the headers of {sys.executable} ({headers}): Debian's python3-dev for Debian's Python")
    # setuptools before 70.1 makes wheels with the wheel package.
    if importlib.util.find_spec("setuptools.command.bdist_wheel") is None and importlib.util.find_spec("wheel") is None:
        missing.append(f"the wheel package, importable by {sys.executable}: Debian's python3-wheel, or `pip install wheel`")
    if importlib.util.find_spec("pybindgen") is None:
        missing.append(f"pybindgen, importable by {sys.executable}: Debian's python3-pybindgen, or `pip install pybindgen`")
    return missing


def require_build_tools() -> None:
    """Stop the build, before any work, if a tool it needs is missing."""
    missing = missing_build_tools()
    if missing:
        raise BuildToolMissing(
            "tensorplay-rpc: cannot build the Go extension for " + sys.executable + "; missing:\n  - " + "\n  - ".join(missing)
        )


def go_env() -> dict:
    """The environment of every go command: the bundled modules when they are there (and then
    nothing from the network, not even a newer Go), and cgo's -fwrapv, which the generated
    bindings need."""
    env = dict(os.environ, CGO_LDFLAGS_ALLOW="-fwrapv", PATH=TOOLS_BIN + os.pathsep + os.path.dirname(find_go()) + os.pathsep + os.environ.get("PATH", ""))
    if os.path.isdir(GO_MODULES) and os.path.exists(os.path.join(ROOT, "PKG-INFO")):  # an sdist
        env.update(GOPROXY=pathlib.Path(GO_MODULES).as_uri(), GOSUMDB="off", GOTOOLCHAIN="local", GONOPROXY="", GOPRIVATE="", GOFLAGS="-mod=mod", CGO_ENABLED="1")
    return env


def native_inputs_digest() -> str:
    """A digest of what the extension is built from and for: rebuilt when any of it changes."""
    # The interpreter's real file and its extension suffix: a venv's python is Debian's.
    digest = hashlib.sha256(f"{os.path.realpath(sys.executable)} {sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    files = [os.path.join(ROOT, name) for name in ("go.mod", "go.sum", "setup.py", "tools/go.mod", "tools/go.sum", "tools/tools.go")]
    for top in ("core", "pybind"):
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames.sort()
            files += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".go") and not f.endswith("_test.go")]
    for path in files:
        digest.update(os.path.relpath(path, ROOT).encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def build_native() -> None:
    """Build python/tensorplay_rpc/_native with gopy for this interpreter, unless it is current."""
    want = native_inputs_digest()
    if os.path.exists(STAMP):
        with open(STAMP) as f:
            if f.read().strip() == want:
                return
    require_build_tools()
    env = go_env()
    go = find_go()
    os.makedirs(TOOLS_BIN, exist_ok=True)
    for tool, package in (("gopy", "github.com/go-python/gopy"), ("goimports", "golang.org/x/tools/cmd/goimports")):
        subprocess.run([go, "build", "-o", os.path.join(TOOLS_BIN, tool), package], cwd=TOOLS_DIR, env=env, check=True)
    print(f"building the Go extension with gopy for {sys.executable}", flush=True)
    shutil.rmtree(NATIVE_DIR, ignore_errors=True)
    log_path = os.path.join(ROOT, "build-native.log")
    with open(log_path, "w") as log:
        # -symbols=false: the library is built stripped (19 MB with symbols).
        result = subprocess.run(
            [os.path.join(TOOLS_BIN, "gopy"), "build", f"-vm={sys.executable}", "-dynamic-link=true", "-no-make=true", "-symbols=false", f"-output={NATIVE_DIR}", "./pybind"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    if result.returncode != 0:
        with open(log_path) as log:
            sys.stderr.write(log.read())
        raise SystemExit(f"tensorplay-rpc: gopy failed (exit {result.returncode}); its output is above and in {log_path}")
    with open(STAMP, "w") as f:
        f.write(want + "\n")


class BuildNative(Command):
    """`python setup.py build_native`: build the extension in place (what `make native` runs)."""

    description = "build the Go extension with gopy for this interpreter"
    user_options: list = []

    def initialize_options(self) -> None:
        pass

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        build_native()


class BuildWithNative(build_py):
    """Build the extension before collecting the package, so _native/ exists and is current."""

    def run(self) -> None:
        build_native()
        super().run()


class SdistWithGoModules(sdist):
    """An sdist that builds offline: the Go modules of the project and of its build tools go
    into it as a module proxy directory (gomodules/, made here, never committed)."""

    def run(self) -> None:
        go = find_go()
        if not go:
            raise BuildToolMissing("tensorplay-rpc: making the sdist bundles the Go modules, and needs Go: https://go.dev/dl")
        # Made afresh for every sdist: the modules must be those go.mod names now.
        shutil.rmtree(GO_MODULES, ignore_errors=True)
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, GOMODCACHE=cache, GOFLAGS="-mod=mod")
            for module_dir in (ROOT, TOOLS_DIR):
                subprocess.run([go, "mod", "download"], cwd=module_dir, env=env, check=True)
            # The cache's download tree is the layout a file:// GOPROXY serves.
            shutil.copytree(os.path.join(cache, "cache", "download"), GO_MODULES, ignore=shutil.ignore_patterns("*.lock", "sumdb"))
            subprocess.run(["chmod", "-R", "u+w", cache], check=False)  # Go makes its cache read-only
        super().run()


class BinaryDistribution(Distribution):
    """The package holds a compiled library: its wheel is tagged for this interpreter and
    platform (cp311-cp311-linux_x86_64, say), never py3-none-any."""

    def has_ext_modules(self) -> bool:
        return True


if COMPILING_COMMANDS & set(sys.argv[1:]):
    require_build_tools()

setup(
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildWithNative, "build_native": BuildNative, "sdist": SdistWithGoModules},
)
