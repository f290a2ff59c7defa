"""The operator's Grafana dashboard (deploy/grafana) and Prometheus alert rules (deploy/prometheus) stand on what a
real server serves: every metric a panel, a variable or a rule names has samples in the ``/metrics`` of gunicorn
with two workers and the real model, scraped with an admin key after a chat request, a key's error, a batch and a
worker killed and replaced; the series the alerts watch move as they should; the rules pass ``promtool check
rules`` and their own unit tests (``promtool test rules``)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
import yaml
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server, wait_until

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "phi-api-dashboard.json"
RULES = DEPLOY / "prometheus" / "phi-api-alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "phi-api-alerts.test.yml"
ADMIN, TEAM = "sk-dashboard-ops", "sk-dashboard-team"
STORES = {"batches", "responses", "conversations", "background", "usage"}

# What the issue asks the dashboard and the rules to show, each by a metric that must be among those they name.
PANEL_SUBJECTS = {
    "requests by route": "phi_api_requests_total", "requests by key": "phi_api_key_requests_total",
    "errors by key": "phi_api_key_errors_total", "queued requests": "phi_api_requests_queued",
    "running requests": "vllm:num_requests_running",
    "first-token latency": "phi_api_time_to_first_token_seconds_bucket",
    "per-token latency": "phi_api_time_per_output_token_seconds_bucket",
    "tokens per second": "phi_api_generated_tokens_total", "KV memory use": "phi_api_kv_cache_reserved_bytes",
    "model loads": "phi_api_model_loaded_timestamp_seconds", "batch progress": "phi_api_batch_lines_total",
    "database errors": "phi_api_database_errors_total",
}
RULE_SUBJECTS = {
    "5xx rate": "phi_api_requests_total", "queue wait": "phi_api_request_queue_seconds_bucket",
    "KV memory near its budget": "vllm:kv_cache_usage_perc", "a worker restarted": "phi_api_worker_exits_total",
    "the database unreachable": "phi_api_database_up",
}

# A small PromQL reader: what is left of an expression once strings, Grafana variables, label matchers, ranges,
# grouping lists, numbers, function names and keywords are gone is the metric names it selects.
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_FUNCTION = re.compile(r"[A-Za-z_][\w:]*(?=\s*\()")
_NUMBER = re.compile(r"(?<![\w:])\d(?:[eE][+-]|[\w.])*")
_NAME = re.compile(r"[A-Za-z_:][\w:]*")
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
             "inf", "nan"}
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*[A-Za-z_]\w*\s*\)\s*$", re.S)


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = _STRING.sub(" ", expression)
    for pattern in (_VARIABLE, _MATCHERS, _RANGE, _GROUPING, _FUNCTION, _NUMBER):
        text = pattern.sub(" ", text)
    return {name for name in _NAME.findall(text) if name.lower() not in _KEYWORDS}


def variable_names(query: str) -> set[str]:
    """The metric names a Grafana Prometheus variable's query selects (``label_values(series, label)``)."""
    listing = _LABEL_VALUES.match(query)
    return metric_names(listing.group(1) if listing else query)


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict) -> list[dict]:
    """Every panel but rows, those of collapsed rows too."""
    found: list[dict] = []
    for panel in board["panels"]:
        found.extend(panel.get("panels", []) if panel["type"] == "row" else [panel])
    return found


def dashboard_names(board: dict) -> dict[str, set[str]]:
    """By panel title (and variable), the metric names its queries select."""
    named = {f"panel {panel['title']}": set().union(*(metric_names(target["expr"]) for target in panel["targets"]))
             for panel in panels(board)}
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            named[f"variable {variable['name']}"] = variable_names(query)
    return named


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def rule_names() -> dict[str, set[str]]:
    return {rule.get("alert") or rule["record"]: metric_names(rule["expr"]) for rule in rules()}


