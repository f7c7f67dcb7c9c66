"""Both servers' options are made from sdk.settings' field table: one per setting a command takes, with the
field's type, env variable and check; a value given on the command line lands on its settings key."""

from __future__ import annotations

import inspect

import pytest
from typer.testing import CliRunner

from sdk.cli.app import app
from sdk.cli.cloud import CLOUD_SERVE_SETTINGS, PRECOMPILE_SETTINGS, precompile
from sdk.cli.cloud import serve as cloud_serve
from sdk.cli.serve import ALSO_SETS, RENAMED, SERVE_SETTINGS, serve
from sdk.cli.setting_options import flag_name, settings_given
from sdk.settings.fields import FIELDS


@pytest.mark.parametrize(
    "command, keys, renamed",
    [(serve, SERVE_SETTINGS, RENAMED), (cloud_serve, CLOUD_SERVE_SETTINGS, {}), (precompile, PRECOMPILE_SETTINGS, {})],
)
def test_every_setting_a_command_takes_is_an_option_with_its_env_variable(command, keys, renamed):
    parameters = inspect.signature(command).parameters
    for dotted in keys:
        field, flag = FIELDS[dotted], flag_name(dotted, renamed)
        option = parameters[flag.replace("-", "_")].default
        expected = f"--{flag}/--no-{flag}" if field.type is bool else f"--{flag}"
        assert option.param_decls == (expected,) and f"[env: {field.env}]" in option.help and field.help in option.help
    assert "--config" in parameters["config"].default.param_decls


def test_cloud_precompile_takes_the_engine_settings_of_cloud_serve_and_refuses_a_bad_one():
    assert PRECOMPILE_SETTINGS and set(PRECOMPILE_SETTINGS) <= set(CLOUD_SERVE_SETTINGS)
    assert {"cloud.weight_dtype", "cloud.kv_cache_dtype", "cloud.max_num_seqs"} <= set(PRECOMPILE_SETTINGS)
    result = CliRunner().invoke(app, ["cloud", "precompile", "--weight-dtype", "fp8"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "'--weight-dtype'" in result.output and "'fp8' is not one of" in result.output


def test_cloud_serve_reads_its_engine_from_cloud_and_its_listeners_from_cloud_server():
    assert flag_name("cloud.url", RENAMED) == "cloud"
    assert all(key.partition(".")[0] in ("cloud", "cloud_server") for key in CLOUD_SERVE_SETTINGS)
    assert all(FIELDS[key].env.startswith("TANDEM_CLOUD_") for key in CLOUD_SERVE_SETTINGS)
    result = CliRunner().invoke(app, ["cloud", "serve", "--grpc-port", "70000"])
    assert result.exit_code == 2 and "cloud_server.grpc_port" in result.output


def test_given_options_land_on_their_keys_and_one_switch_sets_both_tiers():
    given = settings_given(
        {"cloud": "none", "port": 9000, "close_within_max_tokens": False, "threads": None},
        SERVE_SETTINGS,
        RENAMED,
        ALSO_SETS,
    )
    assert given == {
        "cloud.url": "none",
        "server.port": 9000,
        "local.close_within_max_tokens": False,
        "cloud.close_within_max_tokens": False,
    }


def test_the_fields_check_refuses_a_bad_value_before_anything_loads():
    result = CliRunner().invoke(app, ["serve", "--port", "70000"])
    assert result.exit_code == 2 and "server.port" in result.output and "65535" in result.output
    result = CliRunner().invoke(app, ["serve", "--log-level", "LOUD"])
    assert result.exit_code == 2 and "--log-level" in result.output
