"""The OpenAI-compatible HTTP server shared by the local and the cloud tier.

`create_app(engine)` serves any `sdk.engine_protocol.EngineProtocol`.
"""

from sdk.openai_server.app import create_app

__all__ = ["create_app"]
