"""The CPU attention kernel for tests: skipped only where the machine has no C++ compiler.

cpu_kernels() returns None for any build failure (the engine falls back to the portable path),
so a test that skipped on None would pass a broken kernel source off as a missing compiler.
"""

from __future__ import annotations

import os

import pytest

from cloud_engine.kernels import cpu_build


def cpu_kernels_or_none():
    """The compiled kernel module, or None where this machine has no C++ compiler; with one, a
    failed build fails the test and shows the builder's error."""
    compiler = cpu_build.cxx_compiler()
    if compiler is None:
        return None
    kernels = cpu_build.cpu_kernels()
    if kernels is None:
        pytest.fail(f"the CPU attention kernel did not build with {compiler}: {cpu_build.last_build_error}")
    return kernels


def built_cpu_kernels():
    """The compiled kernel module; a skip where this machine has no C++ compiler."""
    kernels = cpu_kernels_or_none()
    if kernels is None:
        pytest.skip(f"no C++ compiler ({os.environ.get('CXX', 'c++')}) on this machine")
    return kernels
