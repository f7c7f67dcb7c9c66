"""tandem's configuration: built-in defaults < a TOML file < TANDEM_* env vars < command-line options.

`load_settings()` layers them over the table in `sdk.settings.fields`, records where every
value came from, and validates the result as a whole (the cascade, both engines, the cloud
URL) so a bad setting is reported before anything loads or binds. The file is
`--config PATH`, else `$TANDEM_CONFIG`, else `$XDG_CONFIG_HOME/tandem/config.toml` when it exists.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar


from sdk.settings.fields import (
    FIELDS,
    SECTIONS,
    CloudTarget,
    SettingField,
    SettingsError,
    parse_cloud_url,
)
from sdk.settings.reading import (  # noqa: F401  (default_config_path: re-exported)
    config_file,
    default_config_path,
    pairs_of,
    read_file,
)

if TYPE_CHECKING:
    from cloud_engine.config import CloudEngineConfig
    from local_runtime.config import LocalEngineConfig
    from sdk.cascade.config import CascadeConfig
    from sdk.openai_server.app_config import AppConfig
    from sdk.protocol.sampling_params import SamplingDefaults
    from sdk.traffic.config import TrafficSettings

__all__ = ["Settings", "load_settings", "settings_from_mapping"]
C = TypeVar("C")


@dataclass(frozen=True)
class Settings:
    """The effective configuration, and where each value came from."""

    values: dict[str, dict[str, Any]]  # section -> key -> effective value
    sources: dict[str, str]  # "section.key" -> "default" | "file:/abs/path" | "env:TANDEM_X" | "cli" | "mapping:ORIGIN"
    config_path: str | None = None  # the file read, if any

    def get(self, dotted: str) -> Any:
        """One value, e.g. `settings.get("cascade.threshold")`."""
        if dotted not in FIELDS:
            raise KeyError(f"unknown setting {dotted!r}; known: {', '.join(FIELDS)}")
        section, key = dotted.rsplit(".", 1)
        return self.values[section][key]

    def _targets(self, section: str, config: type) -> dict[str, Any]:
        """[section]'s values for the fields of `config` they feed (a section may feed two: [cloud]'s
        url, key and CA are the cloud tier's, the rest the engine's). Unset (None) values are left out
        so the dataclass keeps its own default."""
        names = {f.name for f in fields(config)}
        return {
            f.target: copy.deepcopy(self.values[section][f.key])
            for f in SECTIONS[section]
            if f.target in names and self.values[section][f.key] is not None
        }

    def local_engine_config(self) -> LocalEngineConfig:
        from local_runtime.config import LocalEngineConfig

        return LocalEngineConfig(**self._targets("local", LocalEngineConfig), sampling=self.sampling("local"))

    def cloud_engine_config(self) -> CloudEngineConfig:
        """The embedded cloud engine's settings (used when cloud.url is "embedded")."""
        from cloud_engine.config import CloudEngineConfig
        from cloud_engine.spec_decode.config import parse_speculative

        speculative = parse_speculative(self.get("cloud.speculative"), self.get("cloud.num_speculative_tokens"))
        return CloudEngineConfig(
            **self._targets("cloud", CloudEngineConfig), speculative=speculative, sampling=self.sampling("cloud")
        )

    def sampling(self, tier: str) -> dict[str, Any]:
        """The tier's configured sampling defaults ([local.sampling] / [cloud.sampling]), unset keys left out."""
        return {key: value for key, value in self.values[f"{tier}.sampling"].items() if value is not None}

    def effective_sampling(self, tier: str) -> SamplingDefaults | None:
        """What the tier fills in for sampling fields a request leaves out, with each value's source
        (the model file's header is read; nothing is loaded). None for a remote cloud: it decides."""
        from sdk.engine_common.model_files import resolve_model_path
        from sdk.engine_common.sampling_defaults import resolve_sampling_defaults

        if tier == "local":
            model = resolve_model_path(self.get("local.model"))
        elif self.cloud_target().kind == "embedded":
            model = self.get("cloud.model") or resolve_model_path(None)
        else:
            return None
        labels = {key: f"config: {_describe(self.sources[f'{tier}.sampling.{key}'])}" for key in self.sampling(tier)}
        return resolve_sampling_defaults(self.sampling(tier), model, labels)

    def cascade_config(self) -> CascadeConfig:
        from sdk.cascade.config import CascadeConfig

        return CascadeConfig(**self._targets("cascade", CascadeConfig), cloud_model=self.get("cloud.model_name"))

    def traffic_settings(self) -> TrafficSettings:
        from sdk.traffic.config import TrafficSettings

        return TrafficSettings(**self._targets("traffic", TrafficSettings))

    def section_config(self, config: type[C], section: str) -> C:
        """A config dataclass that declares its settings (sdk.protocol.config_fields.setting) from
        [section]'s values: ListenerConfig from [server] or [cloud_server], HostedCloudConfig."""
        return config(**{f.name: copy.deepcopy(self.values[section][f.name]) for f in fields(config)})

    def app_config(self, tier: str, api_keys: frozenset[str] = frozenset()) -> AppConfig:
        """The HTTP app's config: `tandem serve`'s from [server] ("local"), `tandem cloud serve`'s
        from [cloud_server] ("cloud"); `api_keys` read from the section's key file by the caller."""
        from sdk.settings.server_sections import ListenerConfig, app_config

        listener = self.section_config(ListenerConfig, {"local": "server", "cloud": "cloud_server"}[tier])
        feedback = self.get("traffic.feedback_per_minute") if tier == "local" else None
        return app_config(listener, api_keys, self.get(f"{tier}.model_name"), feedback)

    def cloud_target(self) -> CloudTarget:
        return parse_cloud_url(self.get("cloud.url"))

    def as_dict(self) -> dict:
        """JSON-able: the file, every value (secrets as "***") and every value's source."""
        values = {
            section: {f.key: _shown(f, self.values[section][f.key]) for f in section_fields}
            for section, section_fields in SECTIONS.items()
        }
        return {"config_path": self.config_path, "values": values, "sources": dict(self.sources)}

    def as_toml(self) -> str:
        """The effective configuration as a TOML document, each key with its help and source."""
        lines = [
            f"# tandem's effective configuration; file read: {self.config_path or 'none'}",
            "# precedence: defaults < file < TANDEM_* env vars < command line",
        ]
        for section, section_fields in SECTIONS.items():
            lines += ["", f"[{section}]"]
            for f in section_fields:
                value, source = self.values[section][f.key], self.sources[f.dotted]
                lines.append(f"# {f.help}" + (f" Env: {f.env}." if f.env else ""))
                if value is None:  # TOML has no null: an unset key is a comment
                    lines.append(f"# {f.key}: unset -> {_unset_meaning(f)}  # {source}")
                else:
                    lines.append(f"{f.key} = {_toml_value(_shown(f, value))}  # {source}")
        return "\n".join(lines) + "\n"


