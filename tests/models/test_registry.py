"""Several models: declared, loaded and unloaded while serving, the same in every worker (fake engines)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import gevent
import pytest

from phi_api.errors import (
    ConfigError,
    InvalidParameterError,
    ModelExistsError,
    ModelLimitError,
    ModelLoadingError,
    ModelNotFoundError,
)
from phi_api.models.registry import Models, expire_idle
from phi_api.models.specs import ModelSpec, check_folder, declared
from phi_api.settings import Settings
from phi_api.web.resources import get_models
from tests.api.test_request_errors import assert_error
from tests.support.fakes import fake_engine, text_pieces
from tests.support.server import wait_until


def model_folder(root: Path, name: str = "model") -> Path:
    """A folder that passes for a model (the fake loader never reads it)."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"filename": "model.onnx"}}}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "model.onnx").write_bytes(b"")
    return folder


class Loader:
    """Makes a fake engine per load, and remembers them; fails for paths containing "broken"."""

    def __init__(self) -> None:
        self.loaded: list[tuple[str, object]] = []
        self.specs: list[ModelSpec] = []
        self.entered = threading.Event()  # a load has begun
        self.gate: threading.Event | None = None  # when set by a test, loads wait for it

    def __call__(self, spec: ModelSpec):
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        if "broken" in spec.path:
            raise ModelLoadingError(spec.path, "the graph is broken")
        engine = fake_engine([1, 0], text_pieces(b"hi"))
        self.loaded.append((spec.id, engine))
        self.specs.append(spec)
        return engine


@pytest.fixture
def workers(tmp_path):
    """Two processes' registries over one state folder, the first having declared the models."""
    settings = Settings(MODEL_ID="first", MODEL_PATH=str(model_folder(tmp_path, "first")), MAX_MODELS=3)
    loaders = [Loader(), Loader()]
    state = tmp_path / "state"
    state.mkdir()
    made = [Models(settings, state, loader) for loader in loaders]
    for models in made:
        models.declare(declared(settings))
    yield made, loaders, tmp_path
    for models in made:
        models.stop()


def test_declared_models_are_served_by_every_worker(workers):
    (a, b), loaders, _ = workers
    assert a.ids() == b.ids() == ["first"]
    assert [model_id for model_id, _ in loaders[0].loaded] == ["first"]
    assert [model_id for model_id, _ in loaders[1].loaded] == ["first"]  # its own engine, in its own process


def test_a_load_in_one_worker_is_served_by_the_other(workers):
    (a, b), loaders, root = workers
    a.load(ModelSpec("second", str(model_folder(root, "second")), {"KV_CACHE_MB": 64}))
    assert b.engine("second") is loaders[1].loaded[-1][1]
    assert b.get("second").spec.options == {"KV_CACHE_MB": 64} and b.ids() == ["first", "second"]


def test_requests_wait_while_their_worker_loads_what_another_loaded(workers):
    (a, b), loaders, root = workers
    b.start()
    loaders[1].entered.clear()
    loaders[1].gate = threading.Event()
    a.load(ModelSpec("second", str(model_folder(root, "second"))))
    catching_up = gevent.spawn(b.sync)
    asking = gevent.spawn(b.engine, "second")
    wait_until(lambda: gevent.sleep(0.01) or loaders[1].entered.is_set(), timeout=5, message="b's load begun")
    assert not asking.ready()  # neither a 404 nor the old set of models: it waits
    loaders[1].gate.set()
    assert asking.get(timeout=5) is loaders[1].loaded[-1][1]
    catching_up.join(5)
    assert b.ids() == ["first", "second"]


def test_an_unload_of_a_model_already_gone_is_a_404_unless_that_is_fine(workers):
    (a, _), _, _ = workers
    with pytest.raises(ModelNotFoundError):
        a.unload("nobody")
    assert a.unload("nobody", missing_ok=True) is None  # keep_alive 0 after somebody else's unload
    assert a.ids() == ["first"]


