"""Fuzzing the binary tensor data extension over HTTP on a real daemon (issue 15): bodies of a
JSON header and binary tensors, valid ones and ones with one thing broken (the
Inference-Header-Content-Length off by one, past the body, negative, not a number, huge; the
JSON header cut or not an object; a binary_data_size inconsistent with the bytes; bytes added
or missing; both `data` and `binary_data_size`), outputs asking for binary_data or not.

A valid body gets onnxruntime's answer, binary outputs exactly where asked; a broken one gets a
4xx with a JSON `{"error": ...}` body, never a 5xx but the documented 503 of a model that
can't load. After each campaign the daemon is still up, answers a good request, and logged no
traceback.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from daemon import Daemon
from fuzz_strategies import (
    BROKEN,
    DATATYPES,
    KINDS,
    MODELS,
    assert_alive,
    assert_same,
    expected_output,
    from_raw,
    fuzz_settings,
    is_utf8,
    log_problems,
    model_name,
    report,
    tensors,
    to_raw,
    write_models,
)
from hypothesis import given
from hypothesis import strategies as st
from onnx_models import reference_session, write_multi_dtype_model

HEADER = "Inference-Header-Content-Length"
# The multi-dtype model: several inputs, so binary tensors follow each other in the body.
MULTI = "multi"
MULTI_INPUTS = {"f32": ("FP32", (4,)), "i64": ("INT64", (3,)), "flag": ("BOOL", (2,)),
                "half": ("FP16", (2,)), "text": ("BYTES", ())}
NO_JSON_FORM = {"FP16", "BF16"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("fuzz_binary")
    write_multi_dtype_model(folder / f"{MULTI}.onnx")
    config = write_models(folder) + f'\n\n[[models]]\nname = "{MULTI}"\npath = "{MULTI}.onnx"\n'
    return folder, config


@pytest.fixture(scope="module")
def daemon(module_serve: Any, models: tuple[Path, str]) -> Daemon:
    folder, config = models
    return module_serve(config, directory=folder)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=60) as http:
        yield http


# --- a request, and what it must get ------------------------------------------------------


@dataclass
class Tensor:
    name: str
    datatype: str
    array: np.ndarray
    binary: bool  # sent as bytes after the JSON header, else as JSON `data`


@dataclass
class Case:
    """One request: its model, tensors, and the outputs it asks for; `broken` names what was
    broken in its body (empty for a valid one)."""

    model: str
    tensors: list[Tensor]
    outputs: list[str] | None  # None: every output
    binary_outputs: set[str]
    header: dict[str, Any]
    blobs: list[bytes]
    header_length: bytes | None = b"exact"
    json_text: bytes | None = None  # the header as sent, when not json.dumps(header)
    tail: bytes | None = None  # the bytes after it, when not the blobs
    encoding: str | None = None  # Content-Encoding: the body is sent compressed
    cut_compressed: int | None = None  # bytes of the compressed body sent, when not all
    broken: list[str] = field(default_factory=list)

    def body(self) -> tuple[bytes, dict[str, Any]]:
        text = self.json_text if self.json_text is not None else \
            json.dumps(self.header).encode()
        tail = self.tail if self.tail is not None else b"".join(self.blobs)
        headers: dict[str, Any] = {"Content-Type": "application/octet-stream"}
        if self.header_length == b"exact":
            headers[HEADER] = str(len(text))
        elif self.header_length is not None:
            headers[HEADER] = self.header_length
        body = text + tail
        if self.encoding is not None:
            headers["Content-Encoding"] = self.encoding
            body = gzip.compress(body) if self.encoding == "gzip" else zlib.compress(body)
            body = body[:self.cut_compressed]
        return body, headers


def output_names(model: str) -> list[str]:
    return [f"{name}_out" for name in MULTI_INPUTS] if model == MULTI else ["y"]


def expected_outputs(folder: Path, case: Case) -> dict[str, np.ndarray]:
    if case.model != MULTI:
        [tensor] = case.tensors
        return {"y": expected_output(folder, tensor.datatype, tensor.array)}
    feed = {t.name: t.array for t in case.tensors}
    feed["text"] = np.array([v.decode() for v in feed["text"]], dtype=object)
    names = output_names(MULTI)
    got = reference_session(folder / f"{MULTI}.onnx").run(names, feed)
    answers = dict(zip(names, got, strict=True))
    answers["text_out"] = np.array([v.encode() for v in answers["text_out"]], dtype=object)
    return answers


def from_json(datatype: str, shape: list[int], data: list[Any]) -> np.ndarray:
    """A JSON output's data as the array it stands for (BF16 as its 16-bit words)."""
    if datatype == "BYTES":
        array = np.empty(len(data), dtype=object)
        array[:] = [v.encode("utf-8") for v in data]
        return array.reshape(shape)
    if datatype == "BF16":
        return (np.array(data, np.float32).view(np.uint32) >> 16).astype(np.uint16) \
            .reshape(shape)
    return np.array(data, dtype=KINDS[datatype].wire).reshape(shape)


