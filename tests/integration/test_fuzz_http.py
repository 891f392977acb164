"""The HTTP API fuzzed from its own OpenAPI document (issue 15): schemathesis's `st run` against
the real daemon, with auth on, one tiny model per OIP datatype and a broken one.

Two campaigns, each running schemathesis's examples, coverage and fuzzing phases on every
operation (`FUZZ_EXAMPLES` generated cases each, derandomized: the same cases on every
`make test`):

- the document as served, valid and invalid data, every check but `positive_data_acceptance`
  (the document cannot say which tensors a model takes). Path parameters are drawn from the
  real models (and "nope"), so metadata, ready, load, unload, statistics and inference all
  reach them.
- inference only, one operation per model, its body narrowed to what that model takes, in
  JSON and in the binary tensor extension: every valid request must be answered 200
  (`positive_data_acceptance`), with outputs that add up; `make fuzz` adds invalid ones.

Every answer must be documented (status, headers, content type, body schema) and no 5xx but
the documented 503s (tests/support/fuzz_http_hooks.py); afterwards the daemon still serves
and its log holds no fault. `make fuzz` sets `SNOOZE_FUZZ_EXAMPLES`
(tests/support/fuzz_strategies.py): that many times the examples, on fresh random cases (each
campaign prints its seed), three campaigns at once.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from daemon import Daemon
from fuzz_http_hooks import BINARY_FORM
from fuzz_strategies import BROKEN, KINDS, MODELS, SCALE, assert_alive, log_problems, write_models

KEY = "snz_fuzz-admin-key"
AUTH = {"X-API-Key": KEY}
HOOKS = Path(__file__).parents[1] / "support" / "fuzz_http_hooks.py"
FUZZ_EXAMPLES = max(1, int(10 * SCALE))


@pytest.fixture(scope="module")
def daemon(module_serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    folder = tmp_path_factory.mktemp("fuzz_http")
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    config = write_models(folder) + (
        f'\n\n[auth]\napi_keys = [{{ name = "fuzz", role = "admin", sha256 = "{digest}" }}]\n')
    return module_serve(config, directory=folder)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def log_start(daemon: Daemon) -> int:
    return daemon.mark()


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, headers=AUTH, timeout=60) as http:
        yield http


@pytest.fixture(scope="module")
def document(client: httpx.Client) -> dict[str, Any]:
    response = client.get("/openapi.json")
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


# `make fuzz` runs this many campaigns side by side, each on fresh random cases: concurrent
# requests, loads and unloads racing inference (processes: schemathesis's worker threads are
# not safe with its coverage phase).
PARALLEL = 1 if SCALE <= 1 else 3
# Seconds a campaign may take (pyproject's 300 is too little for `make fuzz`'s).
CAMPAIGN_TIMEOUT = int(240 + 90 * max(SCALE, 1))


def schemathesis_run(daemon: Daemon, document: dict[str, Any], folder: Path,
                     *options: str) -> list[dict[str, Any]]:
    """`st run` of `document` against the daemon (`PARALLEL` of them at once); their JSON
    reports. Fails with the output (each failure with a curl command that reproduces it) when
    a check failed."""
    (folder / "openapi.json").write_text(json.dumps(document))
    runs = []
    for index in range(PARALLEL):
        if SCALE <= 1:  # make test: the same cases every time
            campaign = ["--generation-deterministic"]
        else:
            campaign = ["--seed", str(random.randrange(2**32)), "--generation-database", "none"]
        command = [
            sys.executable, "-m", "schemathesis.cli", "run", "openapi.json", "--url", daemon.url,
            "-H", f"X-API-Key: {KEY}", "--generation-with-security-parameters", "false",
            "--phases", "examples,coverage,fuzzing", "--max-examples", str(FUZZ_EXAMPLES),
            *campaign, "--workers", "1", "--request-timeout", "60", "--no-color",
            "--report", "json", "--report-json-path", f"report{index}.json", *options,
        ]
        env = {**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)}
        runs.append(subprocess.Popen(command, cwd=folder, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        outputs = [run.communicate(timeout=CAMPAIGN_TIMEOUT - 30)[0] for run in runs]
    finally:
        for run in runs:  # a campaign cut off must not go on after the test
            run.kill()
            run.wait()
    reports = []
    for index, (run, output) in enumerate(zip(runs, outputs, strict=True)):
        print(output[-3000:])
        assert run.returncode == 0, output
        report: dict[str, Any] = json.loads((folder / f"report{index}.json").read_text())
        operations = report["operations"]
        assert operations["tested"] == operations["total"], operations
        reports.append(report)
    cases = sum(report["test_cases"]["generated"] for report in reports)
    print(f"fuzz_http: {cases} cases on {len(reports)} x {operations['total']} operations")
    return reports


# --- the document as served ----------------------------------------------------------------


@pytest.mark.timeout(CAMPAIGN_TIMEOUT)
def test_every_answer_to_fuzzed_requests_is_documented(
    daemon: Daemon, document: dict[str, Any], log_start: int, tmp_path: Path,
) -> None:
    document = copy.deepcopy(document)
    for item in document["paths"].values():
        for parameter in item.get("parameters", []):
            if parameter["name"] == "name":
                parameter["schema"] = {"enum": [*sorted(MODELS), BROKEN, "nope"]}
            elif parameter["name"] == "version":
                parameter["schema"] = {"enum": ["1", "2"]}
    reports = schemathesis_run(
        daemon, document, tmp_path, "--checks", "all",
        "--exclude-checks", "not_a_server_error,positive_data_acceptance")
    assert all(report["test_cases"]["generated"] > 0 for report in reports)


# --- inference, narrowed to each model ------------------------------------------------------

# Values a JSON body can carry that the datatype holds: every one must be accepted.
_FLOAT_MAX = {"FP16": 65504.0, "FP32": float(np.finfo(np.float32).max), "FP64": 1.7e308}


def _json_element(datatype: str) -> dict[str, Any]:
    if datatype == "BOOL":
        return {"type": "boolean"}
    if datatype == "BYTES":
        return {"type": "string"}
    if datatype in _FLOAT_MAX:
        bound = _FLOAT_MAX[datatype]
        return {"type": "number", "minimum": -bound, "maximum": bound}
    info = np.iinfo(np.dtype(KINDS[datatype].wire))
    return {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)}


def _raw_element(datatype: str) -> tuple[dict[str, Any], int]:
    """What the binary form generates per element: its bytes (how many), or a BYTES string."""
    if datatype == "BYTES":
        return {"type": "string"}, 1
    if datatype == "BOOL":
        return {"type": "integer", "minimum": 0, "maximum": 1}, 1
    size = np.dtype(KINDS[datatype].wire).itemsize
    return {"type": "integer", "minimum": 0, "maximum": 255}, size


def _tensor(spec: dict[str, Any], binary: bool) -> dict[str, Any]:
    """The input `spec` (model metadata) as a schema: 0-3 rows for its -1 dimension, and
    exactly the elements (or, binary, the bytes) that shape holds."""
    variants = []
    for rows in range(4):
        shape = [rows if d == -1 else d for d in spec["shape"]]
        if binary:
            item, per_element = _raw_element(spec["datatype"])
            field, count = "raw", math.prod(shape) * per_element
        else:
            item, field, count = _json_element(spec["datatype"]), "data", math.prod(shape)
        variants.append({
            "type": "object", "required": ["name", "shape", "datatype", field],
            "properties": {"name": {"enum": [spec["name"]]}, "shape": {"enum": [shape]},
                           "datatype": {"enum": [spec["datatype"]]},
                           field: {"type": "array", "items": item, "minItems": count,
                                   "maxItems": count}},
        })
    return {"anyOf": variants}


def _infer_body(meta: dict[str, Any], binary: bool) -> dict[str, Any]:
    outputs = [spec["name"] for spec in meta["outputs"]]
    return {
        "type": "object", "required": ["inputs"],
        "properties": {
            "id": {"type": "string"},
            "parameters": {"type": "object", "properties": {
                "binary_data_output": {"type": "boolean"},
                "timeout": {"type": "integer", "minimum": 0, "maximum": 2**64 - 1}}},
            "inputs": {"type": "array", "minItems": len(meta["inputs"]),
                       "maxItems": len(meta["inputs"]),
                       "items": {"anyOf": [_tensor(spec, binary) for spec in meta["inputs"]]}},
            "outputs": {"type": "array", "maxItems": len(outputs), "items": {
                "type": "object", "required": ["name"], "properties": {
                    "name": {"enum": outputs},
                    "parameters": {"type": "object",
                                   "properties": {"binary_data": {"type": "boolean"}}}}}},
        },
    }


@pytest.mark.timeout(CAMPAIGN_TIMEOUT)
def test_every_request_a_model_takes_is_answered_with_its_outputs(
    daemon: Daemon, client: httpx.Client, document: dict[str, Any], log_start: int,
    tmp_path: Path,
) -> None:
    template = document["paths"]["/v2/models/{name}/infer"]["post"]
    paths = {}
    for name, datatype in sorted(MODELS.items()):
        meta = client.get(f"/v2/models/{name}").json()
        forms = {"application/json": _infer_body(meta, binary=False),
                 BINARY_FORM: _infer_body(meta, binary=True)}
        if datatype == "BF16":  # no JSON form
            del forms["application/json"]
        operation = {**template, "operationId": f"infer_{name}", "parameters": [],
                     "requestBody": {"required": True, "content": {
                         media: {"schema": body} for media, body in forms.items()}}}
        paths[f"/v2/models/{name}/infer"] = {"post": operation}
    # `make fuzz` adds invalid cases (thousands of near misses: no 5xx, documented answers),
    # which a narrowed schema cannot expect refused: nested `data` of the right size is fine.
    reports = schemathesis_run(
        daemon, {**document, "paths": paths}, tmp_path, "--mode",
        "positive" if SCALE <= 1 else "all",
        "--checks", "all", "--exclude-checks", "not_a_server_error,negative_data_rejection")
    assert all(report["test_cases"]["generated"] > 0 for report in reports)


# --- what the campaigns found, each with the exact request -------------------------------------


def test_an_integer_written_with_a_fraction_is_refused_as_the_3_0_document_says(
    client: httpx.Client, document: dict[str, Any],
) -> None:
    # The first campaign's document was OpenAPI 3.1, whose `integer` admits 191.0: its
    # `positive_data_acceptance` found this request refused. The daemon takes integers as
    # Triton does, so the document is 3.0, whose `integer` is written without a fraction.
    assert document["openapi"].startswith("3.0.")
    body = {"inputs": [{"name": "x", "shape": [3, 2], "datatype": "UINT8",
                        "data": [191.0, 19, 255, 201, 174.0, 247]}]}
    response = client.post("/v2/models/dt_uint8/infer", json=body)
    assert (response.status_code, response.json()) == (
        400, {"error": "input 'x': data for UINT8 must be integers"})
    body["inputs"][0]["data"] = [191, 19, 255, 201, 174, 247]
    assert client.post("/v2/models/dt_uint8/infer", json=body).status_code == 200


def test_a_timeout_is_taken_up_to_the_largest_64_bit_integer_as_documented(
    client: httpx.Client, document: dict[str, Any],
) -> None:
    # Past 2**64 - 1 a JSON integer reaches the daemon as a float (orjson), so it is refused.
    timeout = document["components"]["schemas"]["InferRequest"]["properties"]["parameters"][
        "properties"]["timeout"]
    assert timeout["maximum"] == 2**64 - 1
    body: dict[str, Any] = {
        "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}],
        "parameters": {"timeout": 2**64 - 1}}
    assert client.post("/v2/models/dt_fp32/infer", json=body).status_code == 200
    body["parameters"]["timeout"] = 2**64
    response = client.post("/v2/models/dt_fp32/infer", json=body)
    assert (response.status_code, response.json()) == (
        400, {"error": "parameter 'timeout' must be a non-negative integer of microseconds"})


def test_an_output_too_large_for_json_comes_back_null_as_documented(
    client: httpx.Client,
) -> None:
    # FP32 3e38 doubled is infinite: JSON has no number for it.
    body: dict[str, Any] = {
        "inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [3e38, -3e38]}]}
    response = client.post("/v2/models/dt_fp32/infer", json=body)
    assert response.status_code == 200
    assert response.json()["outputs"][0]["data"] == [None, None]
    body["parameters"] = {"binary_data_output": True}
    response = client.post("/v2/models/dt_fp32/infer", json=body)
    length = int(response.headers["inference-header-content-length"])
    assert np.frombuffer(response.content[length:], "<f4").tolist() == [np.inf, -np.inf]


# --- afterwards ------------------------------------------------------------------------------


def test_the_daemon_still_serves_and_logged_no_fault(
    daemon: Daemon, client: httpx.Client, log_start: int,
) -> None:
    assert_alive(daemon)
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.5, -2]}]}
    response = client.post("/v2/models/dt_fp32/infer", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [3.0, -4.0]
    assert log_problems(daemon, log_start) == []
