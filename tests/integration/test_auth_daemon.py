"""Authentication and roles against the real daemon, on HTTP and gRPC alike (issue 12).

Every operation of the operation table is called over every route and RPC that reaches it, by
every role and by nobody, with API keys and with JWTs; each answer must be what the role table
(auth/authenticator.py) says. Then the refusals: each bad credential on both transports; then auth
off,
where everything stays open; then real clients (tritonclient) passing headers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import jwt
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from daemon import Daemon
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from onnx_models import write_mlp
from snooze_command import new_key

from snoozeml.auth.authenticator import required_role
from snoozeml.operations import OPERATIONS, Operation
from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc
from snoozeml.proto import model_runtime_pb2 as mm
from snoozeml.proto import model_runtime_pb2_grpc as mm_grpc

SECRET = "0123456789abcdef0123456789abcdef-test-secret"
ROLES = ("readonly", "inference", "admin")
RANK = {None: -1, "readonly": 0, "inference": 1, "admin": 2}
ISSUER = "https://issuer.example"
AUDIENCE = "snoozeml"


class Keys:
    def __init__(self, folder: Path) -> None:
        self.api: dict[str, str] = {}
        entries = []
        for role in ROLES:
            key, entry = new_key(role, f"{role}-key")
            self.api[role] = key
            entries.append(entry)
        self.entries = ",\n    ".join(entries)
        self.rsa = {kid: rsa.generate_private_key(public_exponent=65537, key_size=2048)
                    for kid in ("a", "b")}
        jwks = {"keys": []}
        for kid, private in self.rsa.items():
            public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
            jwks["keys"].append({**public, "kid": kid, "alg": "RS256", "use": "sig"})
        self.jwks = folder / "jwks.json"
        self.jwks.write_text(json.dumps(jwks))

    def token(self, role: object = "inference", *, alg: str = "HS256", kid: str = "a",
              **claims: Any) -> str:
        now = int(time.time())
        payload: dict[str, Any] = {"sub": "tester", "iat": now, "exp": now + 600,
                                   "iss": ISSUER, "aud": AUDIENCE}
        if role is not None:
            payload["role"] = role
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not None}
        if alg == "HS256":
            return jwt.encode(payload, SECRET, algorithm="HS256")
        return jwt.encode(payload, self.rsa[kid], algorithm=alg, headers={"kid": kid})


def auth_config(keys: Keys, model: Path, spare: Path) -> str:
    return f"""
[server]
# Room for a credential longer than auth's own 16 KiB, so that auth refuses it (401), not
# the header limit (431) or gRPC's metadata limit (RESOURCE_EXHAUSTED).
max_header_size = "256KiB"
grpc_max_metadata_size = "256KiB"
modelmesh_port = 0

[auth]
api_keys = [
    {keys.entries},
]
[auth.jwt]
algorithms = ["HS256", "RS256"]
secret_env = "SNOOZE_JWT_SECRET"
jwks_file = "{keys.jwks}"
issuer = "{ISSUER}"
audience = "{AUDIENCE}"
leeway = "1s"

[[models]]
name = "mlp"
path = "{model}"

[[models]]
name = "spare"
path = "{spare}"
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Keys, Path, Path]:
    folder = tmp_path_factory.mktemp("auth")
    return (Keys(folder), write_mlp(folder / "mlp.onnx", dims=(4, 8, 2)),
            write_mlp(folder / "spare.onnx", dims=(4, 8, 2)))


@pytest.fixture(scope="module")
def daemon(module_serve: Any, files: tuple[Keys, Path, Path]) -> Daemon:
    keys, model, spare = files
    return module_serve(auth_config(keys, model, spare), env={"SNOOZE_JWT_SECRET": SECRET})


@pytest.fixture(scope="module")
def keys(files: tuple[Keys, Path, Path]) -> Keys:
    return files[0]


@pytest.fixture(scope="module")
def channel(daemon: Daemon) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(daemon.grpc_address) as channel:
        yield channel


# --- every operation, every route and RPC, every role ----------------------------------------

X = [[1.0, 2.0, 3.0, 4.0]]
INFER_JSON = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X}]}