def test_an_unload_in_one_worker_is_refused_by_every_worker(workers):
    (a, b), loaders, root = workers
    a.load(ModelSpec("second", str(model_folder(root, "second"))))
    b.engine("second")
    a.unload("second")
    for models in (a, b):
        with pytest.raises(ModelNotFoundError):
            models.engine("second")
    assert loaders[1].loaded[-1][1].draining  # b's engine was retired too
    with pytest.raises(ModelNotFoundError):
        a.unload("second")


def test_loads_that_cannot_be_done_change_nothing(workers):
    (a, b), _, root = workers
    with pytest.raises(ModelExistsError):
        a.load(ModelSpec("first", str(model_folder(root, "again"))))
    with pytest.raises(InvalidParameterError):
        a.load(ModelSpec("second", str(root / "nowhere")))
    with pytest.raises(ModelLoadingError):
        a.load(ModelSpec("second", str(model_folder(root, "broken"))))
    a.load(ModelSpec("second", str(model_folder(root, "second"))))
    a.load(ModelSpec("third", str(model_folder(root, "third"))))
    with pytest.raises(ModelLimitError):
        a.load(ModelSpec("fourth", str(model_folder(root, "fourth"))))
    assert b.ids() == ["first", "second", "third"]


@pytest.mark.parametrize("files,problem", [((), "genai_config.json"), (("genai_config.json",), "tokenizer.json"),
                                          (("genai_config.json", "tokenizer.json"), "model.onnx")])
def test_a_folder_must_hold_a_model(tmp_path, files, problem):
    for name in files:
        (tmp_path / name).write_text(json.dumps({"model": {"decoder": {}}}) if name == "genai_config.json" else "x")
    with pytest.raises(InvalidParameterError, match=problem):
        check_folder(str(tmp_path))


def test_models_file_declares_several_models(tmp_path):
    listing = tmp_path / "models.json"
    listing.write_text(json.dumps({"models": [{"id": "a", "path": "/m/a", "options": {"KV_CACHE_MB": 128}},
                                              {"id": "b", "path": "/m/b"}]}))
    specs = declared(Settings(MODELS_FILE=str(listing)))
    assert [(spec.id, spec.path, spec.options) for spec in specs] == [("a", "/m/a", {"KV_CACHE_MB": 128.0}),
                                                                      ("b", "/m/b", {})]
    assert [spec.id for spec in declared(Settings(MODEL_ID="solo", MODEL_PATH="/m/solo"))] == ["solo"]


def test_a_models_file_entry_names_another_as_its_draft_model(tmp_path):
    listing = tmp_path / "models.json"
    listing.write_text(json.dumps([{"id": "big", "path": "/m/big", "draft": "small", "options": {"KV_CACHE_MB": 64}},
                                   {"id": "small", "path": "/m/small"}]))
    specs = declared(Settings(MODELS_FILE=str(listing)))
    assert [spec.options for spec in specs] == [{"KV_CACHE_MB": 64.0, "SPECULATIVE_DRAFT_MODEL": "/m/small"}, {}]
    for draft in ("missing", "big", 3):  # an id of no other entry (nor its own)
        listing.write_text(json.dumps([{"id": "big", "path": "/m/big", "draft": draft},
                                       {"id": "small", "path": "/m/small"}]))
        with pytest.raises(ConfigError, match="the draft of big must be the id of another of its models"):
            declared(Settings(MODELS_FILE=str(listing)))


def test_a_models_file_path_may_start_with_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    listing = tmp_path / "models.json"
    listing.write_text(json.dumps([{"id": "a", "path": "~/.cache/phi-api/models/a"}]))
    assert declared(Settings(MODELS_FILE=str(listing)))[0].path == str(tmp_path / "home/.cache/phi-api/models/a")


