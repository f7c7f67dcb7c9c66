"""The cloud tier's gRPC service (package tandem.v1) over any EngineProtocol engine.

The wire contract (the .proto, its committed stubs, the client half of the conversion, the error
metadata keys) lives below both sides in sdk.protocol.wire; this package is the server's half:
- `convert`: GenerateRequest -> the engine's request (with every check that can name a field),
  TokenEvent -> GenerateResponse; `errors`: engine errors -> gRPC status;
- `service`: the servicer; `draft_door`: the bounds on a GenerateWithDrafts caller's drafts;
  `auth`: the API-key interceptor;
  `server`: `GrpcServerConfig`, `start_grpc_server`, `stop_grpc_server`.
"""
