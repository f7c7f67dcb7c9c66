"""The cloud tier's gRPC service (package tandem.v1) over any EngineProtocol engine.

- `proto/tandem/v1/tandem.proto`: the service definition (the documentation of every field).
- `tandem_pb2*.py[i]`: stubs generated from it by scripts/gen-proto.sh and committed, so a
  deployment needs only grpcio and protobuf (no code generation at install time).
- `convert`: proto messages <-> engine dataclasses; `errors`: engine errors <-> gRPC status.
- `service`: the servicer; `auth`: the API-key interceptor;
  `server`: `GrpcServerConfig`, `start_grpc_server`, `stop_grpc_server`.

Nothing is imported here so `import cloud_engine.grpc.tandem_pb2` (the SDK's client) stays light.
"""
