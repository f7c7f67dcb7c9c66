"""Every tandem setting, declared once: section, key, type, default, env var and help text.

`sdk.settings` layers built-in defaults < a TOML file < TANDEM_* env vars < command-line values
over this table. Each section's keys are declared on the dataclass they configure
(sdk.protocol.config_fields.setting) and read from it here: [server] and [cloud_server] on
ListenerConfig / HostedCloudConfig (sdk.settings.server_sections), [local] on LocalEngineConfig,
[cloud] on CloudTierConfig (where the tier is) and CloudEngineConfig (the embedded engine),
[cascade] on CascadeConfig, [traffic] on TrafficSettings. Only what has no dataclass field of its
own is a row here: [cloud]'s speculative decoding (parsed into the engine's SpeculativeConfig) and
[local.sampling] / [cloud.sampling] (one key per tunable SamplingParams declares). `tandem config
show`, the CLI options and the validation pick every key up from the table.
"""

from __future__ import annotations

import math

from cloud_engine.config import CloudEngineConfig
from local_runtime.config import LocalEngineConfig
from sdk.cascade.config import CascadeConfig
from sdk.protocol.sampling_params import TUNABLES
from sdk.settings.checks import at_least, speculative
from sdk.settings.cloud_url import CLOUD_URL_FORMS, CloudTarget, parse_cloud_url
from sdk.settings.serve_config import CloudTierConfig
from sdk.settings.server_sections import CLOUD_SERVER_FIELDS, SERVER_FIELDS
from sdk.settings.setting_field import SettingField, SettingsError, fields_of
from sdk.traffic.config import TrafficSettings

__all__ = ["CLOUD_URL_FORMS", "FIELDS", "SECTIONS", "CloudTarget", "SettingField", "SettingsError", "parse_cloud_url"]

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
    *SERVER_FIELDS,
    *fields_of(LocalEngineConfig, "local", env_prefix="TANDEM_LOCAL_"),
    *fields_of(CloudTierConfig, "cloud", env_prefix="TANDEM_CLOUD_"),
    *fields_of(CloudEngineConfig, "cloud", env_prefix="TANDEM_CLOUD_"),
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
    *CLOUD_SERVER_FIELDS,  # `tandem cloud serve`, the hosted cloud tier (gRPC and HTTP over the [cloud] engine)
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
    *fields_of(CascadeConfig, "cascade", env_prefix="TANDEM_CASCADE_"),
    *fields_of(TrafficSettings, "traffic", env_prefix="TANDEM_TRAFFIC_"),
)
FIELDS: dict[str, SettingField] = {field.dotted: field for field in FIELDS_LIST}
SECTIONS: dict[str, tuple[SettingField, ...]] = {
    section: tuple(f for f in FIELDS_LIST if f.section == section)
    for section in dict.fromkeys(f.section for f in FIELDS_LIST)
}
