"""The deployment files in deploy/: Kubernetes manifests valid against Kubernetes' own schemas, a sound
systemd unit, and an nginx site that keeps what phi-api's streams need (it runs for real in
tests/integration/test_nginx.py)."""

from __future__ import annotations

import configparser
import copy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
KUBERNETES_VERSION = "1.30"


def manifests(name: str = "phi-api.yaml") -> list[dict]:
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))


def test_the_manifests_are_valid_kubernetes_objects():
    documents = manifests()
    assert [document["kind"] for document in documents] == ["Deployment", "Service", "Ingress",
                                                            "HorizontalPodAutoscaler"]
    database = manifests("postgres.yaml")
    assert [document["kind"] for document in database] == ["Secret", "StatefulSet", "Service"]
    for document in documents + database:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_validator_catches_a_broken_manifest():
    deployment = copy.deepcopy(manifests()[0])
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    deployment = copy.deepcopy(manifests()[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = []  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_the_deployment_probes_health_drains_and_reads_the_model_read_only():
    spec = manifests()[0]["spec"]["template"]["spec"]
    container = spec["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    assert container["lifecycle"]["preStop"]
    environment = {item["name"]: item.get("value") for item in container["env"]}
    graceful = int(environment["GUNICORN_CMD_ARGS"].split("--graceful-timeout ")[1])
    assert spec["terminationGracePeriodSeconds"] > graceful + 5  # streams finish before the kill
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in container["volumeMounts"]
    assert container["resources"]["requests"]["memory"]
    # the replicas share their state in the database of postgres.yaml, its URL from the Secret made there
    secret = next(item for item in container["env"] if item["name"] == "DATABASE_URL")["valueFrom"]["secretKeyRef"]
    made = manifests("postgres.yaml")
    assert secret["name"] == made[0]["metadata"]["name"] and secret["key"] in made[0]["stringData"]
    host = made[0]["stringData"][secret["key"]].split("@")[1].split(":")[0]
    assert host == made[2]["metadata"]["name"]  # the URL names the database's Service
    metric = manifests()[3]["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric == "phi_api_requests_in_flight"  # a series phi-api's /metrics serves


def test_the_systemd_unit_restarts_on_failure_reads_its_environment_and_stops_gracefully():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.read_string((DEPLOY / "systemd" / "phi-api.service").read_text())
    service = unit["Service"]
    assert service["Restart"] == "on-failure" and service["EnvironmentFile"] == "/etc/phi-api/phi-api.env"
    assert service["KillSignal"] == "SIGTERM" and int(service["TimeoutStopSec"]) > 30  # gunicorn's graceful timeout
    assert service["ExecStart"].endswith("gunicorn -c gunicorn.conf.py wsgi:app")
    assert "3" in service["RestartPreventExitStatus"].split()  # a model that cannot load does not loop
    environment = (DEPLOY / "systemd" / "phi-api.env").read_text()
    assert "MODEL_PATH=" in environment


def test_the_nginx_site_passes_streams_through_and_keeps_conversations_together():
    site = (DEPLOY / "nginx" / "phi-api.conf").read_text()
    for directive in ("proxy_buffering off;", "gzip off;", "proxy_read_timeout 3600s;", "client_max_body_size 10m;",
                      "hash $phi_api_affinity consistent;", "max_fails=1 fail_timeout=10s",
                      "proxy_next_upstream error timeout http_502 http_503 http_429 non_idempotent;",
                      "proxy_set_header X-Request-Id $phi_api_request_id;"):
        assert directive in site, directive


def pins(path: Path) -> dict[str, str]:
    """A requirements file's ``name==version`` lines, by normalized name (other lines are left out)."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            found[name.strip().lower().replace("_", "-")] = version.strip()
    return found


def test_the_image_installs_every_package_pinned_runs_as_a_user_with_a_home_and_checks_its_health():
    root = DEPLOY.parent
    lock_lines = [line for line in (root / "requirements.lock").read_text().splitlines()
                  if line.strip() and not line.startswith("#")]
    assert lock_lines and all("==" in line for line in lock_lines)
    lock, direct = pins(root / "requirements.lock"), pins(root / "requirements.txt")
    assert {name: lock.get(name) for name in direct} == direct  # the lock holds requirements.txt's own pins
    dockerfile = (root / "Dockerfile").read_text()
    assert "pip install --no-deps -r requirements.lock" in dockerfile
    assert "--create-home" in dockerfile and "USER phi-api" in dockerfile
    assert "HEALTHCHECK" in dockerfile and "/health" in dockerfile
    assert 'VOLUME ["/var/cache/phi-api"]' in dockerfile
    assert "HF_HOME=/var/cache/phi-api/" in dockerfile  # a pull at start-up lands on the volume
    assert "pip install --quiet --no-deps -r requirements.lock" in (root / "Makefile").read_text()  # make too


def test_the_package_depends_on_every_runtime_requirement():
    import re
    import tomllib

    declared = set()
    for requirement in tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]["dependencies"]:
        name, extras = re.match(r"([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", requirement).groups()
        name = name.lower().replace("_", "-")
        declared |= {name, *(f"{name}-{extra.strip()}" for extra in (extras or "").split(",") if extra.strip())}
    assert set(pins(DEPLOY.parent / "requirements.txt")) - declared == set()  # pip install . gets them all
