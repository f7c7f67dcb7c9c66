"""Apps for tests, written as the tests name their parts: an engine, then AppConfig's fields and AppServices'
parts by keyword (`make_app(engine, api_keys={"k"}, response_store=store)`). Production builds the two itself
(sdk.cli.serve, sdk.cli.cloud) and calls create_app(config, services)."""

from __future__ import annotations

from dataclasses import replace

from sdk.openai_server import AppConfig, AppServices, create_app
from sdk.openai_server.app_config import APP_CONFIG_FIELDS


def make_app(engine, config: AppConfig | None = None, **parts):
    """create_app over `engine`: `parts` that name AppConfig fields are laid over `config`, the rest are
    AppServices' (an unknown name is a TypeError, as either dataclass says)."""
    settings = {name: parts.pop(name) for name in list(parts) if name in APP_CONFIG_FIELDS}
    return create_app(replace(config or AppConfig(), **settings), AppServices(engine, **parts))
