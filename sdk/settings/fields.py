"""Every tandem setting, declared once: section, key, type, default, env var and help text.

`sdk.settings` layers built-in defaults < a TOML file < TANDEM_* env vars < command-line
values over this table. A new setting is one `SettingField` line here; `tandem config show`
and the validation pick it up from the table.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from router.costs import CostTable
from router.decision import HandoffMode
from router.privacy import PrivacyRules
from router.streaming_policy import DecideAt
from sdk.cascade.config import CascadeConfig
from sdk.cloud.targets import is_replica_target
from sdk.protocol.sampling_params import TUNABLES
from sdk.settings.checks import Check, at_least, one_of, speculative
from sdk.traffic.config import TrafficSettings

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_KINDS = {str: "a string", int: "an integer", float: "a number", bool: "true or false", dict: "a table"}


class SettingsError(ValueError):
    """A bad config file, value or key; the message names the key, where it came from and what is allowed."""


@dataclass(frozen=True)
class CloudTarget:
    """Where the cascade's cloud tier is, parsed from `cloud.url`."""

    kind: str  # "embedded" | "none" | "grpc" | "http"
    target: str | None = None  # "host:port" for grpc, the base URL for http, None otherwise
    tls: bool = False  # grpcs:// or https://


CLOUD_URL_FORMS = (
    "'embedded', 'none', grpc://HOST:PORT, grpcs://HOST:PORT, replicas in gRPC's syntax (ipv4:H1:P1,H2:P2, "
    "ipv6:[H1]:P1,..., dns:///HOST:PORT) or an OpenAI-compatible http(s):// base URL"
)


def parse_cloud_url(url: str) -> CloudTarget:
    """The cloud tier named by `url`; SettingsError (saying which forms are allowed) otherwise."""
    if url in ("embedded", "none"):
        return CloudTarget(url)
    if is_replica_target(url):
        return CloudTarget("grpc", _replica_target(url), tls=False)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a port that is not a number, or out of range
        raise SettingsError(f"cloud URL {url!r} is malformed ({exc}); expected {CLOUD_URL_FORMS}") from exc
    if parts.scheme in ("grpc", "grpcs"):
        # A gRPC channel target is host:port only; a path would be silently ignored.
        if not parts.hostname or not port or parts.username or parts.path.strip("/") or parts.query or parts.fragment:
            raise SettingsError(f"cloud URL {url!r} must be {parts.scheme}://HOST:PORT with nothing after the port")
        return CloudTarget("grpc", parts.netloc, tls=parts.scheme == "grpcs")
    if parts.scheme in ("http", "https") and parts.hostname:
        return CloudTarget("http", url.rstrip("/"), tls=parts.scheme == "https")
    raise SettingsError(f"cloud URL {url!r} is not supported; expected {CLOUD_URL_FORMS}")


def _replica_target(url: str) -> str:
    """A set of replicas as gRPC names them, checked enough that a typo fails here, not at the first call."""
    scheme, _, rest = url.partition(":")
    if scheme == "dns":
        name = rest[3:] if rest.startswith("///") else rest
        host, _, port = name.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SettingsError(f"cloud URL {url!r} must be dns:///HOST:PORT (every address HOST resolves to, on PORT)")
        return url
    addresses = rest.split(",")
    for address in addresses:
        host, _, port = address.rpartition(":")
        if (
            not host
            or not port.isdigit()
            or not 0 < int(port) < 65536
            or (scheme == "ipv6" and not host.startswith("["))
        ):
            form = "[ADDR]:PORT" if scheme == "ipv6" else "ADDR:PORT"
            raise SettingsError(f"cloud URL {url!r}: {address!r} is not {form}; expected {scheme}:{form},{form},...")
    return url


