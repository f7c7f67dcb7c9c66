#!/usr/bin/env bash
# Prepares what scripts/cuda-check.sh takes to a lent GPU machine, here, before any device time is spent:
#   .whl/  cp312 wheels of the project's dependencies that the machine's image lacks (its python3 is 3.12 and
#          reaches no registry; KINDS.md in the device library lists what it has),
#   .gpu/smollm2-tokenizer  SmolLM2's tokenizer exported from the embedded GGUF (the GGUF itself is too big to travel).
# Both are ignored by git (.git/info/exclude); name them in the device call's `carry`.
# Versions follow this checkout's .venv, so the wheels match what the tests run with here.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || printf '/.whl/\n/.gpu/\n' >> .git/info/exclude
# Missing from the image, found by running tests/cloud_engine there (2026-11-28): the web stack (fastapi needs
# opentelemetry-api; the replica test starts `tandem cloud serve`, which needs uvicorn), pydantic, the gRPC
# extras and the protobuf runtime the committed stubs check, gguf, llguidance, pytest-asyncio, jsonschema.
NAMES="fastapi starlette uvicorn opentelemetry-api pydantic pydantic_core annotated-types annotated-doc typing-inspection
typing_extensions gguf llguidance grpcio grpcio-health-checking grpcio-reflection protobuf pytest-asyncio jsonschema
jsonschema-specifications referencing rpds-py sniffio h11 click"
platforms=(--platform manylinux2014_x86_64)
for n in 17 24 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
mkdir -p .whl
for name in $NAMES; do
    version=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d .whl "$name==$version"
done
[ -d .gpu/smollm2-tokenizer ] || .venv/bin/python -c "from bench.random_model import export_tokenizer; export_tokenizer('.gpu/smollm2-tokenizer')"
du -sh .whl .gpu