@pytest.mark.parametrize("content", ['{"models": []}', '[{"id": "a"}]', '[{"id": "a", "path": "/m"}, {"id": "a", '
                                     '"path": "/n"}]', '[{"id": "a", "path": "/m", "options": {"LOG_LEVEL": "x"}}]',
                                     "not json"])
def test_a_bad_models_file_stops_start_up_naming_it(tmp_path, content):
    listing = tmp_path / "models.json"
    listing.write_text(content)
    with pytest.raises(ConfigError, match="MODELS_FILE"):
        declared(Settings(MODELS_FILE=str(listing)))


def test_load_and_unload_over_http_in_openai_openarc_and_ollama_terms(make_app, tmp_path):
    loader = Loader()
    app = make_app(engine=None, loader=loader, MODEL_ID="test-model",
                   MODEL_PATH=str(model_folder(tmp_path, "declared")))
    client = app.test_client()
    path = str(model_folder(tmp_path, "extra"))
    loaded = client.post("/v1/models/load", json={"model": "extra", "path": path}).get_json()
    assert (loaded["id"], loaded["status"]) == ("extra", "loaded")
    assert [m["id"] for m in client.get("/v1/models").get_json()["data"]] == ["test-model", "extra"]
    chat = {"model": "extra", "messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/v1/chat/completions", json=chat).get_json()["model"] == "extra"
    assert [m["name"] for m in client.get("/api/ps").get_json()["models"]] == ["test-model", "extra"]
    assert client.delete("/api/delete", json={"model": "extra"}).status_code == 200
    assert_error(client.post("/v1/chat/completions", json=chat), 404, "invalid_request_error", "model_not_found",
                 "model")
    openarc = client.post("/openarc/load", json={"model_name": "arc", "model_path": path, "model_type": "llm",
                                                 "device": "CPU"}).get_json()
    assert openarc == {"model_id": "arc", "model_name": "arc", "status": "loaded"}
    status = client.get("/openarc/status").get_json()
    assert status["total_loaded_models"] == 2 and status["openai_model_names"] == ["test-model", "arc"]
    assert client.post("/openarc/unload", json={"model_name": "arc"}).get_json()["status"] == "unloading"
    assert client.post("/v1/models/unload", json={"model": "arc"}).status_code == 404


def test_a_load_over_http_names_a_served_model_as_its_draft(make_app, tmp_path):
    loader = Loader()
    declared_path = str(model_folder(tmp_path, "declared"))
    app = make_app(engine=None, loader=loader, MODEL_ID="test-model", MODEL_PATH=declared_path)
    client = app.test_client()
    path = str(model_folder(tmp_path, "extra"))
    loaded = client.post("/v1/models/load", json={"model": "big", "path": path, "draft": "test-model"})
    assert loaded.status_code == 200 and loader.specs[-1].options == {"SPECULATIVE_DRAFT_MODEL": declared_path}
    assert_error(client.post("/v1/models/load", json={"model": "other", "path": path, "draft": "nobody"}), 400,
                 "invalid_request_error", "invalid_parameter", "draft")


@pytest.mark.parametrize("route,body,status,code,param", [
    ("/v1/models/load", {"model": "test-model", "path": "FOLDER"}, 400, "model_exists", "model"),
    ("/v1/models/load", {"model": "x", "path": "/nowhere"}, 400, "invalid_parameter", "path"),
    ("/v1/models/load", {"model": "x", "path": "BROKEN"}, 500, "model_loading_failed", None),
    ("/v1/models/load", {"model": "x", "path": "FOLDER", "options": {"LOG_LEVEL": "x"}}, 400, "invalid_parameter",
     "options"),
    ("/openarc/load", {"model_name": "x", "model_path": "FOLDER", "device": "GPU.0"}, 400, "invalid_parameter",
     "device"),
    ("/openarc/unload", {"model_name": "nobody"}, 404, "model_not_found", "model"),
])
def test_management_errors(make_app, tmp_path, route, body, status, code, param):
    app = make_app(engine=None, loader=Loader(), MODEL_ID="test-model",
                   MODEL_PATH=str(model_folder(tmp_path, "declared")))
    folders = {"FOLDER": str(model_folder(tmp_path, "good")), "BROKEN": str(model_folder(tmp_path, "broken"))}
    body = {key: folders.get(value, value) if isinstance(value, str) else value for key, value in body.items()}
    error = assert_error(app.test_client().post(route, json=body), status,
                         "server_error" if status == 500 else "invalid_request_error", code, param)
    if status == 500:
        assert "the graph is broken" in error["message"]  # the cause of a failed load
    assert [m["id"] for m in app.test_client().get("/v1/models").get_json()["data"]] == ["test-model"]


