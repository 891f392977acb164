"""The deployment files under deploy/, read the way the cluster and the image read them.

`effective_server` answers "what will the daemon in this container listen on, drain for,
budget": the container's args (or the image's CMD when it sets none) through the real
`snooze serve` argument parser, its SNOOZE_* variables and config file through the real
`load_config`, flags over variables over file, as `snooze serve` applies them.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from snoozeml.cli.main import build_parser
from snoozeml.config.settings import ServerConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
KSERVE = DEPLOY / "kserve"
CONTAINERFILE = DEPLOY / "Containerfile"
IMAGE_CONFIG = DEPLOY / "models.toml"  # COPY'd to the CMD's -c path in the image
CLUSTER_CONFIG = KUBERNETES / "models.toml"  # the ConfigMap the Deployment mounts


def yaml_files() -> list[Path]:
    return sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])


def documents(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def find(kind: str, folder: Path, name: str | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Every document of `kind` (and `name`) in the YAML files of `folder`."""
    found = []
    for path in sorted(folder.glob("*.yaml")):
        for doc in documents(path):
            if doc.get("kind") == kind and (name is None or doc["metadata"]["name"] == name):
                found.append((path, doc))
    return found


def one(kind: str, folder: Path, name: str | None = None) -> dict[str, Any]:
    found = find(kind, folder, name)
    assert len(found) == 1, f"expected one {kind} {name or ''} in {folder}, found {len(found)}"
    return found[0][1]


# --- the Containerfile ---------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str
    line: int


def containerfile(path: Path = CONTAINERFILE) -> list[Instruction]:
    """The instructions, with continuation lines joined and comments dropped."""
    instructions: list[Instruction] = []
    pending = ""
    start = 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = pending + line
        pending = ""
        keyword, _, value = text.partition(" ")
        instructions.append(Instruction(keyword.upper(), value.strip(), start))
    assert not pending, f"{path}: the last instruction ends with a backslash"
    return instructions


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    starts = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    assert starts, "no FROM"
    return instructions[starts[-1]:]


def exec_form(value: str) -> list[str]:
    """A JSON-array (exec form) CMD/ENTRYPOINT/HEALTHCHECK CMD; shell form is refused."""
    parsed = json.loads(value)
    assert isinstance(parsed, list), value
    assert all(isinstance(part, str) for part in parsed), value
    return parsed


def image_command() -> list[str]:
    """What the image runs with no args from the cluster: ENTRYPOINT + CMD."""
    stage = final_stage(containerfile())
    entrypoint = [exec_form(i.value) for i in stage if i.keyword == "ENTRYPOINT"]
    cmd = [exec_form(i.value) for i in stage if i.keyword == "CMD"]
    assert entrypoint, "the image needs an ENTRYPOINT"
    assert cmd, "the image needs a CMD"
    return [*entrypoint[-1], *cmd[-1]]


def copy_sources(instructions: list[Instruction]) -> list[tuple[str, str]]:
    """(source, destination) of every COPY/ADD from the build context (not --from=...)."""
    pairs = []
    for ins in instructions:
        if ins.keyword not in ("COPY", "ADD"):
            continue
        parts = shlex.split(ins.value)
        if any(p.startswith("--from") for p in parts):
            continue
        parts = [p for p in parts if not p.startswith("--")]
        pairs.extend((source, parts[-1]) for source in parts[:-1])
    return pairs


# --- what the daemon in a container does ---------------------------------------------------


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's literal variables (valueFrom ones are left out)."""
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def serve_args(container: dict[str, Any]) -> list[str]:
    """The `snooze` arguments the container runs: its command/args over the image's."""
    image = image_command()
    assert "command" not in container, "keep the image's ENTRYPOINT (snooze)"
    args = container.get("args")
    return [str(a) for a in args] if args is not None else image[1:]


def effective_server(container: dict[str, Any], config_file: Path) -> ServerConfig:
    """The [server] settings the daemon in `container` runs with, reading `config_file` as the
    file its -c names."""
    args = build_parser().parse_args(serve_args(container))
    assert args.command == "serve", args
    config = load_config(config_file, environ=container_env(container), gpus=[])
    flags = {"host": args.host, "http_port": args.http_port, "grpc_port": args.grpc_port,
             "log_level": args.log_level}
    return config.server.model_copy(
        update={key: value for key, value in flags.items() if value is not None})


def cluster_config(directory: Path) -> Path:
    """deploy/kubernetes/models.toml, written into `directory` with the Secret's files beside
    it: the Deployment's Secret mount path is replaced by a folder holding one random value
    per key of secret.example.yaml, as the kubelet would project them."""
    deployment = one("Deployment", KUBERNETES)
    pod = deployment["spec"]["template"]["spec"]
    secret_volumes = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    container = pod["containers"][0]
    mounts = [m for m in container["volumeMounts"] if m["name"] in secret_volumes]
    assert len(mounts) == 1, "expected one Secret mounted into the container"
    secret = one("Secret", KUBERNETES, secret_volumes[mounts[0]["name"]])
    folder = directory / "secrets"
    folder.mkdir()
    for key in secret["stringData"]:
        (folder / key).write_text(secrets.token_urlsafe(48) + "\n")
    text = CLUSTER_CONFIG.read_text(encoding="utf-8")
    mount = mounts[0]["mountPath"].rstrip("/")
    assert mount + "/" in text, f"models.toml names no file under the Secret's mount {mount}"
    path = directory / "models.toml"
    path.write_text(text.replace(mount + "/", str(folder) + "/"), encoding="utf-8")
    return path


# --- Kubernetes values ---------------------------------------------------------------------

_QUANTITY = re.compile(r"^([0-9.]+)([KMGTPE]i?|[mk]?)$")
_FACTORS = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
            "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
            "Ei": 2**60, "m": 1e-3}


def quantity(value: str | int) -> float:
    """A Kubernetes resource quantity ("4Gi", "500m", "2") as a number."""
    match = _QUANTITY.match(str(value))
    assert match, f"not a quantity: {value!r}"
    return float(match.group(1)) * _FACTORS[match.group(2)]


def endpoint_port(endpoint: str) -> int:
    """A ServingRuntime endpoint, "port:8085", as its port."""
    match = re.fullmatch(r"port:(\d+)", endpoint)
    assert match, f"expected port:N, got {endpoint!r}"
    return int(match.group(1))
