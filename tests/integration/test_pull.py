"""``python -m phi_api pull``: the real ``huggingface_hub`` client against a stand-in Hub on loopback
(tests/support/hub.py) serving the tiny Phi-3 as a repository with a subfolder. No test reaches the network."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from phi_api.models.pull import CATALOG
from tests.support.hub import Hub

ALIAS = "phi-3.5-mini"
SOURCE = CATALOG[ALIAS]
REPO_ID = "someone/tiny-phi3-onnx"
SUBFOLDER = "cpu/int4"


@pytest.fixture
def hub(tiny_phi3):
    with Hub() as running:
        running.add(SOURCE.repo, tiny_phi3, SOURCE.subfolder, commit=SOURCE.revision)
        running.add(REPO_ID, tiny_phi3, SUBFOLDER)
        yield running


def pull(hub: Hub, home: Path, name: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(home), "HF_HUB_DISABLE_TELEMETRY": "1"}
    environ.pop("HF_TOKEN", None)
    environ.update(env)
    return subprocess.run([sys.executable, "-m", "phi_api", "pull", name], env=environ, capture_output=True,
                          text=True, timeout=300)


def folder_of(done: subprocess.CompletedProcess) -> Path:
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip().splitlines()[-1])


def test_a_pull_by_alias_gives_a_folder_that_is_the_repository_s_subfolder(hub, tiny_phi3, tmp_path):
    done = pull(hub, tmp_path, ALIAS, HF_TOKEN="hf_not_to_be_logged_123")
    assert "hf_not_to_be_logged_123" not in done.stdout + done.stderr
    folder = folder_of(done)
    assert folder.parts[-2:] == tuple(SOURCE.subfolder.split("/")[-2:]) and SOURCE.revision in folder.parts
    assert sorted(path.name for path in folder.iterdir()) == sorted(path.name for path in tiny_phi3.iterdir())
    assert all((folder / path.name).read_bytes() == path.read_bytes() for path in tiny_phi3.iterdir())
    assert "README.md" not in hub.downloads  # only the subfolder


def test_a_second_pull_downloads_nothing_and_offline_finds_it_in_the_cache(hub, tmp_path):
    first = folder_of(pull(hub, tmp_path, f"{REPO_ID}/{SUBFOLDER}"))
    transfers = sum(hub.downloads.values())
    assert folder_of(pull(hub, tmp_path, f"{REPO_ID}/{SUBFOLDER}")) == first
    assert sum(hub.downloads.values()) == transfers
    hub.shutdown()  # nothing to ask any more
    assert folder_of(pull(hub, tmp_path, f"{REPO_ID}/{SUBFOLDER}", HF_HUB_OFFLINE="1")) == first


def test_a_transfer_cut_midway_still_ends_with_whole_files(hub, tiny_phi3, tmp_path):
    data = f"{SUBFOLDER}/model.onnx.data"
    hub.cuts[data] = 1
    folder = folder_of(pull(hub, tmp_path, f"{REPO_ID}/{SUBFOLDER}"))
    assert hub.downloads[data] == 2  # cut once, then resumed
    assert (folder / "model.onnx.data").read_bytes() == (tiny_phi3 / "model.onnx.data").read_bytes()


def test_a_transfer_that_keeps_failing_is_one_clear_line_and_the_next_pull_succeeds(hub, tmp_path):
    data = f"{SUBFOLDER}/model.onnx.data"
    hub.cuts[data] = 100
    failed = pull(hub, tmp_path, f"{REPO_ID}/{SUBFOLDER}")
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    [line] = [line for line in failed.stderr.splitlines() if line.startswith("phi-api pull:")]
    assert REPO_ID in line
    hub.cuts.clear()
    folder_of(pull(hub, tmp_path, f"{REPO_ID}/{SUBFOLDER}"))


def test_a_file_whose_bytes_do_not_match_its_hash_is_refused_removed_and_named(hub, tmp_path):
    hub.repos[REPO_ID].corrupt.add(f"{SUBFOLDER}/model.onnx")
    failed = pull(hub, tmp_path, f"{REPO_ID}/{SUBFOLDER}")
    assert failed.returncode == 1 and f"{SUBFOLDER}/model.onnx:" in failed.stderr and "Traceback" not in failed.stderr
    assert not [path for path in tmp_path.rglob("model.onnx") if path.exists()]
    hub.repos[REPO_ID].corrupt.clear()
    assert (folder_of(pull(hub, tmp_path, f"{REPO_ID}/{SUBFOLDER}")) / "model.onnx").is_file()


@pytest.mark.parametrize("outside", ["absolute", "parent"])
def test_a_listing_naming_files_outside_the_repository_is_refused_before_any_download(hub, tmp_path, outside):
    """A file that does not match its hash is removed: a hostile Hub's listing must not make that any file."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    name = str(victim) if outside == "absolute" else f"{SUBFOLDER}/{'../' * 16}{str(victim).lstrip('/')}"
    hub.repos[REPO_ID].listed_only.append(name)
    failed = pull(hub, tmp_path / "home", f"{REPO_ID}/{SUBFOLDER}")
    assert failed.returncode == 1 and "outside the repository" in failed.stderr and "Traceback" not in failed.stderr
    assert victim.read_text() == "keep me" and not hub.downloads