def http_calls() -> list[tuple[Operation, str, str]]:
    calls = []
    for operation, spec in OPERATIONS.items():
        for method, route in spec.http:
            model = "spare" if operation in (Operation.REPOSITORY_LOAD,
                                             Operation.REPOSITORY_UNLOAD) else "mlp"
            calls.append((operation, method,
                          route.replace("{name}", model).replace("{version}", "1")))
    return calls


REFUSAL_KEYS = {Operation.RERANK: {"message", "detail"},
                Operation.TEI_RERANK: {"error", "error_type"}}


def http_status(client: httpx.Client, method: str, path: str, headers: dict[str, str],
                operation: Operation) -> int:
    body = INFER_JSON if operation is Operation.INFER else None
    response = client.request(method, path, json=body, headers=headers)
    if response.status_code == 401:
        assert response.headers["www-authenticate"].startswith("Bearer"), response.headers
    if response.status_code in (401, 403):
        # Each API's own error shape: OIP's and OpenAI's {"error": ...}, Cohere's (and Jina's)
        # {"message", "detail"}, TEI's {"error", "error_type"}.
        assert set(response.json()) == REFUSAL_KEYS.get(operation, {"error"})
    return response.status_code


def grpc_call(channel: grpc.Channel, method: str, metadata: list[tuple[str, str]]) -> None:
    """Call `method` once; raises grpc.RpcError when refused."""
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    name = method.rsplit("/", 1)[1]
    if method.startswith("/grpc.health"):
        health = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="")
        if name == "Check":
            health.Check(request, metadata=metadata, timeout=10)
        else:
            stream = health.Watch(request, metadata=metadata, timeout=10)
            next(iter(stream))
            stream.cancel()
        return
    if method.startswith("/grpc.reflection"):
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
            metadata=metadata, timeout=10)
        next(iter(replies))
        return
    model = "spare" if "Repository" in name and name != "RepositoryIndex" else "mlp"
    requests: dict[str, Any] = {
        "ServerLive": pb.ServerLiveRequest(),
        "ServerReady": pb.ServerReadyRequest(),
        "ServerMetadata": pb.ServerMetadataRequest(),
        "ModelMetadata": pb.ModelMetadataRequest(name=model),
        "ModelReady": pb.ModelReadyRequest(name=model),
        "ModelInfer": pb.ModelInferRequest(model_name=model, inputs=[
            pb.ModelInferRequest.InferInputTensor(
                name="x", datatype="FP32", shape=[1, 4],
                contents=pb.InferTensorContents(fp32_contents=X[0]))]),
        "RepositoryIndex": pb.RepositoryIndexRequest(),
        "RepositoryModelLoad": pb.RepositoryModelLoadRequest(model_name=model),
        "RepositoryModelUnload": pb.RepositoryModelUnloadRequest(model_name=model),
        "ModelStatistics": pb.ModelStatisticsRequest(name=model),
    }
    getattr(stub, name)(requests[name], metadata=metadata, timeout=30)


def grpc_calls() -> list[tuple[Operation, str]]:
    """The RPCs of the OIP port (ModelMesh's SPI has its own, without credentials)."""
    return [(operation, method) for operation, spec in OPERATIONS.items()
            for method in spec.grpc if not method.startswith("/mmesh.")]


def credentials(keys: Keys, role: str | None, kind: str) -> tuple[str | None, str | None]:
    """(Authorization, X-API-Key) for `role` with an API key or a JWT; none for no role."""
    if role is None:
        return None, None
    if kind == "api_key":
        return None, keys.api[role]
    if kind == "bearer_key":
        return f"Bearer {keys.api[role]}", None
    return f"Bearer {keys.token(role, alg='RS256' if kind == 'jwt_rs' else 'HS256')}", None


KINDS = ("api_key", "bearer_key", "jwt_hs", "jwt_rs")


def expected_status(operation: Operation, role: str | None) -> int | None:
    """401 or 403 when refused; None when the operation's own answer is expected."""
    needed = required_role(operation)
    if needed is None:
        return None
    if role is None:
        return 401
    return None if RANK[role] >= RANK[needed] else 403


@pytest.mark.parametrize(("operation", "method", "path"), http_calls(),
                         ids=lambda v: v.value if isinstance(v, Operation) else str(v))
