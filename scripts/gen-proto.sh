#!/usr/bin/env bash
# Regenerates the committed gRPC stubs of tandem.v1 (sdk/protocol/wire/tandem_pb2*.py[i]) from
# sdk/protocol/wire/proto/tandem/v1/tandem.proto. The stubs are committed so that installing
# tandem needs only grpcio and protobuf at run time; run this after editing the .proto.
#
# Usage: scripts/gen-proto.sh [OUT_DIR]   (default: sdk/protocol/wire; the stub test passes a temp dir)
# The generated code pins the grpcio and protobuf versions it needs: keep pyproject.toml's lower
# bounds at the versions named in tandem_pb2.py (ValidateProtobufRuntimeVersion) and
# tandem_pb2_grpc.py (GRPC_GENERATED_VERSION).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "${1:-$repo/sdk/protocol/wire}"
out="$(cd "${1:-$repo/sdk/protocol/wire}" && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$python" ] || python=python3

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$repo/sdk/protocol/wire/proto"
"$python" -m grpc_tools.protoc -I . \
    --python_out="$work" --pyi_out="$work" --grpc_python_out="$work" \
    tandem/v1/tandem.proto

# protoc names the modules after the proto's path (tandem/v1/...); they ship flat in the
# sdk.protocol.wire package instead (the wire contract both sides import), so the service module must import its messages from there.
grpc_module="$work/tandem/v1/tandem_pb2_grpc.py"
grep -q '^from tandem\.v1 import tandem_pb2 as' "$grpc_module" || { echo "gen-proto: unexpected import line in $grpc_module" >&2; exit 1; }
sed 's/^from tandem\.v1 import tandem_pb2 as/from sdk.protocol.wire import tandem_pb2 as/' "$grpc_module" > "$out/tandem_pb2_grpc.py"
sed "s/'tandem\.v1\.tandem_pb2'/'sdk.protocol.wire.tandem_pb2'/" "$work/tandem/v1/tandem_pb2.py" > "$out/tandem_pb2.py"  # the classes' __module__
cp "$work/tandem/v1/tandem_pb2.pyi" "$out/"
echo "gen-proto: wrote tandem_pb2.py, tandem_pb2.pyi, tandem_pb2_grpc.py to $out"
