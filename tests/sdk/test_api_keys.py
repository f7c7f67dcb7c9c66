"""API key loading and checking shared by the hosted HTTP API and the gRPC service."""

from __future__ import annotations

import pytest

from sdk.serving.api_keys import ApiKeyConfigError, bearer_token, key_fingerprint, load_api_keys, matching_key


def test_keys_from_file_and_env(tmp_path, monkeypatch):
    path = tmp_path / "keys"
    path.write_text("# team keys\nsk-one\n\n  sk-two  \n")
    monkeypatch.setenv("TANDEM_API_KEYS", "sk-three, ,sk-one")
    assert load_api_keys(str(path)) == {"sk-one", "sk-two", "sk-three"}


def test_no_source_means_no_keys(monkeypatch):
    monkeypatch.delenv("TANDEM_API_KEYS", raising=False)
    assert load_api_keys(None) == frozenset()


def test_bad_key_files_are_errors(tmp_path):
    with pytest.raises(ApiKeyConfigError, match="cannot read"):
        load_api_keys(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.write_text("# nothing here\n\n")
    with pytest.raises(ApiKeyConfigError, match="holds no key"):
        load_api_keys(str(empty))


@pytest.mark.parametrize(
    "header,token",
    [
        ("Bearer sk-1", "sk-1"),
        ("bearer   sk-1 ", "sk-1"),
        ("Basic abc", None),
        ("Bearer", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header, token):
    assert bearer_token(header) == token


def test_matching_key_and_fingerprint():
    keys = frozenset({"sk-a", "sk-b"})
    assert matching_key("sk-b", keys) == "sk-b"
    assert matching_key("sk-", keys) is None and matching_key(None, keys) is None
    assert key_fingerprint("sk-a") != key_fingerprint("sk-b") and "sk-a" not in key_fingerprint("sk-a")
