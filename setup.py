"""Builds the Go extension (gopy) as part of the package build; see the Makefile's `native`."""

import os
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


class BuildWithNative(build_py):
    """Run `make native` before collecting the package, so _native/ exists and is current."""

    def run(self):
        subprocess.run(["make", "-C", ROOT, "--no-print-directory", "native"], check=True)
        super().run()


setup(cmdclass={"build_py": BuildWithNative})
