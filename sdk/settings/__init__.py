"""tandem's configuration: built-in defaults < a TOML file < TANDEM_* env vars < command-line options.

- `fields`: the table of every setting (section, key, type, env variable, check, target field).
- `loading`: `load_settings()` / `settings_from_mapping()` and the effective `Settings`;
  `reading`: finding the TOML file and reading it into (field, value) pairs.
- `config_file`: finding the config file and writing a calibrated threshold into it.
"""

from sdk.settings.fields import CloudTarget, SettingsError, parse_cloud_url
from sdk.settings.loading import Settings, load_settings, settings_from_mapping

__all__ = ["CloudTarget", "Settings", "SettingsError", "load_settings", "parse_cloud_url", "settings_from_mapping"]
