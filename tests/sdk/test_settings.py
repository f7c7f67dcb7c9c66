"""sdk.settings: defaults < TOML file < TANDEM_* env vars < command line, validation, and `tandem config show`.

Every test passes its own env mapping (HOME and XDG_CONFIG_HOME under tmp_path), so the
real home directory and environment are never read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tomllib
from typer.testing import CliRunner

from cloud_engine.config import CloudEngineConfig
from local_runtime.config import LocalEngineConfig
from sdk.cascade.config import CascadeConfig
from sdk.cli.config import config_app
from sdk.settings import CloudTarget, SettingsError, load_settings, parse_cloud_url
from tests.conftest import REPO_ROOT


@pytest.fixture
def env(tmp_path):
    return {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def write(path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_defaults_without_any_file(env):
    settings = load_settings(env=env)
    assert settings.config_path is None
    assert settings.get("server.port") == 8000 and settings.get("cloud.url") == "embedded"
    assert settings.get("cascade.threshold") == CascadeConfig().default_threshold
    assert settings.get("local.kv_cache_tokens") is None
    assert set(settings.sources.values()) == {"default"}


def test_precedence_default_file_env_cli(tmp_path, env):
    path = write(
        tmp_path / "c.toml",
        '[server]\nport = 9000\nhost = "0.0.0.0"\nlog_level = "debug"\n[cascade]\nthreshold = 0.7\n',
    )
    env |= {"TANDEM_PORT": "9100", "TANDEM_THRESHOLD": "0.8"}
    settings = load_settings(path, env=env, cli={"server.port": 9200, "server.host": None, "local.threads": 4})
    assert settings.get("server.port") == 9200 and settings.sources["server.port"] == "cli"
    assert settings.get("cascade.threshold") == 0.8 and settings.sources["cascade.threshold"] == "env:TANDEM_THRESHOLD"
    assert settings.get("server.host") == "0.0.0.0" and settings.sources["server.host"] == f"file:{path}"
    assert settings.get("local.threads") == 4 and settings.sources["local.threads"] == "cli"
    assert settings.sources["server.rate_limit"] == "default"
    assert settings.config_path == path


def test_env_values_are_parsed_to_the_key_type(env):
    env |= {
        "TANDEM_CASCADE_REDACT_BEFORE_ESCALATION": "yes",
        "TANDEM_CLOUD_KV_CACHE_GB": "1.5",
        "TANDEM_CASCADE_HOLD_TOKENS": "16",
        "TANDEM_MODEL": "",
    }
    settings = load_settings(env=env)
    assert settings.get("cascade.redact_before_escalation") is True
    assert settings.get("cloud.kv_cache_gb") == 1.5 and settings.get("cascade.hold_tokens") == 16
    assert settings.get("local.model") is None and settings.sources["local.model"] == "env:TANDEM_MODEL"


def test_empty_env_unsets_a_file_value(tmp_path, env):
    path = write(tmp_path / "c.toml", '[local]\nmodel = "/m.gguf"\n')
    assert load_settings(path, env=env | {"TANDEM_MODEL": ""}).get("local.model") is None


@pytest.mark.parametrize(
    "var, value, expected",
    [
        ("TANDEM_PORT", "eighty", "an integer"),
        ("TANDEM_PORT", "70000", "<= 65535"),
        ("TANDEM_PORT", "", "is empty"),
        ("TANDEM_RATE_LIMIT", "0", "> 0"),
        ("TANDEM_CASCADE_REDACT_BEFORE_ESCALATION", "maybe", "true/false"),
        ("TANDEM_LOG_LEVEL", "loud", "trace"),
        ("TANDEM_CLOUD", "grpc://host", "HOST:PORT"),
    ],
)
def test_bad_env_value_names_the_variable(env, var, value, expected):
    with pytest.raises(SettingsError, match=f"env var {var}") as info:
        load_settings(env=env | {var: value})
    assert expected in str(info.value)


@pytest.mark.parametrize(
    "text, expected",
    [
        ('[server]\nport = "8000"\n', "server.port = '8000' from file .*must be an integer"),
        ("[cascade]\nmin_tokens_k = true\n", "must be an integer"),
        ("[cascade]\nredact_before_escalation = 1\n", "must be true or false"),
        ("[server]\nhost = 1\n", "must be a string"),
        ("[cascade]\nprivacy = 3\n", "must be a table"),
        ("[cascade.privacy]\ndetectors = ['nope']\n", "unknown PII detectors"),
        ("[cascade.prices]\nmoon = {}\n", "unknown tiers"),
        ("server = 1\n", "must be a table"),
        ("[server\n", "cannot read it as TOML"),
    ],
)
def test_bad_types_in_the_file(tmp_path, env, text, expected):
    with pytest.raises(SettingsError, match=expected):
        load_settings(write(tmp_path / "c.toml", text), env=env)


def test_int_is_accepted_for_a_float(tmp_path, env):
    settings = load_settings(write(tmp_path / "c.toml", "[cascade]\nthreshold = 1\n"), env=env)
    assert settings.get("cascade.threshold") == 1.0 and isinstance(settings.get("cascade.threshold"), float)


def test_unknown_section_and_key(tmp_path, env):
    with pytest.raises(
        SettingsError,
        match=r"unknown sections \['servre'\].*known sections: server, local, cloud, cloud_server, cascade",
    ):
        load_settings(write(tmp_path / "a.toml", "[servre]\nport = 1\n"), env=env)
    with pytest.raises(SettingsError, match=r"unknown keys \['prot'\] in \[server\]; known keys: host, port"):
        load_settings(write(tmp_path / "b.toml", "[server]\nprot = 1\n"), env=env)
    with pytest.raises(SettingsError, match="unknown setting 'server.prot' from the command line"):
        load_settings(env=env, cli={"server.prot": 1})


def test_cross_key_errors_name_what_was_set(env):
    with pytest.raises(
        SettingsError, match=r"invalid \[cascade\].*cascade.hold_tokens = 3 \(env var TANDEM_CASCADE_HOLD_TOKENS\)"
    ):
        load_settings(env=env | {"TANDEM_CASCADE_HOLD_TOKENS": "3"})
    with pytest.raises(SettingsError, match=r"invalid \[local\].*local.max_num_seqs = 1000 \(the command line\)"):
        load_settings(env=env, cli={"local.max_num_seqs": 1000})
    with pytest.raises(SettingsError, match=r"invalid \[cloud\].*dtype"):
        load_settings(env=env | {"TANDEM_CLOUD_DTYPE": "int3"})


def test_continue_handoff_is_taken_with_either_cloud(env):
    # Over HTTP only a vLLM server sharing the local vocabulary continues; the cascade finds out when it
    # first hands off, and otherwise keeps the local answer (tests/sdk/test_vllm_cloud.py).
    env |= {"TANDEM_CASCADE_HANDOFF": "continue"}
    assert load_settings(env=env | {"TANDEM_CLOUD": "https://api.example.com/v1"}).get("cascade.handoff") == "continue"
    assert load_settings(env=env | {"TANDEM_CLOUD": "grpc://cloud:50051"}).get("cascade.handoff") == "continue"


def test_missing_explicit_files(tmp_path, env):
    with pytest.raises(SettingsError, match=r"nope.toml \(from --config\) does not exist"):
        load_settings(tmp_path / "nope.toml", env=env)
    with pytest.raises(SettingsError, match=r"from TANDEM_CONFIG\) does not exist"):
        load_settings(env=env | {"TANDEM_CONFIG": str(tmp_path / "nope.toml")})


def test_tandem_config_env_and_explicit_path_win_over_xdg(tmp_path, env):
    write(tmp_path / "xdg" / "tandem" / "config.toml", "[server]\nport = 1\n")
    other = write(tmp_path / "other.toml", "[server]\nport = 2\n")
    third = write(tmp_path / "third.toml", "[server]\nport = 3\n")
    assert load_settings(env=env).get("server.port") == 1
    assert load_settings(env=env | {"TANDEM_CONFIG": other}).get("server.port") == 2
    assert load_settings(third, env=env | {"TANDEM_CONFIG": other}).get("server.port") == 3


def test_default_file_under_home_when_no_xdg(tmp_path):
    env = {"HOME": str(tmp_path)}
    assert load_settings(env=env).config_path is None
    path = write(tmp_path / ".config" / "tandem" / "config.toml", "[server]\nport = 5\n")
    settings = load_settings(env=env)
    assert settings.config_path == path and settings.sources["server.port"] == f"file:{path}"


def test_conversions_to_the_engine_and_cascade_dataclasses(tmp_path, env):
    path = write(
        tmp_path / "c.toml",
        """