def test_a_hub_sending_more_than_it_declared_is_stopped_near_the_declared_size(hub, tiny_phi3, tmp_path):
    """The room checked before a pull is what the Hub declares: a file that goes on past its size (here 300 MB more
    than a ~60 MB model) is cut off, not written whole before the client checks its size."""
    declared = sum(path.stat().st_size for path in tiny_phi3.iterdir())
    hub.repos[REPO_ID].padded[f"{SUBFOLDER}/genai_config.json"] = 300 << 20
    failed = pull(hub, tmp_path, f"{REPO_ID}/{SUBFOLDER}")
    assert failed.returncode == 1 and "more than" in failed.stderr and "Traceback" not in failed.stderr
    assert sum(hub.sent.values()) < declared + (100 << 20)  # (what the sockets' buffers held besides)


def test_a_repository_without_genai_config_is_refused_before_any_download(hub, tiny_phi3, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "weights.bin").write_bytes(b"x" * 4096)
    hub.add("someone/not-onnx", plain)
    failed = pull(hub, tmp_path / "home", "someone/not-onnx")
    assert failed.returncode == 1 and "not an ONNX Runtime GenAI model" in failed.stderr
    assert not hub.downloads
    missing = pull(hub, tmp_path / "home", "someone/nothing-here")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr and "someone/nothing-here" in missing.stderr


def test_ollama_s_pull_streams_progress_then_serves_the_model(hub, model_path, logs_dir, tmp_path):
    import ollama

    from tests.integration.conftest import MODEL_ID
    from tests.support.server import Server

    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, ALLOW_PULL="true",
                HF_ENDPOINT=hub.url, HF_HOME=tmp_path, HF_HUB_DISABLE_TELEMETRY="1") as server:
        client = ollama.Client(host=server.url)
        events = list(client.pull(ALIAS, stream=True))
        statuses = [event.status for event in events]
        assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
        downloading = [event for event in events if event.total]
        assert downloading and downloading[-1].completed == downloading[-1].total
        assert ALIAS in [model.model for model in client.list().models]
        answer = client.chat(model=ALIAS, messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 4})
        assert answer.message.role == "assistant" and answer.done


def test_make_serve_with_a_model_name_pulls_it_and_serves_it(hub, tmp_path):
    import signal

    import requests

    from phi_api.bench.server import REPO, free_port
    from tests.support.server import answers_health, wait_until

    port = free_port()
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path), "HF_HUB_DISABLE_TELEMETRY": "1",
           "SERVER_HOST": "127.0.0.1", "SERVER_PORT": str(port), "WEB_CONCURRENCY": "1"}
    for name in ("MODEL_PATH", "MODEL_ID", "MODELS_FILE"):
        env.pop(name, None)
    with open(tmp_path / "serve.log", "wb") as log:
        process = subprocess.Popen(["make", "-s", "serve", f"MODEL={ALIAS}"], cwd=REPO, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(answers_health(process, url, tmp_path / "serve.log"), 240, interval=0.2, message="make serve")
        assert [model["id"] for model in requests.get(url + "/v1/models", timeout=10).json()["data"]] == [ALIAS]
        answer = requests.post(url + "/v1/chat/completions", timeout=60, json={
            "model": ALIAS, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def test_a_models_file_entry_may_name_a_model_instead_of_a_path(hub, logs_dir, tmp_path):
    import json

    import requests

    from tests.support.server import Server

    models = tmp_path / "models.json"
    models.write_text(json.dumps({"models": [{"id": "tiny", "model": f"{REPO_ID}/{SUBFOLDER}"}]}))
    with Server(logs_dir, MODELS_FILE=models, WEB_CONCURRENCY=1, HF_ENDPOINT=hub.url, HF_HOME=tmp_path / "hf",
                HF_HUB_DISABLE_TELEMETRY="1") as server:
        listed = requests.get(server.url + "/v1/models", timeout=10).json()["data"]
        assert [model["id"] for model in listed] == ["tiny"] and listed[0]["max_model_len"] > 0
    assert hub.downloads[f"{SUBFOLDER}/genai_config.json"] == 1


def test_a_pinned_commit_once_checked_is_served_again_without_any_network_call(hub, tmp_path):
    first = folder_of(pull(hub, tmp_path, ALIAS))
    hub.shutdown()  # the Hub is gone; no HF_HUB_OFFLINE either
    again = pull(hub, tmp_path, ALIAS)
    assert folder_of(again) == first


def test_an_encoder_folder_is_pulled_and_served_for_embeddings(hub, model_path, tiny_embedder, logs_dir, tmp_path):
    import ollama

    from tests.integration.conftest import MODEL_ID
    from tests.support.server import Server

    hub.add("someone/tiny-embedder", tiny_embedder)
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1, ALLOW_PULL="true",
                HF_ENDPOINT=hub.url, HF_HOME=tmp_path, HF_HUB_DISABLE_TELEMETRY="1") as server:
        client = ollama.Client(host=server.url)
        assert [event.status for event in client.pull("someone/tiny-embedder", stream=True)][-1] == "success"
        vectors = client.embed(model="someone/tiny-embedder", input=["first", "second"]).embeddings
        assert [len(vector) for vector in vectors] == [32, 32] and vectors[0] != vectors[1]
        assert client.show("someone/tiny-embedder").capabilities == ["embedding"]
    assert hub.downloads["encoder_config.json"] == 1