@dataclass(frozen=True)
class SettingField:
    """One setting. `None` as default means optional: unset, and `unset` says what that means."""

    section: str
    key: str
    type: type  # str, int, float, bool or dict (a TOML table)
    default: Any
    env: str | None  # None: set only in the TOML file (or by a command-line option)
    help: str
    unset: str = ""  # what an unset (None) value means
    check: Check | None = None
    target: str | None = None  # the field of LocalEngineConfig / CloudEngineConfig / CascadeConfig it feeds
    secret: bool = False  # printed as "***"

    @property
    def dotted(self) -> str:
        return f"{self.section}.{self.key}"

    @property
    def optional(self) -> bool:
        return self.default is None

    @property
    def kind(self) -> str:
        return _KINDS[self.type] + (" (or unset)" if self.optional else "")

    def coerce(self, value: Any) -> Any:
        """`value` (from TOML or the command line) as this key's type, checked; ValueError says what is allowed."""
        if isinstance(value, enum.Enum):  # typer passes Enum choices
            value = value.value
        if value is None and self.optional:
            return None
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # TOML writes 1 for 1.0
        if not isinstance(value, self.type) or (self.type is int and isinstance(value, bool)):
            raise ValueError(f"must be {self.kind}, got {type(value).__name__}")
        if self.check is not None:
            self.check(value)
        return value

    def parse_env(self, raw: str) -> Any:
        """An env var's text as this key's value; empty means unset (optional keys only)."""
        text = raw.strip()
        if not text:
            if self.optional:
                return None
            raise ValueError(f"is empty; must be {self.kind} (unset the variable to use the default)")
        if self.type is dict:
            raise ValueError("is a table: set it in the TOML file")
        if self.type is bool:
            if text.lower() not in _BOOL_WORDS:
                raise ValueError("must be true/false, 1/0 or yes/no")
            return _BOOL_WORDS[text.lower()]
        try:
            value = self.type(text)
        except ValueError:
            raise ValueError(f"must be {self.kind}") from None
        return self.coerce(value)


_CASCADE = {
    f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
    for f in dataclasses.fields(CascadeConfig)
}


def _cascade(
    key: str, type_: type, env: str | None, help: str, target: str | None = None, **extra: Any
) -> SettingField:
    """A [cascade] key, its default taken from CascadeConfig so the numbers live in one place."""
    return SettingField("cascade", key, type_, _CASCADE[target or key], env, help, target=target or key, **extra)


_ENGINE_DEFAULT = "the engine's default"
_TRAFFIC = {f.name: f.default for f in dataclasses.fields(TrafficSettings)}


def _traffic(key: str, type_: type, help: str, **extra: Any) -> SettingField:
    """A [traffic] key, its default taken from TrafficSettings."""
    env = None if type_ is dict else f"TANDEM_TRAFFIC_{key.upper()}"
    return SettingField("traffic", key, type_, _TRAFFIC[key], env, help, target=key, **extra)


# [local.sampling] / [cloud.sampling]: the tier's default for a field a request leaves out, one key per
# tunable SamplingParams declares (sdk.protocol.sampling_params), checked against its declared range.
_SAMPLING_KEYS = tuple(
    (
        name,
        knob.type,
        f"{knob.doc}, when a request sends none.",
        at_least(knob.low, knob.low_inclusive, knob.high if math.isfinite(knob.high) else None),
    )
    for name, knob in TUNABLES.items()
)