def check_served(folder: Path, case: Case, response: httpx.Response) -> None:
    """A 200 with onnxruntime's outputs, binary exactly where asked, sizes covering the body."""
    assert response.status_code == 200, response.text
    content = response.content
    binary_expected = any(name in case.binary_outputs for name in
                           (case.outputs or output_names(case.model)))
    if binary_expected:
        length = int(response.headers[HEADER])
        assert response.headers["content-type"] == "application/octet-stream"
    else:
        assert HEADER.lower() not in response.headers
        length = len(content)
    doc = json.loads(content[:length])
    if "id" in case.header:
        assert doc["id"] == case.header["id"]
    expected = expected_outputs(folder, case)
    assert [o["name"] for o in doc["outputs"]] == (case.outputs or output_names(case.model))
    offset = length
    for entry in doc["outputs"]:
        name, datatype, shape = entry["name"], entry["datatype"], entry["shape"]
        if name in case.binary_outputs:
            assert "data" not in entry
            size = entry["parameters"]["binary_data_size"]
            got = from_raw(datatype, shape, content[offset:offset + size])
            offset += size
        else:
            got = from_json(datatype, shape, entry["data"])
        assert_same(datatype, got, expected[name])
    assert offset == len(content), "the binary outputs cover the rest of the body exactly"


def check_refused(response: httpx.Response, model: str = "") -> None:
    """A client's error with a JSON message, or the documented 503 of the broken model."""
    if response.status_code == 503:
        assert model == BROKEN, response.text
        assert "model 'broken' failed to load" in response.json()["error"]
        return
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert isinstance(error, str)
    assert error
    assert not error.startswith("internal error"), error


# --- strategies ---------------------------------------------------------------------------


def _valid_bytes(datatype: str, array: np.ndarray) -> bool:
    return datatype != "BYTES" or is_utf8(array)


