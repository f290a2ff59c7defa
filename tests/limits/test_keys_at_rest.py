"""Keys at rest: a keys file may hold a key's SHA-256 instead of the key; ``phi-api keys add`` prints a new key once
and keeps only its digest; ``phi-api check`` warns of a keys file or data folder others can read; a key in the query
string can be refused (``ALLOW_QUERY_API_KEY``)."""

from __future__ import annotations

import hashlib
import json
import stat

import pytest

from phi_api.errors import ConfigError
from phi_api.limits.keys import read_keys
from phi_api.settings import load_settings
from phi_api.tools import check, keys_command
from tests.tools.test_check import phi_api


def test_a_key_given_as_its_sha256_is_accepted_and_a_bad_digest_is_refused(make_app, tmp_path):
    path = tmp_path / "keys.json"
    digest = hashlib.sha256(b"sk-team-a-1").hexdigest()
    path.write_text(json.dumps({"keys": [{"name": "team-a", "key_sha256": digest}]}))
    client = make_app(API_KEYS_FILE=str(path)).test_client()
    assert client.get("/v1/models", headers={"Authorization": "Bearer sk-team-a-1"}).status_code == 200
    assert client.get("/v1/models", headers={"Authorization": "Bearer sk-team-a-2"}).status_code == 401
    for entry, words in (({"name": "b", "key_sha256": "00"}, "64 hexadecimal"),
                         ({"name": "b", "key": "sk-12345678", "key_sha256": "0" * 64}, "one of them")):
        path.write_text(json.dumps({"keys": [entry]}))
        with pytest.raises(ConfigError, match=words):
            read_keys(str(path), ())


def test_keys_add_prints_the_key_once_and_keeps_only_its_digest(tmp_path, make_app):
    path = tmp_path / "keys.json"
    done = phi_api("keys", "add", "team-a", "--file", str(path), "--requests-per-minute", "5")
    assert done.returncode == 0, done.stdout + done.stderr
    key = done.stdout.strip().splitlines()[-1]
    assert key.startswith("sk-") and done.stdout.count(key) == 1
    assert key not in path.read_text() and stat.S_IMODE(path.stat().st_mode) == 0o600
    [entry] = json.loads(path.read_text())["keys"]
    assert entry == {"name": "team-a", "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
                     "requests_per_minute": 5}
    client = make_app(API_KEYS_FILE=str(path)).test_client()
    assert client.get("/v1/models", headers={"X-API-Key": key}).status_code == 200
    again = phi_api("keys", "add", "team-a", "--file", str(path))
    assert again.returncode == 1 and "already" in again.stdout
    keys_command.add_key(path, "team-b", {"admin": True})
    assert [key.name for key in read_keys(str(path), ())] == ["team-a", "team-b"]


def test_check_warns_of_a_keys_file_and_a_data_folder_others_can_read(tmp_path):
    keys, data = tmp_path / "keys.json", tmp_path / "data"
    keys.write_text(json.dumps({"keys": [{"name": "a", "key": "sk-12345678"}]}))
    data.mkdir()
    keys.chmod(0o644)
    data.chmod(0o755)
    settings = load_settings(environ={"API_KEYS_FILE": str(keys), "DATA_DIR": str(data)})
    warnings = check.exposure(settings)
    assert len(warnings) == 2 and all("can be read by other users" in warning for warning in warnings)
    keys.chmod(0o600)
    data.chmod(0o700)
    assert check.exposure(settings) == []


def test_a_key_in_the_query_string_can_be_turned_off(make_app):
    on = make_app(API_KEYS="sk-secret-1").test_client()
    assert on.get("/v1/models?api_key=sk-secret-1").status_code == 200
    off = make_app(API_KEYS="sk-secret-1", ALLOW_QUERY_API_KEY=False).test_client()
    refused = off.get("/v1/models?api_key=sk-secret-1")
    assert refused.status_code == 401 and "query" in refused.get_json()["error"]["message"]
    assert off.get("/v1/models", headers={"X-API-Key": "sk-secret-1"}).status_code == 200