FIELDS_LIST: tuple[SettingField, ...] = (
    SettingField(
        "server", "host", str, "127.0.0.1", "TANDEM_HOST", "Address `tandem serve` listens on (0.0.0.0 for all)."
    ),
    SettingField(
        "server", "port", int, 8000, "TANDEM_PORT", "TCP port of the HTTP endpoint.", check=at_least(0, high=65535)
    ),
    SettingField(
        "server", "log_level", str, "info", "TANDEM_LOG_LEVEL", "Server log level.", check=one_of(*LOG_LEVELS)
    ),
    SettingField(
        "server",
        "api_key_file",
        str,
        None,
        "TANDEM_API_KEY_FILE",
        "Keys clients must present, one per line (TANDEM_API_KEYS adds comma-separated ones).",
        unset="no key file",
    ),
    SettingField(
        "server",
        "rate_limit",
        float,
        None,
        "TANDEM_RATE_LIMIT",
        "Requests per minute per key.",
        unset="no limit",
        check=at_least(0, inclusive=False),
    ),
    SettingField(
        "server",
        "max_concurrent_per_key",
        int,
        None,
        "TANDEM_MAX_CONCURRENT_PER_KEY",
        "Requests (streams included) in flight at once per key (per client address without keys); one more is 429.",
        unset="no limit",
        check=at_least(1),
    ),
    SettingField(
        "server",
        "auth_backoff_after",
        int,
        10,
        "TANDEM_AUTH_BACKOFF_AFTER",
        "Failed API keys from one client address before it must wait (1 s, doubling to auth_backoff_max_s) and its requests get 429 unchecked; 0: off.",
        check=at_least(0),
    ),
    SettingField(
        "server",
        "auth_backoff_max_s",
        float,
        300.0,
        "TANDEM_AUTH_BACKOFF_MAX_S",
        "Longest wait of a client address backing off after failed API keys, seconds.",
        check=at_least(1),
    ),
    SettingField(
        "server",
        "strict_fields",
        bool,
        False,
        "TANDEM_STRICT_FIELDS",
        "Refuse request fields neither OpenAI nor a known extension defines (400) instead of ignoring them with a warning.",
    ),
    SettingField(
        "server",
        "max_body_bytes",
        int,
        4 * 1024 * 1024,
        "TANDEM_MAX_BODY_BYTES",
        "Largest HTTP request body; a larger one is 413 before it is read.",
        check=at_least(1024),
    ),
    SettingField(
        "server",
        "budgets_file",
        str,
        None,
        "TANDEM_BUDGETS_FILE",
        "Spend limits per API key and per user (TOML, reloaded when it changes): see docs/configuration.md, Budgets.",
        unset="no budgets",
    ),
    SettingField(
        "server",
        "spend_path",
        str,
        None,
        "TANDEM_SPEND_PATH",
        "Where spend against the budgets is kept (SQLite; survives restarts).",
        unset="$TANDEM_DATA_DIR/spend.sqlite3, else ~/.local/share/tandem/spend.sqlite3",
    ),
    SettingField(
        "server",
        "tls_cert",
        str,
        None,
        "TANDEM_TLS_CERT",
        "PEM certificate chain: the HTTP endpoint serves HTTPS (with tls_key).",
        unset="plaintext HTTP",
    ),
    SettingField(
        "server", "tls_key", str, None, "TANDEM_TLS_KEY", "PEM private key for tls_cert.", unset="plaintext HTTP"
    ),
    SettingField(
        "local",
        "model",
        str,
        None,
        "TANDEM_MODEL",
        "GGUF file of the on-device model.",
        unset="the embedded SmolLM2-135M-Instruct",
        target="model_path",
    ),
    SettingField(
        "local",
        "model_name",
        str,
        None,
        "TANDEM_MODEL_NAME",
        "The id clients send as `model`.",
        unset="derived from the model file",
        target="model_name",
    ),
    SettingField(
        "local",
        "kv_cache_tokens",
        int,
        None,
        "TANDEM_KV_CACHE_TOKENS",
        "KV cells shared by all sequences.",
        _ENGINE_DEFAULT,
        at_least(1),
        "kv_cache_tokens",
    ),
    SettingField(
        "local",
        "max_num_seqs",
        int,
        None,
        "TANDEM_MAX_NUM_SEQS",
        "Sequences decoded together.",
        _ENGINE_DEFAULT,
        at_least(1),
        "max_num_seqs",
    ),
    SettingField(
        "local",
        "max_num_batched_tokens",
        int,
        None,
        "TANDEM_MAX_NUM_BATCHED_TOKENS",
        "Token budget of one step.",
        _ENGINE_DEFAULT,
        at_least(1),
        "max_num_batched_tokens",
    ),
    SettingField(
        "local",
        "max_model_len",
        int,
        None,
        "TANDEM_MAX_MODEL_LEN",
        "Prompt + completion limit per request.",
        "min(train context, KV pool, 4096)",
        at_least(1),
        "max_model_len",
    ),
    SettingField(
        "local",
        "max_waiting",
        int,
        None,
        "TANDEM_MAX_WAITING",
        "Queued requests beyond this get 503.",
        _ENGINE_DEFAULT,
        at_least(0),
        "max_waiting",
    ),
    SettingField(
        "local",
        "threads",
        int,
        None,
        "TANDEM_THREADS",
        "CPU threads for llama.cpp.",
        "all cores",
        at_least(1),
        "n_threads",
    ),
    SettingField(
        "local",
        "n_gpu_layers",
        int,
        None,
        "TANDEM_N_GPU_LAYERS",
        "Layers offloaded when llama.cpp has a GPU backend.",
        _ENGINE_DEFAULT,
        at_least(0),
        "n_gpu_layers",
    ),
    SettingField(
        "local",
        "batch_invariant",
        bool,
        None,
        "TANDEM_LOCAL_BATCH_INVARIANT",
        "A sequence's numbers do not depend on what shares its batch (prefill in ubatches of at most 63 tokens: slower prompts; as vLLM's and SGLang's, opt-in).",
        "off",
        None,
        "batch_invariant",
    ),
    SettingField(
        "local",
        "kv_layout",
        str,
        None,
        "TANDEM_LOCAL_KV_LAYOUT",
        "KV cells per sequence (streams: kv_cache_tokens / max_num_seqs each, as llama-server -np; decode steps of several sequences ~10% faster; every slot must fit max_model_len), one shared pool (unified: long contexts in little memory), or auto.",
        "auto: streams when every slot fits max_model_len, else unified",
        one_of("auto", "streams", "unified"),
        "kv_layout",
    ),
    SettingField(
        "local",
        "prefill_weights",
        str,
        None,
        "TANDEM_LOCAL_PREFILL_WEIGHTS",
        "Prompts prefill through a 16-bit copy of the model's quantized weights (made once, cached under ~/.cache/tandem; 2 bytes a weight of memory; decoding stays quantized): bf16, f16, off, or auto.",
        "auto: the faster copy where it measured >= 1.25x the model's own weights on this machine and fits 1/8 of memory, else off",
        one_of("auto", "bf16", "f16", "off"),
        "prefill_weights",
    ),
    SettingField(
        "local",
        "extra_buffer_types",
        bool,
        None,
        "TANDEM_LOCAL_EXTRA_BUFFER_TYPES",
        "llama.cpp's repacked CPU weight layouts for the tensor types that have one (Q4_0, Q4_K, IQ4_NL, ...; llama-server's default); needs batch_invariant off.",
        "off",
        None,
        "extra_buffer_types",
    ),
    SettingField(
        "local",
        "cache_finished_prompts",
        bool,
        None,
        "TANDEM_LOCAL_CACHE_FINISHED_PROMPTS",
        "A finished request's slot keeps its KV cells until needed, so the next prompt with the same prefix (a chat's next turn) reuses them (5-10x faster first tokens on later turns); later cells then land around cached ones, so repeated seeded requests may sample differently (see batch invariance).",
        "on unless batch_invariant",
        None,
        "cache_finished_prompts",
    ),
    SettingField(
        "local",
        "max_cached_prompts",
        int,
        None,
        "TANDEM_LOCAL_MAX_CACHED_PROMPTS",
        "Finished prompts kept cached at most (each widens the KV view every decode walks).",
        _ENGINE_DEFAULT,
        at_least(0),
        "max_cached_prompts",
    ),
    SettingField(
        "local",
        "repetition_stop",
        bool,
        None,
        "TANDEM_LOCAL_REPETITION_STOP",
        "Stop answers caught in an exact loop (finish_reason length, stop_reason repetition) unless a request sends repetition_stop false.",
        "on",
        None,
        "repetition_stop",
    ),
    SettingField(
        "local",
        "close_within_max_tokens",
        bool,
        None,
        "TANDEM_LOCAL_CLOSE_WITHIN_MAX_TOKENS",
        "A structured answer about to reach max_tokens takes its grammar's closing path and ends valid (stop_reason closed_within_max_tokens) unless a request sends close_within_max_tokens false.",
        "on",
        None,
        "close_within_max_tokens",
    ),
    SettingField(
        "cloud", "url", str, "embedded", "TANDEM_CLOUD", f"The cloud tier: {CLOUD_URL_FORMS}.", check=parse_cloud_url
    ),
    SettingField(
        "cloud",
        "api_key",
        str,
        None,
        "TANDEM_CLOUD_API_KEY",
        "Key presented to the cloud server.",
        unset="no key sent",
        secret=True,
    ),
    SettingField(
        "cloud",
        "tls_ca",
        str,
        None,
        "TANDEM_CLOUD_TLS_CA",
        "PEM file of CAs trusted for grpcs:// (and, when set, TLS to replicas named ipv4:/ipv6:/dns:).",
        unset="the system's root certificates",
    ),
    SettingField(
        "cloud",
        "model_name",
        str,
        None,
        "TANDEM_CLOUD_MODEL_NAME",
        "Model id sent to the cloud server (and served by the embedded engine).",
        unset="the server's default model",
        target="model_name",
    ),
    SettingField(
        "cloud",
        "model",
        str,
        None,
        "TANDEM_CLOUD_MODEL",
        "The cloud engine's model (tandem serve's embedded tier, tandem cloud serve): HF directory or GGUF file.",
        unset="the embedded SmolLM2-135M-Instruct",
        target="model",
    ),
    SettingField(
        "cloud",
        "device",
        str,
        "auto",
        "TANDEM_CLOUD_DEVICE",
        "Cloud engine device: auto, cpu, cuda or cuda:N.",
        target="device",
    ),
    SettingField(
        "cloud",
        "dtype",
        str,
        "auto",
        "TANDEM_CLOUD_DTYPE",
        "Cloud engine dtype: auto, float32, bfloat16, float16.",
        target="dtype",
    ),
    SettingField(
        "cloud",
        "kv_cache_gb",
        float,
        None,
        "TANDEM_CLOUD_KV_CACHE_GB",
        "Cloud engine KV cache budget in GB.",
        "a fraction of free memory",
        at_least(0, inclusive=False),
        "kv_cache_gb",
    ),
    SettingField(
        "cloud",
        "max_num_seqs",
        int,
        None,
        "TANDEM_CLOUD_MAX_NUM_SEQS",
        "Cloud engine: requests in one step.",
        _ENGINE_DEFAULT,
        at_least(1),
        "max_num_seqs",
    ),
    SettingField(
        "cloud",
        "max_num_batched_tokens",
        int,
        None,
        "TANDEM_CLOUD_MAX_NUM_BATCHED_TOKENS",
        "Cloud engine: token budget of one step.",
        _ENGINE_DEFAULT,
        at_least(1),
        "max_num_batched_tokens",
    ),
    SettingField(
        "cloud",
        "max_waiting",
        int,
        None,
        "TANDEM_CLOUD_MAX_WAITING",
        "Cloud engine: queued requests beyond this are refused (HTTP 503, gRPC RESOURCE_EXHAUSTED).",
        _ENGINE_DEFAULT,
        at_least(0),
        "max_waiting",
    ),
    SettingField(
        "cloud",
        "max_model_len",
        int,
        None,
        "TANDEM_CLOUD_MAX_MODEL_LEN",
        "Cloud engine: prompt + completion limit.",
        "min(model's own, KV pool, 8192)",
        at_least(1),
        "max_model_len",
    ),
    SettingField(
        "cloud",
        "close_within_max_tokens",
        bool,
        None,
        "TANDEM_CLOUD_CLOSE_WITHIN_MAX_TOKENS",
        "The cloud engine's (tandem serve's embedded tier, tandem cloud serve): a structured answer about to reach max_tokens takes its grammar's closing path and ends valid unless a request sends close_within_max_tokens false.",
        "on",
        None,
        "close_within_max_tokens",
    ),
    SettingField(
        "cloud",
        "speculative",
        str,
        "off",
        "TANDEM_CLOUD_SPECULATIVE",
        "Cloud engine speculative decoding: off, ngram, draft:PATH or draft:PATH@LAYERS.",
        check=speculative,
    ),
    SettingField(
        "cloud",
        "num_speculative_tokens",
        int,
        None,
        "TANDEM_CLOUD_NUM_SPECULATIVE_TOKENS",
        "Cloud engine: draft tokens per step (k).",
        "8",
        at_least(1, high=16),
    ),
    # [cloud_server]: `tandem cloud serve`, the hosted cloud tier (gRPC and the OpenAI HTTP API over the [cloud] engine).
    SettingField(
        "cloud_server",
        "host",
        str,
        "127.0.0.1",
        "TANDEM_CLOUD_HOST",
        "Address both servers bind (0.0.0.0 for all; use keys and TLS then).",
    ),
    SettingField(
        "cloud_server", "port", int, 8000, "TANDEM_CLOUD_PORT", "OpenAI HTTP API port.", check=at_least(0, high=65535)
    ),
    SettingField(
        "cloud_server", "grpc_port", int, 50051, "TANDEM_CLOUD_GRPC_PORT", "gRPC port.", check=at_least(0, high=65535)
    ),
    SettingField(
        "cloud_server",
        "threads",
        int,
        None,
        "TANDEM_CLOUD_THREADS",
        "CPU threads of torch's kernels; several replicas on one host need their share each.",
        "torch's (one per core)",
        at_least(1),
    ),
    SettingField(
        "cloud_server",
        "api_key_file",
        str,
        None,
        "TANDEM_CLOUD_API_KEY_FILE",
        "File of API keys, one per line (TANDEM_API_KEYS adds comma-separated keys).",
        unset="no key file",
    ),
    SettingField(
        "cloud_server",
        "rate_limit",
        float,
        None,
        "TANDEM_CLOUD_RATE_LIMIT",
        "Requests per minute per key (per client address without keys), HTTP and gRPC together; 0: no limit.",
        unset="no limit",
        check=at_least(0),
    ),
    SettingField(
        "cloud_server",
        "max_concurrent_per_key",
        int,
        None,
        "TANDEM_CLOUD_MAX_CONCURRENT_PER_KEY",
        "Requests in flight at once per key (per client address without keys), HTTP and gRPC together.",
        unset="no limit",
        check=at_least(1),
    ),
    SettingField(
        "cloud_server",
        "auth_backoff_after",
        int,
        10,
        "TANDEM_CLOUD_AUTH_BACKOFF_AFTER",
        "Failed keys (API keys and the admin key) from one client address before it backs off (HTTP 429 / gRPC RESOURCE_EXHAUSTED, its key unchecked, 1 s doubling); 0: off.",
        check=at_least(0),
    ),
    SettingField(
        "cloud_server",
        "auth_backoff_max_s",
        float,
        300.0,
        "TANDEM_CLOUD_AUTH_BACKOFF_MAX_S",
        "Longest backoff wait, seconds.",
        check=at_least(1),
    ),
    SettingField(
        "cloud_server",
        "strict_fields",
        bool,
        False,
        "TANDEM_CLOUD_STRICT_FIELDS",
        "Refuse HTTP request fields tandem does not know (400) instead of ignoring them with a warning.",
    ),
    SettingField(
        "cloud_server",
        "max_body_bytes",
        int,
        4 * 1024 * 1024,
        "TANDEM_CLOUD_MAX_BODY_BYTES",
        "Largest HTTP request body, bytes; larger is 413 (gRPC has its own 4 MiB message limit).",
        check=at_least(1024),
    ),
    SettingField(
        "cloud_server",
        "price_input_per_million",
        float,
        0.0,
        "TANDEM_CLOUD_PRICE_INPUT_PER_MILLION",
        "USD per million prompt tokens this server charges (budgets bill at it).",
        check=at_least(0),
    ),
    SettingField(
        "cloud_server",
        "price_output_per_million",
        float,
        0.0,
        "TANDEM_CLOUD_PRICE_OUTPUT_PER_MILLION",
        "USD per million completion tokens.",
        check=at_least(0),
    ),
    SettingField(
        "cloud_server",
        "budgets_file",
        str,
        None,
        "TANDEM_CLOUD_BUDGETS_FILE",
        "TOML of USD budgets per API key and per `user` (reloaded when it changes; see docs/configuration.md, Budgets): over a hard one, 429 insufficient_quota. Needs the prices.",
        unset="no budgets",
    ),
    SettingField(
        "cloud_server",
        "spend_path",
        str,
        None,
        "TANDEM_CLOUD_SPEND_PATH",
        "SQLite file of what each key spent.",
        unset="$TANDEM_DATA_DIR/spend.sqlite3",
    ),
    SettingField(
        "cloud_server",
        "admin_key_file",
        str,
        None,
        "TANDEM_CLOUD_ADMIN_KEY_FILE",
        "File holding the admin key of POST /admin/drain and /admin/resume (take this replica out of rotation and back).",
        unset="no admin endpoints",
    ),
    SettingField(
        "cloud_server",
        "drain_grace_s",
        float,
        30.0,
        "TANDEM_CLOUD_DRAIN_GRACE_S",
        "On SIGTERM: seconds the requests in flight get to finish while health says NOT_SERVING and new ones are refused.",
        check=at_least(0),
    ),
    SettingField(
        "cloud_server",
        "tls_cert",
        str,
        None,
        "TANDEM_CLOUD_TLS_CERT",
        "PEM certificate chain: TLS on both the gRPC and the HTTP port.",
        unset="plaintext",
    ),
    SettingField(
        "cloud_server", "tls_key", str, None, "TANDEM_CLOUD_TLS_KEY", "PEM private key for tls_cert.", unset="plaintext"
    ),
    SettingField(
        "cloud_server", "log_level", str, "info", "TANDEM_CLOUD_LOG_LEVEL", "Log level.", check=one_of(*LOG_LEVELS)
    ),
    *(
        SettingField(
            f"{tier}.sampling",
            key,
            type_,
            None,
            f"TANDEM_{tier.upper()}_SAMPLING_{key.upper()}",
            help_,
            unset="the model's default (its metadata, a built-in table, else OpenAI's)",
            check=check,
        )
        for tier in ("local", "cloud")
        for key, type_, help_, check in _SAMPLING_KEYS
    ),
    _cascade(
        "threshold",
        float,
        "TANDEM_THRESHOLD",
        "Confidence below which a request escalates (model 'auto').",
        target="default_threshold",
    ),
    _cascade("min_tokens_k", int, "TANDEM_CASCADE_MIN_TOKENS_K", "Local tokens before the first judgement."),
    _cascade("score_kind", str, "TANDEM_CASCADE_SCORE_KIND", "Confidence feature compared with the threshold."),
    _cascade(
        "decide_at",
        str,
        "TANDEM_CASCADE_DECIDE_AT",
        "When the threshold is checked.",
        check=one_of(*(d.value for d in DecideAt)),
    ),
    _cascade(
        "handoff",
        str,
        "TANDEM_CASCADE_HANDOFF",
        "restart (cloud answers anew) or continue (after the local prefix: a tandem gRPC cloud, or a vLLM cloud sharing the local vocabulary; elsewhere the local answer stands).",
        check=one_of(*(m.value for m in HandoffMode)),
    ),
    _cascade(
        "hold_tokens",
        int,
        "TANDEM_CASCADE_HOLD_TOKENS",
        "Streamed answers, restart mode: local tokens held back before committing local (0: until decided).",
        unset="16 (at least min_tokens_k)",
    ),
    _cascade(
        "redact_before_escalation",
        bool,
        "TANDEM_CASCADE_REDACT_BEFORE_ESCALATION",
        "Escalate privacy-matching requests redacted instead of keeping them local.",
    ),
    _cascade(
        "cloud_first_token_timeout_s",
        float,
        "TANDEM_CASCADE_CLOUD_FIRST_TOKEN_TIMEOUT_S",
        "Longest wait for the cloud's first token, seconds; then the answer is local (degraded: cloud_first_token_timeout).",
        check=at_least(0, inclusive=False),
    ),
    _cascade(
        "cloud_stall_timeout_s",
        float,
        "TANDEM_CASCADE_CLOUD_STALL_TIMEOUT_S",
        "Longest gap between two cloud tokens, seconds; then the local model finishes (cloud_stall_timeout).",
        check=at_least(0, inclusive=False),
    ),
    _cascade(
        "cloud_deadline_s",
        float,
        "TANDEM_CASCADE_CLOUD_DEADLINE_S",
        "Deadline of one whole cloud stream, seconds (cloud_deadline).",
        unset="none",
        check=at_least(0, inclusive=False),
    ),
    _cascade(
        "cloud_timeout_s",
        float,
        "TANDEM_CASCADE_CLOUD_TIMEOUT_S",
        "Deprecated: read as cloud_deadline_s, with a warning.",
        unset="not set",
    ),
    _cascade(
        "breaker_failure_threshold",
        int,
        "TANDEM_CASCADE_BREAKER_FAILURE_THRESHOLD",
        "Consecutive cloud failures that open the circuit breaker.",
    ),
    _cascade(
        "breaker_cool_down_s",
        float,
        "TANDEM_CASCADE_BREAKER_COOL_DOWN_S",
        "Seconds the breaker stays open before a trial call.",
    ),
    _cascade(
        "probe",
        str,
        "TANDEM_CASCADE_PROBE",
        "Confidence probe (ONNX) trained for the local model; replaces score_kind.",
        unset="no probe",
    ),
    _cascade(
        "prompt_router",
        str,
        "TANDEM_CASCADE_PROMPT_ROUTER",
        "Prompt router before generation: 'default' (shipped) or a `tandem router train` file. Its score is the share of its reference prompts (the shipped router's: the design tables) it ranks lower.",
        unset="off",
    ),
    _cascade(
        "prompt_router_threshold",
        float,
        "TANDEM_CASCADE_PROMPT_ROUTER_THRESHOLD",
        "Escalate before generation iff 1 - prompt score < this: the top this share of the router's reference prompts goes to the cloud.",
        unset="the request's threshold",
    ),
    _cascade(
        "tool_calls",
        str,
        "TANDEM_CASCADE_TOOL_CALLS",
        "Where turns offering tools go: auto (tool_choice auto to the cloud, required local), local, or cloud.",
        check=one_of("auto", "local", "cloud"),
    ),
    _cascade(
        "privacy", dict, None, "Privacy rules: detectors, patterns (router.privacy).", check=PrivacyRules.from_config
    ),
    _cascade("prices", dict, None, "USD per million tokens per tier (router.costs).", check=CostTable.from_config),
    _traffic(
        "record",
        bool,
        "Keep a record of routed requests (SQLite): router features, tier, signals, cost, latency, labels; never text unless record_text.",
    ),
    _traffic(
        "path",
        str,
        "The record's SQLite file.",
        unset="$TANDEM_DATA_DIR/traffic.sqlite3, else ~/.local/share/tandem/traffic.sqlite3",
    ),
    _traffic("record_text", bool, "Also keep prompt and answer text (privacy-flagged requests are never stored)."),
    _traffic("retention_days", float, "Rows older than this are deleted (hourly).", check=at_least(0, inclusive=False)),
    _traffic("max_mb", float, "Largest record; past it the oldest rows are deleted.", check=at_least(1)),
    _traffic(
        "embed",
        bool,
        "Store a MiniLM embedding of each recorded prompt (what a router learns topics from; ~10-20 ms of CPU per request, off the request path).",
    ),
    _traffic(
        "feedback_per_minute",
        float,
        "POST /v1/feedback calls a minute per key (per client address without keys).",
        check=at_least(0, inclusive=False),
    ),
    _traffic(
        "shadow_fraction",
        float,
        "Share of locally answered requests also sent to the cloud in the background, both answers judged (never privacy-flagged ones).",
        check=at_least(0, high=1),
    ),
    _traffic(
        "shadow_daily_cloud_tokens",
        int,
        "Cloud tokens shadow calls may use per UTC day (reserved before each call).",
        check=at_least(0),
    ),
    _traffic(
        "judge",
        str,
        "How shadow answers are judged: exact_match (final answers compared, the cloud's as reference) or the base URL of an OpenAI-compatible judge.",
    ),
    _traffic("judge_model", str, "The judge endpoint's model id.", unset="none (needed with a judge URL)"),
    _traffic("judge_api_key", str, "Key presented to the judge endpoint.", unset="no key sent", secret=True),
    _traffic(
        "retrain",
        bool,
        "Retrain the prompt router from the record in the background; swap it in when it beats the serving one on the newest labels.",
    ),
    _traffic("retrain_every_labels", int, "New labels between two background retrains.", check=at_least(1)),
    _traffic(
        "retrain_holdout_labels",
        int,
        "The newest labels kept out of a retrain to compare the two routers.",
        check=at_least(10),
    ),
    _traffic(
        "router_dir",
        str,
        "Where retrained routers are written (latest.onnx is the newest swapped in).",
        unset="routers/ next to the record",
    ),
)
FIELDS: dict[str, SettingField] = {field.dotted: field for field in FIELDS_LIST}
SECTIONS: dict[str, tuple[SettingField, ...]] = {
    section: tuple(f for f in FIELDS_LIST if f.section == section)
    for section in dict.fromkeys(f.section for f in FIELDS_LIST)
}
