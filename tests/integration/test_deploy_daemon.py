"""The deployment files run for real (issue 16): the image's default config and its
HEALTHCHECK script, the Kubernetes ConfigMap's config with its Secret's files in place, and
the KServe runtime's `--model` command, each against a real `snooze serve` on loopback.
(The static checks of the same files are in tests/unit/test_deploy_manifests.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from daemon import Daemon
from deploy_files import (
    DEPLOY,
    IMAGE_CONFIG,
    KSERVE,
    KUBERNETES,
    cluster_config,
    container_env,
    one,
    serve_args,
)
from onnx_models import write_mlp

from snoozeml.cli.main import build_parser

HEALTHCHECK = DEPLOY / "healthcheck.py"


def healthcheck(port: int) -> int:
    env = {**os.environ, "SNOOZE_HTTP_PORT": str(port)}
    return subprocess.run([sys.executable, str(HEALTHCHECK)], env=env, timeout=30,
                          check=False).returncode


def test_image_default_config_serves_no_models_and_passes_its_healthcheck() -> None:
    daemon = Daemon(IMAGE_CONFIG).start()
    try:
        assert daemon.http_port is not None
        index = httpx.post(f"{daemon.url}/v2/repository/index", timeout=10)
        assert index.status_code == 200
        assert index.json() == []
        assert healthcheck(daemon.http_port) == 0
    finally:
        daemon.stop()
    assert healthcheck(daemon.http_port) == 1  # nothing listens any more


def test_cluster_config_keeps_probes_public_and_the_rest_behind_the_secret_keys(
        tmp_path: Path) -> None:
    config = cluster_config(tmp_path)
    deployment = one("Deployment", KUBERNETES)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = container_env(container)
    env["SNOOZE_CACHE_DIR"] = str(tmp_path / "cache")  # the emptyDir, here
    daemon = Daemon(config, env=env).start()
    try:
        probes = [container[p]["httpGet"]["path"]
                  for p in ("startupProbe", "livenessProbe", "readinessProbe")]
        for path in probes:
            assert httpx.get(daemon.url + path, timeout=10).status_code == 200, path
        # The Prometheus adapter scrapes without a key (metrics_public).
        metrics = httpx.get(f"{daemon.url}/metrics", timeout=10)
        assert metrics.status_code == 200
        assert "snooze_requests_total" in metrics.text
        assert httpx.get(f"{daemon.url}/v2", timeout=10).status_code == 401
        admin_key = (tmp_path / "secrets" / "admin-key").read_text().strip()
        answer = httpx.get(f"{daemon.url}/v2", headers={"X-API-Key": admin_key}, timeout=10)
        assert answer.status_code == 200
    finally:
        daemon.stop()


def test_kserve_runtime_command_serves_the_model_folder_under_the_service_name(
        tmp_path: Path) -> None:
    runtime = one("ServingRuntime", KSERVE, "snoozeml")
    container = runtime["spec"]["containers"][0]
    isvc = one("InferenceService", KSERVE, "classifier")
    name = isvc["metadata"]["name"]
    # What KServe does: the storage initializer fills /mnt/models, and {{.Name}} becomes the
    # InferenceService's name. Here /mnt/models is a temp folder holding one .onnx file.
    mnt = tmp_path / "mnt-models"
    mnt.mkdir()
    write_mlp(mnt / "model.onnx", dims=(4, 8, 2))
    models = build_parser().parse_args(serve_args(container)).model
    assert models, "the runtime passes no --model"
    args: list[str] = []
    for template, path in models:
        local = str(path).replace("/mnt/models", str(mnt))
        args += ["--model", f"{template.replace('{{.Name}}', name)}={local}"]
    # The Daemon helper binds loopback on free ports instead of the runtime's 0.0.0.0:8080.
    daemon = Daemon(IMAGE_CONFIG, args=args, env=container_env(container)).start()
    try:
        body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                            "data": [0.1, 0.2, 0.3, 0.4]}]}
        answer = httpx.post(f"{daemon.url}/v2/models/{name}/infer", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["shape"] == [1, 2]
        ready = httpx.get(f"{daemon.url}/v2/health/ready", timeout=10)
        assert ready.status_code == 200
    finally:
        daemon.stop()


@pytest.mark.parametrize("status_port", ["not-a-port", "0"])
def test_healthcheck_fails_cleanly_on_a_bad_port(status_port: str) -> None:
    env = {**os.environ, "SNOOZE_HTTP_PORT": status_port}
    out = subprocess.run([sys.executable, str(HEALTHCHECK)], env=env, timeout=30,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 1
    assert out.stderr == ""  # no traceback in the container's health log
