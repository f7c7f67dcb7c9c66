"""The config file `tandem calibrate` writes: where it is, what it holds, and setting
`[cascade] threshold` (or `prompt_router_threshold`) in it (validated as `tandem serve` would read
it before it replaces the old one)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import tomllib

from sdk.settings.loading import load_settings
from sdk.settings.reading import default_config_path


def config_path(config: str | os.PathLike | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The file `tandem serve` would read (sdk.settings), whether or not it exists yet."""
    env = os.environ if env is None else env
    if config is not None or env.get("TANDEM_CONFIG"):
        return Path(config if config is not None else env["TANDEM_CONFIG"]).expanduser().resolve()
    return Path(default_config_path(env))


def read_config(path: Path) -> dict:
    """The TOML file as a dict; {} when it does not exist."""
    if not path.is_file():
        return {}
    with open(path, "rb") as handle:
        return tomllib.load(handle)


# The confidence policy's threshold (also the request's default), and the prompt router's.
THRESHOLD_KEYS = ("threshold", "prompt_router_threshold")


def write_threshold(path: Path, threshold: float, key: str = "threshold") -> None:
    """Set [cascade] `key` (THRESHOLD_KEYS), keeping every other key (TOML comments are lost: tomli_w
    writes data only).

    The new file is validated as tandem serve would read it before it replaces the old one."""
    import tomli_w  # only calibrate writes TOML

    if key not in THRESHOLD_KEYS:
        raise ValueError(f"calibrate writes one of [cascade] {', '.join(THRESHOLD_KEYS)}, not {key!r}")
    data = read_config(path)
    data.setdefault("cascade", {})[key] = float(threshold)
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(path.name + ".calibrating")
    staged.write_text(tomli_w.dumps(data), encoding="utf-8")
    try:
        load_settings(staged, env={})
    except Exception:
        staged.unlink()
        raise
    os.replace(staged, path)