def test_every_http_route_answers_each_role_as_the_table_says(
    daemon: Daemon, keys: Keys, operation: Operation, method: str, path: str
) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        for role in (None, *ROLES):
            for kind in KINDS:
                authorization, api_key = credentials(keys, role, kind)
                headers = {}
                if authorization is not None:
                    headers["Authorization"] = authorization
                if api_key is not None:
                    headers["X-API-Key"] = api_key
                status = http_status(client, method, path, headers, operation)
                wanted = expected_status(operation, role)
                if wanted is None:
                    assert status not in (401, 403), (role, kind, status)
                    assert status < 500, (role, kind, status)
                else:
                    assert status == wanted, (role, kind, status)


@pytest.mark.parametrize(("operation", "method"), grpc_calls(),
                         ids=lambda v: v.value if isinstance(v, Operation) else str(v))
def test_every_rpc_answers_each_role_as_the_table_says(
    channel: grpc.Channel, keys: Keys, operation: Operation, method: str
) -> None:
    codes = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED}
    for role in (None, *ROLES):
        for kind in KINDS:
            authorization, api_key = credentials(keys, role, kind)
            metadata = []
            if authorization is not None:
                metadata.append(("authorization", authorization))
            if api_key is not None:
                metadata.append(("x-api-key", api_key))
            wanted = expected_status(operation, role)
            if wanted is None:
                grpc_call(channel, method, metadata)  # answered, not refused
                continue
            with pytest.raises(grpc.RpcError) as refused:
                grpc_call(channel, method, metadata)
            assert refused.value.code() == codes[wanted], (role, kind, refused.value.details())


def test_modelmesh_spi_needs_no_credentials_but_inference_on_its_models_does(
    daemon: Daemon, channel: grpc.Channel, keys: Keys, files: tuple[Keys, Path, Path],
) -> None:
    _, model, _ = files
    with grpc.insecure_channel(f"127.0.0.1:{daemon.modelmesh_port}") as spi_channel:
        spi = mm_grpc.ModelRuntimeStub(spi_channel)
        assert spi.runtimeStatus(mm.RuntimeStatusRequest()).status == \
            mm.RuntimeStatusResponse.READY
        spi.loadModel(mm.LoadModelRequest(modelId="meshed", modelPath=str(model)))
        assert spi.modelSize(mm.ModelSizeRequest(modelId="meshed")).sizeInBytes > 0
        request = pb.ModelInferRequest(inputs=[pb.ModelInferRequest.InferInputTensor(
            name="x", datatype="FP32", shape=[1, 4],
            contents=pb.InferTensorContents(fp32_contents=X[0]))])
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        routed = [("mm-model-id", "meshed")]
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, metadata=routed, timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = stub.ModelInfer(request, timeout=30, metadata=[
            *routed, ("x-api-key", keys.api["inference"])])
        assert reply.model_name == "meshed"
        spi.unloadModel(mm.UnloadModelRequest(modelId="meshed"))
    # The SPI is not served on the OIP port.
    with pytest.raises(grpc.RpcError) as missing:
        mm_grpc.ModelRuntimeStub(channel).runtimeStatus(
            mm.RuntimeStatusRequest(), metadata=[("x-api-key", keys.api["admin"])])
    assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_every_operation_has_a_role_or_is_public() -> None:
    for operation in Operation:
        assert required_role(operation) in (None, *ROLES), operation
    public = {op for op in Operation if required_role(op) is None}
    assert public == {Operation.SERVER_LIVE, Operation.SERVER_READY, Operation.HEALTH}


# --- refusals -------------------------------------------------------------------------------


def _none_token() -> str:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    now = int(time.time())
    return part({"alg": "none", "typ": "JWT"}) + "." + part(
        {"role": "admin", "exp": now + 600, "iss": ISSUER, "aud": AUDIENCE}) + "."