def load_settings(
    config_path: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
) -> Settings:
    """The effective settings; SettingsError names the bad key, its source and what is allowed.

    `cli` maps "section.key" to a command-line value; None entries are ignored, so typer
    options that default to None can be passed straight in. `env` defaults to os.environ.
    """
    env = os.environ if env is None else env
    values, sources = _defaults()

    def put(field: SettingField, source: str, shown: Any, convert) -> None:
        try:
            values[field.section][field.key] = convert()
        except (ValueError, TypeError) as exc:
            raise SettingsError(f"{field.dotted} = {shown!r} from {_describe(source)}: {exc}") from exc
        sources[field.dotted] = source

    path = config_file(config_path, env)
    for field, value in read_file(path) if path else ():
        put(field, f"file:{path}", value, lambda f=field, v=value: f.coerce(v))
    for field in FIELDS.values():
        if field.env and field.env in env:
            raw = env[field.env]
            put(field, f"env:{field.env}", raw, lambda f=field, r=raw: f.parse_env(r))
    for dotted, value in (cli or {}).items():
        if value is None:
            continue
        if dotted not in FIELDS:
            raise SettingsError(f"unknown setting {dotted!r} from the command line; known: {', '.join(FIELDS)}")
        put(FIELDS[dotted], "cli", value, lambda f=FIELDS[dotted], v=value: f.coerce(v))
    settings = Settings(values, sources, path)
    _validate(settings)
    return settings


