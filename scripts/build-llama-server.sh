#!/usr/bin/env bash
# Builds llama.cpp's own C++ server (llama-server) from the sdist of the llama-cpp-python
# version installed in .venv: the same llama.cpp commit as tandem's local backend, CPU only,
# with llama.cpp's default build options (native CPU flags, OpenMP), as llama-cpp-python's
# own build uses. About 5 minutes on 2 cores the first time; afterwards it only prints the path.
#
#   bash scripts/build-llama-server.sh          # prints the binary's path on its last line
#
# The binary goes to ${TANDEM_LLAMA_SERVER_CACHE:-~/.cache/tandem/llama-server}/<version>/,
# beside llama-cpp.commit (the llama.cpp commit, from the package's CHANGELOG: the sdist
# carries no git metadata). bench.serve --compare-local and the tests that need a real
# OpenAI-compatible engine call this script.
set -euo pipefail
cd "$(dirname "$0")/.."

python=.venv/bin/python
[ -x "$python" ] || { echo "build-llama-server: no .venv; run scripts/setup.sh first" >&2; exit 1; }
version=$("$python" -c 'import llama_cpp; print(llama_cpp.__version__)') \
    || { echo "build-llama-server: llama-cpp-python is not installed in .venv" >&2; exit 1; }
cache=${TANDEM_LLAMA_SERVER_CACHE:-$HOME/.cache/tandem/llama-server}/$version
binary=$cache/llama-server

if [ -x "$binary" ] && "$binary" --version >/dev/null 2>&1; then
    echo "$binary"
    exit 0
fi

for tool in make c++; do
    command -v "$tool" >/dev/null || { echo "build-llama-server: '$tool' not found (needed to build llama-server)" >&2; exit 1; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
if ! command -v cmake >/dev/null; then  # the PyPI wheel, as llama-cpp-python's own build gets it
    echo "build-llama-server: no cmake on PATH; installing the cmake wheel into the build folder" >&2
    "$python" -m pip install --quiet --target "$work/cmake" cmake >&2
    export PATH="$work/cmake/bin:$PATH" PYTHONPATH="$work/cmake${PYTHONPATH:+:$PYTHONPATH}"
fi

echo "build-llama-server: fetching the llama-cpp-python $version sdist" >&2
"$python" -m pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$work" >&2
sdist=$(ls "$work"/llama_cpp_python-*.tar.gz 2>/dev/null | head -n1)
[ -n "$sdist" ] || { echo "build-llama-server: pip produced no sdist for llama-cpp-python==$version" >&2; exit 1; }
tar -xzf "$sdist" -C "$work"
src=$(ls -d "$work"/llama_cpp_python-*/ | head -n1)
[ -f "$src/vendor/llama.cpp/tools/server/CMakeLists.txt" ] \
    || { echo "build-llama-server: the sdist has no vendor/llama.cpp/tools/server" >&2; exit 1; }

# The commit llama-cpp-python vendors: the first "llama.cpp@<sha>" under this version's heading.
commit=$(awk -v v="[$version]" '$0 ~ "^## " {inside = index($0, v) > 0; next} inside && match($0, /llama\.cpp@[0-9a-f]+/) {print substr($0, RSTART + 10, RLENGTH - 10); exit}' "$src/CHANGELOG.md")

echo "build-llama-server: building llama-server (llama.cpp ${commit:-unknown}); this takes a few minutes" >&2
cmake -S "$src/vendor/llama.cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF >"$work/cmake.log" 2>&1 \
    || { tail -n 40 "$work/cmake.log" >&2; echo "build-llama-server: cmake configure failed" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log" >&2; echo "build-llama-server: the build failed" >&2; exit 1; }

built=$(find "$work/build" -type f -name llama-server -perm -u+x | head -n1)
[ -n "$built" ] || { echo "build-llama-server: the build produced no llama-server binary" >&2; exit 1; }
mkdir -p "$cache"
cp "$built" "$binary.tmp" && mv "$binary.tmp" "$binary"  # never a half-copied binary at $binary
echo "${commit:-unknown}" >"$cache/llama-cpp.commit"
"$binary" --version >/dev/null 2>&1 || { echo "build-llama-server: $binary does not run" >&2; exit 1; }
echo "$binary"