def bad_credentials(keys: Keys) -> dict[str, tuple[dict[str, str], int, str]]:
    """Each bad credential: its headers, the status it gets, and the error's words."""
    key = keys.api["inference"]
    off_by_one = key[:-1] + ("A" if key[-1] != "A" else "B")
    now = int(time.time())
    public_pem = keys.rsa["a"].public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    confused = jwt.encode({"role": "admin", "exp": now + 600, "iss": ISSUER, "aud": AUDIENCE},
                          "placeholder-secret-only-to-build-the-header-and-body", algorithm="HS256")
    # HS256 signed with the RSA public key as the secret (PyJWT refuses to do it itself).
    head, body, _ = confused.split(".")
    import hmac as hmac_module
    signature = hmac_module.new(public_pem, f"{head}.{body}".encode(), hashlib.sha256).digest()
    confused = f"{head}.{body}." + base64.urlsafe_b64encode(signature).rstrip(b"=").decode()
    bearer = "Authorization"
    return {
        "no credentials": ({}, 401, "missing credentials"),
        "an unknown key": ({"X-API-Key": "snz_" + "x" * 43}, 401, "invalid credentials"),
        "a key one character off": ({"X-API-Key": off_by_one}, 401, "invalid credentials"),
        "an empty bearer": ({bearer: "Bearer"}, 401, "invalid credentials"),
        "a malformed header": ({bearer: f"Basic {key}"}, 401, "invalid credentials"),
        "an expired token": ({bearer: "Bearer " + keys.token(exp=now - 60, iat=now - 120)},
                             401, "expired credentials"),
        "a token not yet valid": ({bearer: "Bearer " + keys.token(nbf=now + 600)}, 401,
                                  "invalid credentials"),
        "a wrong signature": ({bearer: "Bearer " + keys.token()[:-4] + "AAAA"}, 401,
                              "invalid credentials"),
        "a wrong issuer": ({bearer: "Bearer " + keys.token(iss="https://evil.example")}, 401,
                           "invalid credentials"),
        "a wrong audience": ({bearer: "Bearer " + keys.token(aud="someone-else")}, 401,
                             "invalid credentials"),
        "alg none": ({bearer: "Bearer " + _none_token()}, 401, "invalid credentials"),
        "RS/HS confusion": ({bearer: "Bearer " + confused}, 401, "invalid credentials"),
        "an unknown kid": ({bearer: "Bearer " + jwt.encode(
            {"role": "admin", "exp": now + 600, "iss": ISSUER, "aud": AUDIENCE},
            keys.rsa["a"], algorithm="RS256", headers={"kid": "zz"})}, 401,
            "invalid credentials"),
        "a token without exp": ({bearer: "Bearer " + keys.token(exp=None)}, 401,
                                "invalid credentials"),
        "a role claim missing": ({bearer: "Bearer " + keys.token(role=None)}, 403,
                                 "no known role"),
        "a role unknown": ({bearer: "Bearer " + keys.token(role="root")}, 403,
                           "no known role"),
        "a token of 100 KB": ({bearer: "Bearer " + keys.token(padding="p" * 100_000)}, 401,
                              "invalid credentials"),
        "a role too low": ({"X-API-Key": keys.api["readonly"]}, 403, "permission denied"),
    }


def test_each_bad_credential_is_refused_on_http(daemon: Daemon, keys: Keys) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        for case, (headers, status, words) in bad_credentials(keys).items():
            response = client.post("/v2/models/mlp/infer", json=INFER_JSON, headers=headers)
            assert response.status_code == status, (case, response.text)
            assert words in response.json()["error"], (case, response.text)
            if status == 401:
                assert response.headers["www-authenticate"].startswith("Bearer"), case


def test_each_bad_credential_is_refused_on_grpc(channel: grpc.Channel, keys: Keys) -> None:
    codes = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED}
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    request = pb.ModelInferRequest(model_name="mlp", inputs=[
        pb.ModelInferRequest.InferInputTensor(
            name="x", datatype="FP32", shape=[1, 4],
            contents=pb.InferTensorContents(fp32_contents=X[0]))])
    for case, (headers, status, words) in bad_credentials(keys).items():
        metadata = [(name.lower(), value) for name, value in headers.items()]
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, metadata=metadata, timeout=30)
        assert refused.value.code() == codes[status], (case, refused.value.details())
        assert words in (refused.value.details() or ""), case