def settings_from_mapping(data: Mapping, origin: str = "config", defaults: Mapping[str, Any] | None = None) -> Settings:
    """Settings from a {section: {key: value}} mapping alone (no file, no env), for embedders
    such as android_bridge whose configuration arrives as JSON. `defaults` maps "section.key"
    to a value that replaces the built-in default (recorded as a default)."""
    values, sources = _defaults()
    for dotted, value in (defaults or {}).items():
        section, key = FIELDS[dotted].section, FIELDS[dotted].key
        values[section][key] = value
    for field, value in pairs_of(data, origin):
        try:
            values[field.section][field.key] = field.coerce(value)
        except (ValueError, TypeError) as exc:
            raise SettingsError(f"{field.dotted} = {value!r} from {origin}: {exc}") from exc
        sources[field.dotted] = f"mapping:{origin}"
    settings = Settings(values, sources)
    _validate(settings)
    return settings


def _defaults() -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    values = {section: {f.key: copy.deepcopy(f.default) for f in fs} for section, fs in SECTIONS.items()}
    return values, {dotted: "default" for dotted in FIELDS}


def _validate(settings: Settings) -> None:
    """Checks across keys, after every layer is in: each error says which keys were set where."""
    target = settings.cloud_target()
    if settings.get("traffic.shadow_fraction") > 0 and target.kind == "none":
        raise SettingsError(
            f"traffic.shadow_fraction = {settings.get('traffic.shadow_fraction')} "
            f"({_describe(settings.sources['traffic.shadow_fraction'])}) needs a cloud tier; cloud.url is 'none'"
        )
    if settings.get("traffic.retrain") and not settings.get("cascade.prompt_router"):
        raise SettingsError(
            f"traffic.retrain ({_describe(settings.sources['traffic.retrain'])}) retrains the prompt router: "
            "set cascade.prompt_router (e.g. 'default') so there is one to replace"
        )
    for section, build in (
        ("cascade", settings.cascade_config),
        ("local", settings.local_engine_config),
        ("cloud", settings.cloud_engine_config),
        ("traffic", settings.traffic_settings),
    ):
        try:
            build()
        except (ValueError, TypeError) as exc:
            changed = [
                f"{f.dotted} = {settings.values[section][f.key]!r} ({_describe(settings.sources[f.dotted])})"
                for f in SECTIONS[section]
                if settings.sources[f.dotted] != "default"
            ]
            raise SettingsError(
                f"invalid [{section}] settings: {exc}; set: {'; '.join(changed) or 'nothing (all defaults)'}"
            ) from exc


def _describe(source: str) -> str:
    kind, _, where = source.partition(":")
    named = {"file": f"file {where}", "env": f"env var {where}", "cli": "the command line", "mapping": where}
    return named.get(kind, "the defaults")


def _shown(field: SettingField, value: Any) -> Any:
    return "***" if field.secret and value is not None else copy.deepcopy(value)


def _unset_meaning(field: SettingField) -> str:
    """What None means for a key; for engine sizes, the engine dataclass's own default."""
    if field.section in ("local", "cloud") and field.target:
        if field.section == "local":
            from local_runtime.config import LocalEngineConfig as engine_config
        else:
            from cloud_engine.config import CloudEngineConfig as engine_config
        default = {f.name: f.default for f in fields(engine_config)}.get(field.target)
        if default is not None:
            return f"{field.unset} ({default})"
    return field.unset


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_str(text: str) -> str:
    # JSON's escapes are valid TOML basic-string escapes; TOML also forbids a raw DEL.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # Python's inf/nan/1e+20 spellings are TOML's too
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):  # inline table: one line, so a key's source comment stays beside it
        items = [f"{k if _BARE_KEY.fullmatch(k) else _toml_str(k)} = {_toml_value(v)}" for k, v in value.items()]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
