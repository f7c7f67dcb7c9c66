"""Option types shared by the `tandem` commands (kept apart so each command module stays import-light)."""

from __future__ import annotations

import enum


class LogLevel(str, enum.Enum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