[local]
model = "/models/a.gguf"
threads = 3
max_num_seqs = 4
[cloud]
model_name = "big"
device = "cpu"
kv_cache_gb = 2
[cascade]
threshold = 0.3
handoff = "restart"
hold_tokens = 12
[cascade.privacy]
detectors = ["email"]
[cascade.prices.cloud]
input_per_million = 0.5
""",
    )
    settings = load_settings(path, env=env)
    local = settings.local_engine_config()
    assert isinstance(local, LocalEngineConfig)
    assert (local.model_path, local.n_threads, local.max_num_seqs) == ("/models/a.gguf", 3, 4)
    assert local.kv_cache_tokens == LocalEngineConfig().kv_cache_tokens  # unset: the engine's default
    cloud = settings.cloud_engine_config()
    assert isinstance(cloud, CloudEngineConfig)
    assert (cloud.model_name, cloud.device, cloud.kv_cache_gb, cloud.max_num_seqs) == (
        "big",
        "cpu",
        2.0,
        CloudEngineConfig().max_num_seqs,
    )
    cascade = settings.cascade_config()
    assert isinstance(cascade, CascadeConfig)
    assert (cascade.default_threshold, cascade.hold_tokens, cascade.cloud_model) == (0.3, 12, "big")
    assert cascade.privacy == {"detectors": ["email"]} and cascade.prices == {"cloud": {"input_per_million": 0.5}}
    cascade.privacy["detectors"].append("card")  # a copy: the settings stay as loaded
    assert settings.get("cascade.privacy") == {"detectors": ["email"]}


@pytest.mark.parametrize(
    "url, expected",
    [
        ("embedded", CloudTarget("embedded")),
        ("none", CloudTarget("none")),
        ("grpc://cloud.internal:50051", CloudTarget("grpc", "cloud.internal:50051")),
        ("grpcs://[::1]:443", CloudTarget("grpc", "[::1]:443", tls=True)),
        ("http://localhost:8000/v1", CloudTarget("http", "http://localhost:8000/v1")),
        ("https://api.example.com/v1/", CloudTarget("http", "https://api.example.com/v1", tls=True)),
        # Replicas, in gRPC's own syntax (round robin with health checks: sdk.cloud.grpc_client)
        ("ipv4:127.0.0.1:50051,127.0.0.1:50052", CloudTarget("grpc", "ipv4:127.0.0.1:50051,127.0.0.1:50052")),
        ("ipv6:[::1]:50051,[::1]:50052", CloudTarget("grpc", "ipv6:[::1]:50051,[::1]:50052")),
        ("dns:///cloud.internal:50051", CloudTarget("grpc", "dns:///cloud.internal:50051")),
    ],
)
def test_parse_cloud_url(url, expected):
    assert parse_cloud_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "",
        "Embedded",
        "ftp://x",
        "grpc://host",
        "grpc://:50051",
        "grpc://h:0",
        "grpc://h:port",
        "grpc://h:1/path",
        "grpcs://h:99999",
        "https://",
        "cloud:50051",
        "ipv4:127.0.0.1",
        "ipv4:127.0.0.1:1,",
        "ipv6:::1:50051",
        "dns:///cloud",
        "dns:///h:0",
    ],
)
def test_parse_cloud_url_refuses(url):
    with pytest.raises(SettingsError, match="cloud URL"):
        parse_cloud_url(url)


def test_api_key_is_masked(env):
    settings = load_settings(env=env | {"TANDEM_CLOUD_API_KEY": "sk-secret"})
    assert settings.get("cloud.api_key") == "sk-secret"
    assert "sk-secret" not in settings.as_toml() and "sk-secret" not in json.dumps(settings.as_dict())
    assert settings.as_dict()["values"]["cloud"]["api_key"] == "***"
    assert load_settings(env=env).as_dict()["values"]["cloud"]["api_key"] is None


def test_as_toml_parses_back_to_the_same_values(tmp_path, env):
    path = write(
        tmp_path / "c.toml",
        """