def test_the_reader_finds_the_metric_names_and_nothing_else():
    assert metric_names('histogram_quantile(0.9, sum by (le, model_name) (rate(phi_api_ttft_bucket{job=~"$job", '
                        'path="/a{b}(c)"}[$__rate_interval])))') == {"phi_api_ttft_bucket"}
    assert metric_names('sum(rate(a_total{status=~"5.."}[5m])) / clamp_min(sum (rate(b_total[5m:1m])), 1e-9) '
                        '> bool 0.05') == {"a_total", "b_total"}
    assert metric_names("max by (job) (vllm:kv_cache_usage_perc) > 0.9 and on(instance) group_left(model_name) "
                        "up offset 5m") == {"vllm:kv_cache_usage_perc", "up"}
    assert metric_names("count(loaded_seconds > time() - 3600) * $factor unless absent(x)") == {"loaded_seconds", "x"}
    assert variable_names('label_values(phi_api_requests_total{job=~"$job"}, instance)') == {"phi_api_requests_total"}


def test_the_dashboard_is_grafana_json_with_unique_panels_a_datasource_and_model_and_key_variables():
    board = dashboard()
    every = [panel["id"] for panel in board["panels"]] + [inner["id"] for panel in board["panels"]
                                                          for inner in panel.get("panels", [])]
    assert len(every) == len(set(every)) and all(isinstance(number, int) for number in every)
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["model"]["query"]["query"].endswith("model_name)")
    assert variables["key"]["query"]["query"].endswith("key_name)")
    for panel in panels(board):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all(target["datasource"]["uid"] == "${datasource}" for target in panel["targets"])
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
    named = dashboard_names(board)
    assert len(named) >= 25 and all(named.values()), [where for where, names in named.items() if not names]
    assert len(set().union(*named.values())) >= 30
    shown = set().union(*named.values())
    assert {subject: metric for subject, metric in PANEL_SUBJECTS.items() if metric not in shown} == {}
    assert '$model' in json.dumps(board["panels"]) and '$key' in json.dumps(board["panels"])


def test_every_rule_is_an_alert_with_a_severity_a_summary_and_a_description():
    found = rules()
    assert len(found) >= 5
    for rule in found:
        assert {"alert", "expr", "for", "labels", "annotations"} <= set(rule), rule
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    named = rule_names()
    assert all(named.values()), named
    watched = set().union(*named.values())
    assert {subject: metric for subject, metric in RULE_SUBJECTS.items() if metric not in watched} == {}


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: apt-get install prometheus (Debian's package; tests/system_packages.sh)"
    return found


def test_promtool_accepts_the_rules():
    checked = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout


def test_promtool_finds_a_broken_rule(tmp_path):
    broken = yaml.safe_load(RULES.read_text())
    broken["groups"][0]["rules"][0]["expr"] = "sum by (job) (rate(phi_api_requests_total[5m])"  # unbalanced
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(broken))
    checked = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode != 0


def test_the_alerts_fire_on_trouble_and_not_on_a_well_server():
    tested = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent,
                            capture_output=True, text=True, timeout=120)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


# The real server -------------------------------------------------------------------------------------------------


