"""Lazy re-exports for package `__init__` files: `from sdk.cascade import CascadeRunner` works,
while `import sdk.cascade.config` (the settings, the CLI) does not load the runner, the router
and the gRPC stubs behind it."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module-level `__getattr__` resolving each name in `exports` (name -> defining module) on first use."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
