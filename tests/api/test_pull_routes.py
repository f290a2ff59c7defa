"""Pulls over HTTP are refused unless the operator allows them; names are checked; models carry their context."""

from __future__ import annotations

import pytest

from phi_api.errors import PullError
from phi_api.models.pull import CATALOG, parse


@pytest.mark.parametrize("route,body", [("/api/pull", {"model": "phi-3.5-mini"}),
                                        ("/v1/models/load", {"model": "phi-3.5-mini"})])
def test_a_pull_over_http_is_refused_unless_keys_or_allow_pull(client, route, body):
    answer = client.post(route, json=body)
    assert answer.status_code == 403
    error = answer.get_json()["error"]
    assert "ALLOW_PULL" in (error if isinstance(error, str) else error["message"])


def test_a_name_that_is_no_model_is_a_400_before_anything_is_downloaded(make_app):
    client = make_app(ALLOW_PULL=True).test_client()
    answer = client.post("/v1/models/load", json={"model": "just-a-word"})
    assert answer.status_code == 400 and answer.get_json()["error"]["param"] == "model"
    assert client.post("/api/pull", json={"name": "just-a-word"}).status_code == 400


def test_names_are_aliases_or_hub_repositories():
    assert parse("phi-3.5-mini") == CATALOG["phi-3.5-mini"]
    assert parse("org/repo") .repo == "org/repo" and parse("org/repo").revision == "main"
    source = parse("org/repo/cpu/int4@abc")
    assert (source.repo, source.subfolder, source.revision, source.pattern) == ("org/repo", "cpu/int4", "abc",
                                                                             "cpu/int4/*")
    with pytest.raises(PullError, match="catalog"):
        parse("nothing")


def test_models_carry_their_context_length(client):
    [model] = client.get("/v1/models").get_json()["data"]
    assert model["max_model_len"] > 0
    show = client.post("/api/show", json={"model": model["id"]}).get_json()
    assert show["parameters"] == f"num_ctx {model['max_model_len']}"


def test_free_disk_space_is_checked_first_naming_what_is_needed_and_free(tmp_path):
    from phi_api.models.pull import _check_space

    with pytest.raises(PullError, match=r"not enough disk space in .*: 9\d+\.\d GB needed, \d+\.\d GB free"):
        _check_space(10**15, tmp_path / "not yet made")
    _check_space(1, tmp_path)


@pytest.mark.parametrize("name", ["org/../secret", "../org/repo", "/org/repo", "org//repo", "org/repo/", "org/./repo",
                                  "org/repo@../main", "org/re po", "org/repo@"])
def test_a_name_with_a_path_s_parts_is_refused_before_any_download(name):
    with pytest.raises(PullError, match="not a model name"):
        parse(name)


def test_a_name_that_looks_like_an_option_is_pulled_as_a_name(monkeypatch, tmp_path):
    """The pull's process reads the name after ``--``: '-a/-b' is a (missing) repository, not an option."""
    from phi_api.models.pull import in_subprocess

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing to reach: the name is read, then not found in the cache
    last = list(in_subprocess("-a/-b"))[-1]
    assert "-a/-b" in last["error"] and "exit status" not in last["error"]


def test_a_download_that_trickles_or_passes_its_declared_size_is_stopped():
    """A Hub that sends a byte now and then meets the client's read timeout, and one that sends more than it
    declared fills the disk: the progress bars snapshot_download is given stop both (through the cache's bars)."""
    from phi_api.models.pull import STALL_BYTES, STALL_SECONDS, _bounded

    now = [0.0]
    bar = _bounded(10 << 20, clock=lambda: now[0])(total=0, unit="B", disable=True)
    for _ in range(20):  # fast enough: a window's worth and more each STALL_SECONDS
        now[0] += STALL_SECONDS / 4
        bar.update(STALL_BYTES // 2)
    with pytest.raises(PullError, match="less than"):
        for _ in range(8):  # then a trickle
            now[0] += STALL_SECONDS / 4
            bar.update(1)
    files = _bounded(10, clock=lambda: now[0])(total=0, unit="it", disable=True)
    files.update(100)  # the bar of files is not a count of bytes
    with pytest.raises(PullError, match="more than"):
        _bounded(10 << 20, clock=lambda: now[0])(total=0, unit="B", disable=True).update((10 << 20) + 1)
