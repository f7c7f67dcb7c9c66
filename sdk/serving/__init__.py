"""The serving layer: what puts any engine behind a network listener.

- `grpc`: the tandem.v1 gRPC server for any EngineProtocol engine (the cloud engine's, and an
  embedded one's private listener);
- `access_gate`, `client_limits`, `api_keys`: who may call and how much, shared by the gRPC server
  and the OpenAI HTTP server (sdk.openai_server) so a key has one budget whichever door it uses;
- `prompt_tokens`: prompt tokenization that never holds up the event loop both servers run on.

Engines do not import this package; it imports the contracts (sdk.protocol) and serves engines
through them.
"""
