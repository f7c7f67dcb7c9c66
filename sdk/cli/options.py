"""Option types shared by the `tandem` commands (kept apart so each command module stays import-light)."""

from __future__ import annotations

from sdk.protocol.sampling_params import TUNABLES

# The keys of --local-sampling / --cloud-sampling / --sampling, for their help (SamplingParams declares them).
SAMPLING_KEYS = ", ".join(TUNABLES)


def sampling_flags(tier: str, pairs: list[str] | None) -> dict:
    """`--local-sampling KEY=VALUE` / `--cloud-sampling` / `tandem cloud serve --sampling` as settings
    ({"local.sampling.top_p": 0.9}); SettingsError names a malformed pair or an unknown key."""
    from sdk.settings.fields import FIELDS, SettingsError

    flags = {}
    for pair in pairs or []:
        key, sep, raw = pair.partition("=")
        field = FIELDS.get(f"{tier}.sampling.{key.strip()}")
        if not sep or field is None:
            known = ", ".join(f.key for f in FIELDS.values() if f.section == f"{tier}.sampling")
            raise SettingsError(f"--sampling {pair!r}: expected KEY=VALUE with KEY one of {known}")
        try:
            flags[field.dotted] = field.parse_env(raw)
        except ValueError as exc:
            raise SettingsError(f"--sampling {pair!r}: {field.key} {exc}") from None
    return flags
