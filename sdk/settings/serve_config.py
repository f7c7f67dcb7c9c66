"""One config object per server, made once from the effective settings and passed whole.

- `ServeConfig`: `tandem serve` and the Android bridge (the cascade: the local engine, the cloud
  tier, the cascade's routing, the traffic record, and the [server] listener);
- `CloudServeConfig`: `tandem cloud serve` (the cloud engine behind the [cloud_server] listeners).

Building one checks what the settings point at (the model file, the key files, the TLS files, the
budgets file), so every configuration error is reported before anything loads or binds; the serve
commands read no setting themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sdk.protocol.config_fields import setting
from sdk.settings.cloud_url import CLOUD_URL_FORMS, CloudTarget, parse_cloud_url
from sdk.settings.server_sections import HostedCloudConfig, ListenerConfig, app_config

if TYPE_CHECKING:
    from cloud_engine.config import CloudEngineConfig
    from local_runtime.config import LocalEngineConfig
    from router.costs import TierPrices
    from sdk.cascade.config import CascadeConfig
    from sdk.openai_server.app_config import AppConfig
    from sdk.settings.loading import Settings
    from sdk.traffic.config import TrafficSettings


@dataclass(frozen=True, kw_only=True)
class CloudTierConfig:
    """[cloud] as the cascade reaches its cloud tier (sdk.cloud.tier.start_cloud_tier)."""

    url: str = setting("embedded", f"The cloud tier: {CLOUD_URL_FORMS}.", env="TANDEM_CLOUD", check=parse_cloud_url)
    api_key: str | None = setting(None, "Key presented to the cloud server.", unset="no key sent", secret=True)
    tls_ca: str | None = setting(
        None,
        "PEM file of CAs trusted for grpcs:// (and, when set, TLS to replicas named ipv4:/ipv6:/dns:).",
        unset="the system's root certificates",
    )
    engine: CloudEngineConfig | None = None  # the embedded engine's, used when the url is "embedded"

    @property
    def target(self) -> CloudTarget:
        return parse_cloud_url(self.url)

    @property
    def embedded(self) -> bool:
        return self.target.kind == "embedded"


@dataclass(frozen=True)
class ServeConfig:
    """Everything `tandem serve` runs with (the Android bridge too, without the listener)."""

    listener: ListenerConfig  # [server]
    api_keys: frozenset[str]  # its key file's, and $TANDEM_API_KEYS
    app: AppConfig  # the OpenAI HTTP app's
    local: LocalEngineConfig
    cloud: CloudTierConfig
    cascade: CascadeConfig
    traffic: TrafficSettings
    cloud_prices_are_zero: bool  # [cascade] prices: budgets in USD mean nothing when the cloud costs nothing

    @classmethod
    def from_settings(cls, settings: Settings) -> ServeConfig:
        """Raises SettingsError, ModelNotFoundError, ApiKeyConfigError, BudgetConfigError or ValueError."""
        from router.costs import CostTable
        from sdk.openai_server.serve_loop import check_tls_files
        from sdk.serving.api_keys import load_api_keys
        from sdk.engine_common.model_files import resolve_model_path

        listener = settings.section_config(ListenerConfig, "server")
        resolve_model_path(settings.get("local.model"))  # load_settings checked the values, not the file
        api_keys = load_api_keys(listener.api_key_file)
        check_tls_files(listener.tls_cert, listener.tls_key)
        prices = CostTable.from_config(settings.get("cascade.prices")).prices("cloud")
        prices_are_zero = prices.input_per_million == 0 and prices.output_per_million == 0
        if listener.budgets_file:
            from sdk.budgets.manager import check_budgets

            check_budgets(listener.budgets_file, prices_are_zero)
        cloud = CloudTierConfig(
            url=settings.get("cloud.url"),
            api_key=settings.get("cloud.api_key"),
            tls_ca=settings.get("cloud.tls_ca"),
            engine=settings.cloud_engine_config(),
        )
        app = app_config(
            listener, api_keys, settings.get("local.model_name"), settings.get("traffic.feedback_per_minute")
        )
        return cls(
            listener=listener,
            api_keys=api_keys,
            app=app,
            local=settings.local_engine_config(),
            cloud=cloud,
            cascade=settings.cascade_config(),
            traffic=settings.traffic_settings(),
            cloud_prices_are_zero=prices_are_zero,
        )


@dataclass(frozen=True)
class CloudServeConfig:
    """Everything `tandem cloud serve` runs with: one engine behind gRPC and the OpenAI HTTP API."""

    listener: ListenerConfig  # [cloud_server]'s keys shared with [server] (host, ports, keys, limits, TLS)
    hosted: HostedCloudConfig  # [cloud_server]'s own (gRPC port, threads, prices, admin key file, drain grace)
    api_keys: frozenset[str]
    admin_key: str | None  # read from hosted.admin_key_file
    app: AppConfig  # both listeners' limits come from it: one budget per key, whichever door
    engine: CloudEngineConfig

    @property
    def prices(self) -> TierPrices:
        from router.costs import TierPrices

        return TierPrices(self.hosted.price_input_per_million, self.hosted.price_output_per_million)

    @classmethod
    def from_settings(cls, settings: Settings) -> CloudServeConfig:
        """Raises SettingsError, ApiKeyConfigError, BudgetConfigError, ValueError or OSError."""
        from router.costs import TierPrices
        from sdk.openai_server.serve_loop import check_tls_files
        from sdk.serving.api_keys import load_api_keys

        listener = settings.section_config(ListenerConfig, "cloud_server")
        hosted = settings.section_config(HostedCloudConfig, "cloud_server")
        api_keys = load_api_keys(listener.api_key_file)
        engine = settings.cloud_engine_config()
        check_tls_files(listener.tls_cert, listener.tls_key)
        admin_key = read_admin_key(hosted.admin_key_file) if hosted.admin_key_file else None
        config = cls(
            listener=listener,
            hosted=hosted,
            api_keys=api_keys,
            admin_key=admin_key,
            app=app_config(listener, api_keys, settings.get("cloud.model_name")),
            engine=engine,
        )
        if listener.budgets_file:
            from sdk.budgets.manager import check_budgets

            check_budgets(listener.budgets_file, prices_are_zero=config.prices == TierPrices(), cloud_only=True)
        return config


def read_admin_key(path: str) -> str:
    """The admin key: the file's first key (ApiKeyConfigError for an unreadable file, ValueError for a
    missing or short key)."""
    from sdk.serving.api_keys import read_key_file

    keys = read_key_file(path, "the admin key file")
    if not keys or len(keys[0]) < 16:
        raise ValueError(f"the admin key file {path!r} must hold one key of at least 16 characters")
    return keys[0]