[server]
host = "quote\\" back\\\\slash \\u00e9 tab\\t"
rate_limit = 12.5
[local]
max_waiting = 0
[local.sampling]
top_p = 0.5
[cascade]
redact_before_escalation = true
[cascade.privacy]
detectors = ["email", "card"]
patterns = { employee_id = "E-\\\\d{6}" }
""",
    )
    settings = load_settings(path, env=env | {"TANDEM_CLOUD_API_KEY": "sk-secret"})
    parsed = tomllib.loads(settings.as_toml())
    expected = {section: {k: v for k, v in keys.items() if v is not None} for section, keys in settings.values.items()}
    expected["cloud"]["api_key"] = "***"
    for dotted in [s for s in expected if "." in s]:  # [local.sampling] is a table inside [local]
        parent, _, child = dotted.partition(".")
        expected[parent][child] = expected.pop(dotted)
    assert parsed == expected
    assert parsed["local"]["sampling"] == {"top_p": 0.5} and settings.sampling("local") == {"top_p": 0.5}
    assert "# model: unset -> the embedded" in settings.as_toml()
    assert f"rate_limit = 12.5  # file:{path}" in settings.as_toml()


def test_as_dict_is_json(tmp_path, env):
    settings = load_settings(env=env | {"TANDEM_PORT": "1234"})
    data = json.loads(json.dumps(settings.as_dict()))
    assert data["config_path"] is None and data["values"]["server"]["port"] == 1234
    assert data["sources"]["server.port"] == "env:TANDEM_PORT"


def test_config_show_cli(tmp_path, monkeypatch):
    for name in [n for n in os.environ if n.startswith("TANDEM_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    path = write(tmp_path / "c.toml", "[server]\nport = 9000\n")
    runner = CliRunner()
    shown = runner.invoke(config_app, ["show", "--config", path])
    assert shown.exit_code == 0, shown.output
    assert f"port = 9000  # file:{path}" in shown.output
    as_json = runner.invoke(config_app, ["show", "--config", path, "--json"])
    assert json.loads(as_json.output)["values"]["server"]["port"] == 9000
    missing = runner.invoke(config_app, ["show", "--config", str(tmp_path / "nope.toml")])
    assert missing.exit_code == 2 and "does not exist" in missing.output


def test_config_show_does_not_import_torch(tmp_path):
    code = (
        "import sys; from sdk.cli.config import config_app\n"
        "try: config_app(['show', '--json'])\n"
        "except SystemExit as exit: assert not exit.code, exit.code\n"
        "assert 'torch' not in sys.modules and 'llama_cpp' not in sys.modules, 'heavy import'"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")} | {
        "XDG_CONFIG_HOME": str(tmp_path),
        "TANDEM_PORT": "4321",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["sources"]["server.port"] == "env:TANDEM_PORT"
