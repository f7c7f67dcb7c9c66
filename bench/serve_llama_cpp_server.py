"""llama-cpp-python's OpenAI server (`python -m llama_cpp.server`), loading models the way tandem does.

    python -m bench.serve_llama_cpp_server --model PATH.gguf [llama_cpp.server options...]

The server has no setting for llama.cpp's `use_extra_bufts` (repacked weight buffers,
which tandem's local engine leaves off: they make a sequence's logits depend on its batch),
so this wrapper runs llama_cpp.server's own `main` with it turned off in the default model
parameters (the same patch the test reference uses).
"""

from __future__ import annotations


def main() -> None:
    from llama_cpp.server.__main__ import main as server_main

    from tests.local_runtime.reference_llama import without_extra_buffer_types

    with without_extra_buffer_types():  # the server loads its model inside main
        server_main()


if __name__ == "__main__":
    main()
