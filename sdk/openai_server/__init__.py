"""The OpenAI-compatible HTTP server shared by the local and the cloud tier.

`create_app(config, services)` serves any `sdk.protocol.engine.EngineProtocol` (`AppServices`: the
engine and what else the app serves with, each built by its caller); its `AppConfig` (built by
sdk.settings for `tandem serve` and `tandem cloud serve`) turns on API keys and rate limits.
`warn_if_exposed` is for callers that bind a socket.
"""

from sdk.openai_server.access import warn_if_exposed
from sdk.openai_server.app import AppServices, attach_cloud_engine, create_app
from sdk.openai_server.app_config import AppConfig

__all__ = ["AppConfig", "AppServices", "attach_cloud_engine", "create_app", "warn_if_exposed"]