def test_refusals_are_logged_without_the_credential(daemon: Daemon, keys: Keys) -> None:
    mark = daemon.mark()
    token = keys.token("readonly")
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        client.post("/v2/repository/models/spare/load",
                    headers={"X-API-Key": keys.api["inference"]})
        client.post("/v2/models/mlp/infer", json=INFER_JSON,
                    headers={"Authorization": f"Bearer {token}"})
        client.get("/v2", headers={"X-API-Key": "snz_wrong"})
    first = daemon.wait_for_log(r"auth_refused operation=repository_load", start=mark)
    assert "principal=inference-key" in first
    assert "status=403" in first
    second = daemon.wait_for_log(r"auth_refused operation=infer", start=mark)
    assert "principal=tester" in second
    daemon.wait_for_log(r"auth_refused operation=server_metadata .*invalid credentials",
                        start=mark)
    log = "\n".join(daemon.lines[mark:])
    for secret in (*keys.api.values(), token, "snz_wrong", SECRET):
        assert secret not in log


# --- auth off, and real clients ---------------------------------------------------------------


def test_with_auth_off_every_operation_stays_open(
    module_serve: Any, files: tuple[Keys, Path, Path]
) -> None:
    keys, model, spare = files
    daemon = module_serve(auth_config(keys, model, spare).replace(
        "[auth]\n", "[auth]\nenabled = false\n"), env={"SNOOZE_JWT_SECRET": SECRET})
    assert "auth_disabled" in daemon.wait_for_log(r"auth_disabled")
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        for operation, method, path in http_calls():
            status = http_status(client, method, path, {}, operation)
            assert status not in (401, 403), (operation, path, status)
            assert status < 500, (operation, path, status)
    with grpc.insecure_channel(daemon.grpc_address) as channel:
        for _, method in grpc_calls():
            grpc_call(channel, method, [])


def test_tritonclient_passes_a_key_and_a_token(daemon: Daemon, keys: Keys) -> None:
    x = np.array(X, np.float32)
    headers_for: dict[str, Callable[[], dict[str, str]]] = {
        "key": lambda: {"x-api-key": keys.api["inference"]},
        "token": lambda: {"authorization": f"Bearer {keys.token('inference')}"},
    }
    http = triton_http.InferenceServerClient(f"127.0.0.1:{daemon.http_port}")
    grpc_client = triton_grpc.InferenceServerClient(daemon.grpc_address)
    try:
        for headers in (make() for make in headers_for.values()):
            http_in = triton_http.InferInput("x", [1, 4], "FP32")
            http_in.set_data_from_numpy(x)
            # (tritonclient's HTTP client writes its own headers into the dict it is given.)
            answer = http.infer("mlp", [http_in], headers=dict(headers))
            assert answer.as_numpy("y").shape == (1, 2)
            grpc_in = triton_grpc.InferInput("x", [1, 4], "FP32")
            grpc_in.set_data_from_numpy(x)
            answer = grpc_client.infer("mlp", [grpc_in], headers=dict(headers))
            assert answer.as_numpy("y").shape == (1, 2)
        with pytest.raises(Exception, match="missing credentials"):
            http.infer("mlp", [http_in])
    finally:
        http.close()
        grpc_client.close()


def test_a_bad_auth_config_stops_the_daemon_with_the_key_and_line(tmp_path: Path) -> None:
    config = tmp_path / "models.toml"
    config.write_text("""
[auth]
api_keys = [{ name = "ci", role = "root", key_file = "nowhere.key" }]
[auth.jwt]
algorithms = ["HS256", "XS1"]
secret_env = "SNOOZE_TEST_UNSET_SECRET"
""")
    done = subprocess.run(
        [sys.executable, "-m", "snoozeml", "serve", "-c", str(config), "--http-port", "0",
         "--grpc-port", "0"], capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "SNOOZE_TEST_UNSET_SECRET"})
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert f"snooze: {config}:3: auth.api_keys[0].role: Input should be 'readonly', " \
        "'inference' or 'admin'" in lines
    assert any(line.startswith(f"snooze: {config}:3: auth.api_keys[0].key_file: cannot read ")
               for line in lines), lines
    assert any(line.startswith(f"snooze: {config}:5: auth.jwt.algorithms[1]: Input should be")
               for line in lines), lines
    assert f"snooze: {config}:6: auth.jwt.secret_env: environment variable " \
        "SNOOZE_TEST_UNSET_SECRET is not set" in lines
    assert "server_started" not in done.stdout + done.stderr