@st.composite
def valid_cases(draw: st.DrawFn) -> Case:
    """A body the contract says is served (BYTES that aren't UTF-8 aside: see `refusable`)."""
    model = draw(st.sampled_from([*MODELS, MULTI]))
    names = output_names(model)
    outputs = draw(st.none() | st.permutations(names).flatmap(
        lambda order: st.integers(1, len(order)).map(lambda n: list(order[:n]))))
    request_default = draw(st.sampled_from([None, True, False]))
    flags = {name: draw(st.sampled_from([None, True, False])) for name in (outputs or [])}
    binary_outputs = {name for name in names
                      if (flags.get(name) if flags.get(name) is not None else request_default)}
    schema = MULTI_INPUTS if model == MULTI else {"x": (MODELS[model], (2,))}
    tensors_: list[Tensor] = []
    for name, (datatype, trailing) in schema.items():
        binary = datatype in NO_JSON_FORM or draw(st.booleans())
        output_binary = (f"{name}_out" if model == MULTI else "y") in binary_outputs
        array = draw(tensors(datatype, finite=not (binary and output_binary),
                             utf8=not binary, trailing=trailing))
        tensors_.append(Tensor(name, datatype, array, binary))
    tensors_ = draw(st.permutations(tensors_))
    header: dict[str, Any] = {"inputs": []}
    blobs = []
    for tensor in tensors_:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype,
                                 "shape": list(tensor.array.shape)}
        if tensor.binary:
            blob = to_raw(tensor.datatype, tensor.array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif tensor.datatype == "BYTES":
            entry["data"] = [v.decode() for v in tensor.array.ravel()]
        else:
            entry["data"] = tensor.array.tolist()
        header["inputs"].append(entry)
    if outputs is not None:
        header["outputs"] = [{"name": n} if flags[n] is None else
                             {"name": n, "parameters": {"binary_data": flags[n]}}
                             for n in outputs]
    if request_default is not None:
        header["parameters"] = {"binary_data_output": request_default}
    if draw(st.booleans()):
        header["id"] = draw(st.text(max_size=8))
    length = b"exact" if blobs or draw(st.booleans()) else None
    encoding = draw(st.sampled_from([None, None, None, "gzip", "deflate"]))
    return Case(model, tensors_, outputs, binary_outputs, header, blobs, length,
                encoding=encoding)


def refusable(case: Case) -> list[str]:
    """What makes a valid-looking case one to refuse: text that is not UTF-8."""
    return [f"input {t.name!r} is not UTF-8" for t in case.tensors
            if not _valid_bytes(t.datatype, t.array)]


NOT_A_NUMBER = st.one_of(
    st.sampled_from([b"", b"lots", b"0x10", b"1e3", b"12abc", b"1.5", b"\xff", b"NaN",
                     b"--1", b"9" * 5000]),
    st.text("abcxyz-.,;:!?/ ", min_size=1, max_size=10).map(str.encode)
    .filter(lambda v: v == v.strip()),
)


@st.composite
def broken_cases(draw: st.DrawFn) -> Case:
    """A valid case with one thing broken that the contract refuses."""
    case = draw(valid_cases())
    text = json.dumps(case.header).encode()
    tail = b"".join(case.blobs)
    binary = [e for e in case.header["inputs"] if "parameters" in e]
    choices = ["header length off", "header length past the body", "header length negative",
               "header length not a number", "header length huge", "JSON cut",
               "JSON with a control byte", "JSON not an object", "unknown output",
               "shape changed", "datatype changed", "compressed body cut"]
    if binary:
        choices += ["no header length", "binary_data_size off", "binary_data_size not a count",
                    "bytes added", "bytes missing", "data and binary_data_size"]
    what = draw(st.sampled_from(choices))
    case.broken.append(what)
    if what == "header length off":
        off = st.sampled_from([-1, 1]) | st.integers(-len(text), len(tail)).filter(bool)
        case.header_length = str(len(text) + draw(off)).encode()
    elif what == "header length past the body":
        case.header_length = str(len(text) + len(tail) + draw(st.integers(1, 2**40))).encode()
    elif what == "header length negative":
        case.header_length = str(-draw(st.integers(1, 2**63))).encode()
    elif what == "header length not a number":
        case.header_length = draw(NOT_A_NUMBER)
    elif what == "header length huge":
        case.header_length = str(draw(st.integers(2**31, 10**40))).encode()
    elif what == "no header length":
        case.header_length = None
    elif what == "JSON cut":
        case.json_text = text[:draw(st.integers(0, len(text) - 1))]
    elif what == "JSON with a control byte":
        at = draw(st.integers(0, len(text)))
        control = st.integers(0, 31).filter(lambda b: b not in b"\t\n\r")  # not whitespace
        case.json_text = text[:at] + bytes([draw(control)]) + text[at:]
    elif what == "JSON not an object":
        case.json_text = draw(st.sampled_from([b"[]", b"null", b"3", b'"inputs"', b"true",
                                               json.dumps(case.header["inputs"]).encode()]))
    elif what == "unknown output":
        name = draw(st.sampled_from(["z", "", "x", "Y", "y "]))
        case.header["outputs"] = [*case.header.get("outputs", []), {"name": name}]
    elif what == "shape changed":
        entry = draw(st.sampled_from(case.header["inputs"]))
        shapes = st.lists(st.integers(-3, 5), max_size=4) | st.lists(
            st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3)
        entry["shape"] = draw(shapes.filter(lambda s: s != entry["shape"]))
    elif what == "datatype changed":
        entry = draw(st.sampled_from(case.header["inputs"]))
        entry["datatype"] = draw(st.sampled_from(DATATYPES).filter(
            lambda d: d != entry["datatype"]) | st.sampled_from(["fp32", "", "FP8", "STRING"]))
    elif what == "binary_data_size off":
        entry = draw(st.sampled_from(binary))
        size = entry["parameters"]["binary_data_size"]
        entry["parameters"]["binary_data_size"] = draw(
            st.integers(0, size + 16).filter(lambda n: n != size))
    elif what == "binary_data_size not a count":
        entry = draw(st.sampled_from(binary))
        entry["parameters"]["binary_data_size"] = draw(st.sampled_from(
            [-1, -(2**63), 2**64 - 1, 2**64 + 1, 1.0, "8", True, False, None, [], {}]))
    elif what == "bytes added":
        case.tail = tail + draw(st.binary(min_size=1, max_size=9))
    elif what == "bytes missing":
        case.tail = tail[:draw(st.integers(0, max(len(tail) - 1, 0)))] if tail else None
        if not tail:  # nothing to take away: claim one byte more instead
            binary[0]["parameters"]["binary_data_size"] += 1
    elif what == "compressed body cut":
        case.encoding = case.encoding or draw(st.sampled_from(["gzip", "deflate"]))
        compressed = len(case.body()[0])
        case.cut_compressed = draw(st.integers(0, compressed - 1))
    else:  # data and binary_data_size
        entry = draw(st.sampled_from(binary))
        entry["data"] = [0] * math.prod(max(d, 0) for d in entry["shape"])
    return case


# --- the campaigns -------------------------------------------------------------------------


def post(client: httpx.Client, case: Case) -> httpx.Response:
    body, headers = case.body()
    return client.post(f"/v2/models/{case.model}/infer", content=body, headers=headers)


def assert_unharmed(daemon: Daemon, client: httpx.Client, folder: Path, mark: int) -> None:
    """Up, serving a good binary request, and nothing in the log but documented failures."""
    assert_alive(daemon)
    x = np.array([[0.5, -2.0], [3.0, 1e-3]], np.float32)
    blob = to_raw("FP32", x)
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 2],
                          "parameters": {"binary_data_size": len(blob)}}],
              "parameters": {"binary_data_output": True}}
    case = Case(model_name("FP32"), [Tensor("x", "FP32", x, True)], None, {"y"}, header, [blob])
    check_served(folder, case, post(client, case))
    assert log_problems(daemon, mark) == []