def test_generations_running_on_an_unloaded_model_finish(make_app, tmp_path):
    gate = threading.Semaphore(0)

    def loader(spec):
        engine = fake_engine([1, 2, 3], text_pieces(b"a", b"b", b"c"), gate=gate if spec.id == "slow" else None)
        return engine

    app = make_app(engine=None, loader=loader, MODEL_ID="test-model",
                   MODEL_PATH=str(model_folder(tmp_path, "declared")))
    client = app.test_client()
    client.post("/v1/models/load", json={"model": "slow", "path": str(model_folder(tmp_path, "slow"))})
    gate.release()  # its prompt
    stream = client.post("/v1/completions", json={"model": "slow", "prompt": "hi", "max_tokens": 6, "stream": True},
                         buffered=False)
    chunks = stream.iter_encoded()
    first = next(chunks)
    assert b'"text":"a"' in first
    assert client.post("/v1/models/unload", json={"model": "slow"}).status_code == 200
    assert client.post("/v1/completions", json={"model": "slow", "prompt": "hi"}).status_code == 404
    for _ in range(10):
        gate.release()
    rest = b"".join(chunks).decode()
    assert rest.count('"text":') >= 5 and rest.endswith("data: [DONE]\n\n") and '"error"' not in rest
    assert get_models(app).ids() == ["test-model"]


def test_a_model_loaded_at_run_time_is_unloaded_everywhere_once_idle_past_its_keep_time(tmp_path):
    settings = Settings(MODEL_ID="first", MODEL_PATH=str(model_folder(tmp_path, "first")), MAX_MODELS=3,
                        MODEL_IDLE_SECONDS=300)
    state = tmp_path / "state"
    state.mkdir()
    a, b = (Models(settings, state, Loader()) for _ in range(2))
    for models in (a, b):
        models.declare(declared(settings))
    try:
        a.load(ModelSpec("second", str(model_folder(tmp_path, "second"))))
        keep_file = a.keep_alive.path("second")
        assert keep_file.stat().st_mtime > time.time() + 290  # kept MODEL_IDLE_SECONDS from its load
        expire_idle(b)
        assert b.ids() == ["first", "second"]  # not yet idle long enough
        b.engine("second")  # a request in the other worker keeps it too
        assert keep_file.stat().st_mtime > time.time() + 290
        os.utime(keep_file, (time.time() - 1, time.time() - 1))  # its keep time has passed
        expire_idle(b)
        assert a.ids() == b.ids() == ["first"]  # unloaded everywhere; the declared model stays
        a.keep_alive.note_use("first", 0.001)
        os.utime(a.keep_alive.path("first"), (time.time() - 1, time.time() - 1))
        expire_idle(a)
        assert a.ids() == ["first"]
    finally:
        for models in (a, b):
            models.stop()


def test_a_keep_until_time_past_the_platform_s_clock_is_a_warning_not_an_error(tmp_path, caplog):
    from phi_api.models.keepalive import KeepAlive

    with caplog.at_level("WARNING", logger="phi_api.models.keepalive"):
        KeepAlive(tmp_path, 0.0).note_use("m", 1e300)  # os.utime: OverflowError (NaN: ValueError)
    assert "could not note the use of model m" in caplog.text
