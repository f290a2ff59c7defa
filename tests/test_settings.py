"""Settings: defaults, then the environment, then overrides; bad values name the setting."""

from __future__ import annotations

import pytest

from phi_api.errors import ConfigError
from phi_api.settings import load_settings, parse_option


def test_defaults_are_the_specification_s():
    settings = load_settings(environ={})
    assert settings.MODEL_PATH == ""  # no one's home folder: without a model, start-up says what to set
    assert (settings.MODEL_ID, settings.SERVER_HOST, settings.SERVER_PORT) == ("phi-3.5-mini", "0.0.0.0", 8000)
    assert (settings.MAX_CONCURRENT_REQUESTS, settings.DEFAULT_MAX_TOKENS) == (10, 1024)
    assert (settings.DEFAULT_TEMPERATURE, settings.CORS_ORIGINS, settings.MAX_REQUEST_SIZE_MB) == (0.7, "*", 10.0)
    assert settings.LOG_LEVEL == "INFO"


def test_environment_then_overrides():
    environ = {"SERVER_PORT": "9000", "MODEL_ID": "from-env", "LOG_LEVEL": "debug"}
    settings = load_settings(environ=environ, overrides={"MODEL_ID": "from-test"})
    assert (settings.SERVER_PORT, settings.MODEL_ID, settings.LOG_LEVEL) == (9000, "from-test", "DEBUG")


def test_empty_environment_values_mean_default():
    assert load_settings(environ={"SERVER_PORT": ""}).SERVER_PORT == 8000


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SERVER_PORT", "eighty"),
        ("SERVER_PORT", "70000"),
        ("MAX_CONCURRENT_REQUESTS", "0"),
        ("DEFAULT_MAX_TOKENS", "-5"),
        ("DEFAULT_TEMPERATURE", "2.5"),
        ("DEFAULT_TEMPERATURE", "nan"),
        ("MAX_REQUEST_SIZE_MB", "0"),
        ("GENERATION_TIMEOUT", "inf"),
        ("LOG_LEVEL", "LOUD"),
        ("WEB_CONCURRENCY", "1.5"),
        ("WEB_CONCURRENCY", "0"),
        ("PRELOAD_MODEL", "maybe"),
    ],
)
def test_a_bad_value_stops_with_a_message_naming_the_setting(name, value):
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={name: value})
    assert name in str(caught.value)


def test_a_blank_override_is_refused():
    with pytest.raises(ConfigError, match="MODEL_ID"):
        load_settings(environ={}, overrides={"MODEL_ID": "   "})


def test_cors_origins_list():
    assert load_settings(environ={"CORS_ORIGINS": "https://a.example, https://b.example"}).cors_origins == [
        "https://a.example", "https://b.example"]
    assert load_settings(environ={}).cors_origins == "*"


def test_each_worker_computes_with_its_share_of_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert load_settings(environ={}).intra_op_threads == 8
    assert load_settings(environ={"WEB_CONCURRENCY": "2"}).intra_op_threads == 4
    assert load_settings(environ={"WEB_CONCURRENCY": "2", "PRELOAD_MODEL": "false"}).intra_op_threads == 4
    assert load_settings(environ={"WEB_CONCURRENCY": "16"}).intra_op_threads == 1
    assert load_settings(environ={"INTRA_OP_THREADS": "3"}).intra_op_threads == 3


def test_the_memory_limit_is_a_setting_or_three_quarters_of_the_memory_and_kv_cache_mb_a_cap(monkeypatch):
    monkeypatch.setattr("phi_api.settings._memory_bytes", lambda: 16 * 2**30)
    assert load_settings(environ={}).memory_limit_bytes == 12 * 2**30
    assert load_settings(environ={"MEMORY_LIMIT_MB": "2048"}).memory_limit_bytes == 2 * 2**30
    assert load_settings(environ={"KV_CACHE_MB": "512"}).kv_budget_bytes == 512 * 2**20
    assert load_settings(environ={}).kv_budget_bytes == 12 * 2**30  # no cap of its own: the memory limit bounds it


@pytest.mark.parametrize("raw,expected", [("true", True), ("0", False), ("off", False), ("YES", True)])
def test_booleans(raw, expected):
    assert load_settings(environ={"PRELOAD_MODEL": raw}).PRELOAD_MODEL is expected


def test_every_setting_is_declared_once_and_documented():
    from pathlib import Path

    from phi_api.settings import SETTING_NAMES, describe

    reference = (Path(__file__).resolve().parents[1] / "docs" / "settings.md").read_text(encoding="utf-8")
    assert set(describe()) == set(SETTING_NAMES) and all(describe().values())
    assert [name for name in SETTING_NAMES if f"`{name}`" not in reference] == []


def test_a_setting_that_was_replaced_stops_start_up_saying_what_replaced_it():
    with pytest.raises(ConfigError, match=r"PROMPT_CACHE_MB is no longer a setting: .*PREFIX_CACHE=off"):
        load_settings(environ={"PROMPT_CACHE_MB": "0"})
    with pytest.raises(ConfigError, match="PROMPT_CACHE_MB is no longer a setting"):
        parse_option("PROMPT_CACHE_MB", 64)


def test_prefix_reuse_and_key_value_settings():
    settings = load_settings(environ={"PREFIX_CACHE": "exact", "KV_CACHE_DTYPE": "int8",
                                      "PREFILL_SLICE_SECONDS": "0.5"})
    assert (settings.PREFIX_CACHE, settings.KV_CACHE_DTYPE, settings.PREFILL_SLICE_SECONDS) == ("exact", "int8", 0.5)
    for name, value in (("PREFIX_CACHE", "sometimes"), ("KV_CACHE_DTYPE", "float16"), ("PREFILL_SLICE_SECONDS", "0")):
        with pytest.raises(ConfigError, match=name):
            load_settings(environ={name: value})


def test_the_disk_tier_of_prefix_reuse_is_on_by_default_under_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("PHI_API_CACHE_DIR", str(tmp_path))
    assert load_settings(environ={}).prefix_disk_dir == str(tmp_path / "prefixes")
    assert load_settings(environ={"PREFIX_CACHE_DIR": "~/kv"}).prefix_disk_dir.endswith("/kv")
    assert "~" not in load_settings(environ={"PREFIX_CACHE_DIR": "~/kv"}).prefix_disk_dir
    assert load_settings(environ={"PREFIX_CACHE_DISK_MB": "0"}).prefix_disk_dir == ""
    assert load_settings(environ={"PREFIX_CACHE": "off"}).prefix_disk_dir == ""