def test_valid_binary_bodies_answer_like_onnxruntime(
    daemon: Daemon, client: httpx.Client, models: tuple[Path, str]
) -> None:
    folder, _ = models
    mark = daemon.mark()
    outcomes: Counter[str] = Counter()

    @fuzz_settings(250)
    @given(case=valid_cases())
    def campaign(case: Case) -> None:
        response = post(client, case)
        reasons = refusable(case)
        if reasons:
            assert response.status_code == 400, response.text
            assert "not valid UTF-8" in response.json()["error"]
            outcomes["refused: not UTF-8"] += 1
        else:
            check_served(folder, case, response)
            outcomes["served"] += 1

    campaign()
    report(outcomes)
    assert_unharmed(daemon, client, folder, mark)


def test_broken_binary_bodies_get_a_4xx_with_a_json_error(
    daemon: Daemon, client: httpx.Client, models: tuple[Path, str]
) -> None:
    folder, _ = models
    mark = daemon.mark()
    outcomes: Counter[str] = Counter()

    @fuzz_settings(400)
    @given(case=broken_cases())
    def campaign(case: Case) -> None:
        response = post(client, case)
        outcomes[f"{case.broken[0]}: {response.status_code}"] += 1
        check_refused(response, case.model)

    campaign()
    report(outcomes)
    assert_unharmed(daemon, client, folder, mark)


@st.composite
def chaos(draw: st.DrawFn) -> tuple[str, bytes, dict[str, bytes]]:
    """A model name, any body, any header length: a good header with random bytes after
    it, or random bytes altogether."""
    model = draw(st.sampled_from([*MODELS, MULTI, BROKEN]) | st.text(
        "abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=10))
    if draw(st.booleans()):
        case = draw(valid_cases())
        head = json.dumps(case.header).encode()
        body = head + draw(st.binary(max_size=64))
        value = draw(st.just(str(len(head)).encode()) | st.integers(-5, len(body) + 5).map(
            lambda n: str(n).encode()))
    else:
        body = draw(st.binary(max_size=200))
        value = draw(st.integers(-5, len(body) + 5).map(lambda n: str(n).encode())
                     | NOT_A_NUMBER)
    headers = {} if draw(st.integers(0, 5)) == 0 else {HEADER: value}
    return model, body, headers


def test_any_body_and_header_length_get_a_clear_answer(
    daemon: Daemon, client: httpx.Client, models: tuple[Path, str]
) -> None:
    folder, _ = models
    mark = daemon.mark()
    outcomes: Counter[str] = Counter()

    @fuzz_settings(200)
    @given(request=chaos())
    def campaign(request: tuple[str, bytes, dict[str, bytes]]) -> None:
        model, body, headers = request
        response = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
        outcomes[str(response.status_code)] += 1
        if response.status_code != 200:
            check_refused(response, model)

    campaign()
    report(outcomes)
    assert_unharmed(daemon, client, folder, mark)


# --- found while fuzzing, kept as plain regression tests ---------------------------------


def test_a_bytes_tensor_with_far_more_elements_than_its_shape_is_refused_unread(
    client: httpx.Client,
) -> None:
    """Found by a probe beside the campaigns (which check answers, not time): 4 MiB of empty
    BYTES elements for a shape of one were all read (a million objects, about a second of the
    event loop) before the count was compared; reading now stops one element past it."""
    blob = b"\x00" * (4 * 2**20)
    header = {"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 1],
                          "parameters": {"binary_data_size": len(blob)}}]}
    case = Case(model_name("BYTES"), [], None, set(), header, [blob])

    response = post(client, case)

    assert response.status_code == 400
    assert response.json() == {"error": "input 'x': shape [1, 1] needs 1 elements, the BYTES "
                                        "data has more than 1"}
