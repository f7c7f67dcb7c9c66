"""The OpenAI-compatible HTTP server shared by the local and the cloud tier.

`create_app(engine)` serves any `sdk.protocol.engine.EngineProtocol`; API keys and
rate limits are opt-in keywords of it. `warn_if_exposed` is for callers that bind a socket.
"""

from sdk.openai_server.access import warn_if_exposed
from sdk.openai_server.app import attach_cloud_engine, create_app

__all__ = ["attach_cloud_engine", "create_app", "warn_if_exposed"]