def scrape(server: Server) -> dict[str, list]:
    """The samples of the server's /metrics, by sample name (a histogram's ``_bucket``, ``_sum`` and ``_count``)."""
    response = requests.get(server.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
    assert response.status_code == 200, response.text
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples that carry ``labels``."""
    return sum(sample.value for sample in samples.get(name, [])
               if all(sample.labels.get(label) == wanted for label, wanted in labels.items()))


def run_batch(server: Server) -> str:
    """A one-line batch of the team's key, run to its end; its status."""
    client = OpenAI(base_url=server.url + "/v1", api_key=TEAM, max_retries=0, timeout=120)
    line = {"custom_id": "q0", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL_ID, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}}
    uploaded = client.files.create(file=("lines.jsonl", io.BytesIO(json.dumps(line).encode() + b"\n")),
                                   purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")

    def ended():
        status = client.batches.retrieve(batch.id).status
        return status if status in ("completed", "failed", "expired", "cancelled") else None

    return wait_until(ended, timeout=120, interval=0.2, message="the batch to end")


@pytest.fixture(scope="module")
def watched(model_path, logs_dir, tmp_path_factory):
    """A server with two keys after some traffic: a worker killed and replaced, then a chat request of the team's
    key, a request of it refused with 400, and a batch of it; the scrape once every worker has published."""
    keys = tmp_path_factory.mktemp("dashboard") / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "team", "key": TEAM}, {"name": "ops", "key": ADMIN, "admin": True}]}))
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=2, API_KEYS_FILE=keys) as server:
        started = time.time()
        survivor, victim = server.worker_pids()
        os.kill(victim, signal.SIGKILL)
        replacement = wait_until(lambda: next((pid for pid in server.worker_pids() if pid not in (survivor, victim)),
                                              None), timeout=60, message="gunicorn to replace the killed worker")
        session = server.session_to(replacement)  # (a keep-alive connection: kept by the polling)
        wait_until(lambda: session.get(server.url + "/health", timeout=5).status_code == 200, timeout=60,
                   message="the new worker to be ready")
        team = {"Authorization": f"Bearer {TEAM}"}
        chat = requests.post(server.url + "/v1/chat/completions", headers=team, timeout=120, json={
            "model": MODEL_ID, "max_tokens": 8, "ignore_eos": True, "messages": [{"role": "user", "content": "Hi"}]})
        assert chat.status_code == 200, chat.text
        assert chat.json()["usage"]["completion_tokens"] == 8
        refused = requests.post(server.url + "/v1/chat/completions", headers=team, json={"model": MODEL_ID},
                                timeout=30)
        assert refused.status_code == 400
        assert run_batch(server) == "completed"

        def published():  # each worker publishes its engines every 0.25 s, its databases every 5 s
            samples = scrape(server)
            databases = {sample.labels["store"] for sample in samples.get("phi_api_database_up", [])}
            return samples if databases == STORES and value(samples, "phi_api_batch_lines_total",
                                                            outcome="succeeded") >= 1 else None

        samples = wait_until(published, timeout=30, interval=0.5, message="every worker's series")
        yield server, samples, started


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_metric_the_dashboard_and_the_rules_name_is_served(watched, source):
    _, samples, _ = watched
    named = dashboard_names(dashboard()) if source == "dashboard" else rule_names()
    missing = {where: sorted(names - set(samples)) for where, names in named.items() if names - set(samples)}
    assert missing == {}
    assert len(samples) >= 40  # the scrape itself is not nearly empty


def test_the_series_the_alerts_and_panels_watch_move(watched):
    server, samples, started = watched
    assert value(samples, "phi_api_worker_exits_total") == 1  # the worker killed, counted once
    assert {sample.labels["store"]: sample.value for sample in samples["phi_api_database_up"]} == dict.fromkeys(
        STORES, 1.0)
    assert value(samples, "phi_api_database_errors_total") == 0
    assert value(samples, "phi_api_key_errors_total", key_name="team", status="400") == 1
    assert value(samples, "phi_api_key_requests_total", key_name="team") == 2  # the chat request and the batch line
    assert value(samples, "phi_api_batch_lines_total", outcome="succeeded") == 1
    assert value(samples, "phi_api_batch_lines_total", outcome="failed") == 0
    assert value(samples, "phi_api_batch_lines_queued", state="pending") == 0
    assert value(samples, "phi_api_time_per_output_token_seconds_count") >= 1  # the 8-token chat answer
    assert 0 < value(samples, "phi_api_time_per_output_token_seconds_sum") < 10
    assert value(samples, "phi_api_request_queue_seconds_count") == value(samples, "phi_api_key_requests_total")
    loaded = [sample.value for sample in samples["phi_api_model_loaded_timestamp_seconds"]
              if sample.labels["model_name"] == MODEL_ID]
    assert len(loaded) == 1 and started - 120 < loaded[0] <= time.time()  # loaded by the master, just before
    assert 0 <= value(samples, "vllm:kv_cache_usage_perc", model_name=MODEL_ID) <= 1
    # the per-key series are an admin's: another key's scrape has none of them
    other = requests.get(server.url + "/metrics", headers={"Authorization": f"Bearer {TEAM}"}, timeout=10).text
    assert "phi_api_key_errors_total" not in other and "phi_api_worker_exits_total" in other
