"""The tandem.v1 wire contract, imported by both sides: the cloud engine's gRPC service
(sdk.serving.grpc) and the SDK's client (sdk.cloud.grpc_client).

- `proto/tandem/v1/tandem.proto`: the service definition (the documentation of every field).
- `tandem_pb2*.py[i]`: stubs generated from it by scripts/gen-proto.sh and committed, so a
  deployment needs only grpcio and protobuf (no code generation at install time).
- `messages`: the client half of the conversion (SamplingParams -> GenerateRequest, responses ->
  CloudTokenEvent); the server half lives with the servicer (sdk.serving.grpc.convert).
- `status`: the trailing metadata that carries an error's type, field and retry hint.

Nothing is imported here so importing a stub stays light.
"""
