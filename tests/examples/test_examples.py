"""The client examples (examples/, issue 17) run against one real daemon serving the demo models
with auth on: every example must send the API key from SNOOZE_API_KEY, and what it prints must
be what onnxruntime computes for the same inputs. Without the key, each one fails and says why.

The TypeScript packages and the Rust binary come from `make examples-deps` (the Makefile's
`examples` target runs it before these tests). An example whose toolchain this machine lacks
(tests/support/example_toolchains.py) is skipped, saying what is missing and how to get it;
under CI (CI=true) it fails instead.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon import Daemon
from example_toolchains import TOOLCHAINS, ci
from onnx_models import reference_session

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GRPCURL = Path(sys.executable).parent / "grpcurl"
TSX = EXAMPLES / "typescript/node_modules/.bin/tsx"
TSC = EXAMPLES / "typescript/node_modules/.bin/tsc"
RUST_CLIENT = EXAMPLES / "rust/target/debian/target/debug/snoozeml-client"

# The inputs every example sends.
FLOWERS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]], dtype=np.float32)
TOKENS = np.array([[i / 32 for i in range(32)]], dtype=np.float32)

METADATA_LINES = [
    "classifier input: features FP32 [-1, 4]",
    "classifier output: probabilities FP32 [-1, 3]",
    "embedder input: tokens FP32 [-1, 32]",
    "embedder output: embedding FP32 [-1, 64]",
]


@dataclass(frozen=True)
class Example:
    """One example program (its source under examples/), and the command that runs it from
    its own folder."""

    source: str
    command: tuple[str, ...]

    @property
    def folder(self) -> Path:
        return EXAMPLES / self.source.split("/")[0]


def python(script: str) -> Example:
    return Example(f"python/{script}", (sys.executable, script))


TYPESCRIPT_HTTP = Example("typescript/src/http.ts", (str(TSX), "src/http.ts"))
TYPESCRIPT_GRPC = Example("typescript/src/grpc.ts", (str(TSX), "src/grpc.ts"))
RUST = Example("rust/src/main.rs", (str(RUST_CLIENT),))
CURL_JSON = Example("curl/http_json.sh", ("./http_json.sh",))
CURL_BINARY = Example("curl/http_binary.sh", ("./http_binary.sh",))
GRPCURL_INFER = Example("grpcurl/grpc.sh", ("./grpc.sh",))
GRPCURL_HEALTH = Example("grpcurl/health.sh", ("./health.sh",))

# The programs that print the common text form (readiness, metadata, outputs).
CLIENTS = [
    python("tritonclient_http.py"),
    python("tritonclient_grpc.py"),
    python("httpx_client.py"),
    python("async_httpx.py"),
    TYPESCRIPT_HTTP,
    TYPESCRIPT_GRPC,
    RUST,
]
EVERY_EXAMPLE = [*CLIENTS, CURL_JSON, CURL_BINARY, GRPCURL_INFER, GRPCURL_HEALTH]


@dataclass(frozen=True)
class Served:
    daemon: Daemon
    api_key: str
    probabilities: np.ndarray  # onnxruntime's answers for FLOWERS
    embedding: np.ndarray  # and for TOKENS

    def env(self, *, with_key: bool = True) -> dict[str, str]:
        env = {**os.environ, "SNOOZE_URL": self.daemon.url,
               "SNOOZE_GRPC": self.daemon.grpc_address, "GRPCURL": str(GRPCURL)}
        env.pop("SNOOZE_API_KEY", None)
        if with_key:
            env["SNOOZE_API_KEY"] = self.api_key
        return env


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("demo")
    subprocess.run([sys.executable, "-m", "snoozeml.demo", str(folder)], check=True,
                   capture_output=True)
    api_key = "snz_" + secrets.token_urlsafe(32)
    digest = hashlib.sha256(api_key.encode()).hexdigest()
    config = folder / "models.toml"
    with config.open("a") as toml:
        toml.write(f'\n[auth]\napi_keys = [{{ name = "examples", role = "inference", '
                   f'sha256 = "{digest}" }}]\n')
    probabilities = reference_session(folder / "classifier.onnx").run(
        None, {"features": FLOWERS})[0]
    embedding = reference_session(folder / "embedder.onnx").run(None, {"tokens": TOKENS})[0]
    daemon = Daemon(config)
    try:
        daemon.start()
        yield Served(daemon, api_key, probabilities, embedding)
    finally:
        daemon.stop()


def require_toolchain(folder: str) -> None:
    """Skip, or under CI fail, when this machine lacks what the example in `folder` needs
    (Python and grpcurl come with .venv)."""
    toolchain = TOOLCHAINS.get(folder)
    lacking = toolchain.missing() if toolchain is not None else []
    if toolchain is None or not lacking:
        return
    reason = (f"the {folder} example needs {', '.join(lacking)}, missing here; "
              f"get it: {toolchain.get}")
    if ci():
        pytest.fail(f"{reason} (CI=true: every example must run)")
    pytest.skip(reason)


def run(example: Example, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    require_toolchain(example.folder.name)
    for needed in (TSX, RUST_CLIENT):
        if example.command[0] == str(needed) and not needed.exists():
            pytest.fail(f"{needed} is missing: run `make examples-deps` first")
    return subprocess.run(example.command, cwd=example.folder, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def succeed(example: Example, served: Served) -> str:
    done = run(example, served.env())
    assert done.returncode == 0, f"{example.source} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def numbers(line: str) -> list[float]:
    """The numbers after the label of a `label: 0.1234 0.5678 ...` line."""
    return [float(word) for word in line.split(": ", 1)[1].split()]


def lines_starting(output: str, label: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(label + ":")]


def assert_printed_outputs(output: str, served: Served) -> None:
    """The `classifier probabilities:` rows and the `embedder embedding[0:4]:` line."""
    rows = [numbers(line) for line in lines_starting(output, "classifier probabilities")]
    np.testing.assert_allclose(rows, served.probabilities, atol=1e-3)
    (embedding,) = lines_starting(output, "embedder embedding[0:4]")
    np.testing.assert_allclose(numbers(embedding), served.embedding[0, :4], atol=1e-3)


def sections(output: str) -> list[tuple[str, str]]:
    """A script's output cut at its `# step` lines: (step, the text up to the next one)."""
    parts = re.split(r"^# (.*)$", output, flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def first_json(text: str) -> Any:
    """The JSON document a section starts with (a script may print decoded lines after it)."""
    return json.JSONDecoder().raw_decode(text.strip())[0]


# --- the clients that print the common text form ------------------------------------------


@pytest.mark.parametrize("example", CLIENTS, ids=lambda example: example.source)
def test_client_prints_readiness_metadata_and_the_models_answers(
        example: Example, served: Served) -> None:
    output = succeed(example, served)

    assert "server ready: true" in output.lower().splitlines()
    for line in METADATA_LINES:
        assert line in output.splitlines(), f"{line!r} not in:\n{output}"
    assert_printed_outputs(output, served)


def test_typescript_examples_typecheck() -> None:
    require_toolchain("typescript")
    if not TSC.exists():
        pytest.fail(f"{TSC} is missing: run `make examples-deps` first")
    done = subprocess.run([str(TSC), "--noEmit"], cwd=EXAMPLES / "typescript",
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


# --- curl and grpcurl: the wire answers as they come -----------------------------------------


def test_curl_json_prints_every_answer_of_the_rest_api(served: Served) -> None:
    steps = sections(succeed(CURL_JSON, served))

    assert [step for step, _ in steps] == [
        "GET /v2/health/ready",
        "GET /v2/models/classifier", "POST /v2/models/classifier/infer",
        "GET /v2/models/embedder", "POST /v2/models/embedder/infer",
    ]
    answers = [first_json(text) for _, text in steps]
    assert answers[0] == {"ready": True}
    assert answers[1]["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 4]}]
    assert answers[3]["inputs"] == [{"name": "tokens", "datatype": "FP32", "shape": [-1, 32]}]
    for answer, expected in ((answers[2], served.probabilities), (answers[4], served.embedding)):
        (output,) = answer["outputs"]
        assert output["shape"] == list(expected.shape)
        np.testing.assert_allclose(output["data"], expected.ravel(), atol=1e-5)


def test_curl_binary_sends_and_reads_raw_float32(served: Served) -> None:
    output = succeed(CURL_BINARY, served)

    headers = [first_json(text) for _, text in sections(output)]
    sizes = [h["outputs"][0]["parameters"]["binary_data_size"] for h in headers]
    assert sizes == [2 * 3 * 4, 64 * 4]
    assert all("data" not in h["outputs"][0] for h in headers)
    assert_printed_outputs(output, served)


def test_grpcurl_calls_ready_metadata_and_infer_through_reflection(served: Served) -> None:
    output = succeed(GRPCURL_INFER, served)

    steps = sections(output)
    assert [step for step, _ in steps] == ["ServerReady", "ModelMetadata", "ModelInfer",
                                           "ModelMetadata", "ModelInfer"]
    answers = [first_json(text) for _, text in steps]
    assert answers[0] == {"ready": True}
    # protobuf's JSON writes int64 as strings
    assert answers[1]["inputs"] == [{"name": "features", "datatype": "FP32",
                                     "shape": ["-1", "4"]}]
    assert answers[3]["inputs"] == [{"name": "tokens", "datatype": "FP32",
                                     "shape": ["-1", "32"]}]
    for answer, expected in ((answers[2], served.probabilities), (answers[4], served.embedding)):
        (raw,) = answer["raw_output_contents"]
        np.testing.assert_allclose(np.frombuffer(base64.b64decode(raw), "<f4"),
                                   expected.ravel(), atol=1e-6)
    assert_printed_outputs(output, served)


def test_grpcurl_health_checks_the_server_and_each_model(served: Served) -> None:
    steps = sections(succeed(GRPCURL_HEALTH, served))

    assert [(step, first_json(text)) for step, text in steps] == [
        ('Check ""', {"status": "SERVING"}),
        ('Check "classifier"', {"status": "SERVING"}),
        ('Check "embedder"', {"status": "SERVING"}),
    ]


# --- without the key ------------------------------------------------------------------------


@pytest.mark.parametrize("example", EVERY_EXAMPLE, ids=lambda example: example.source)
def test_example_without_the_api_key_fails_and_says_why(
        example: Example, served: Served) -> None:
    done = run(example, served.env(with_key=False))

    assert done.returncode != 0, done.stdout
    said = done.stdout + done.stderr
    assert "missing credentials" in said, said
    assert "Traceback" not in said, said
