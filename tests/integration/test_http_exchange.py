"""Inference over raw HTTP/1.1, as the daemon's protocol serves it without an ASGI cycle
(api/http/exchange.py): pipelined requests, `Expect: 100-continue`, HTTP/1.0 and
`Connection: close`, chunked and percent-encoded requests, an early answer that keeps the
connection, and a client that leaves halfway through its body. Every answer is checked against
onnxruntime run here."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from daemon import Daemon
from onnx_models import SERVED, reference_session, write_mlp
from prometheus_client.parser import text_string_to_metric_families
from raw_http import closed_by_server, read_response

LIMIT = 4096
CONFIG = f"""
[server]
max_request_size = {LIMIT}
keep_alive_timeout = "60s"  # longer than WAIT: a connection that closes was closed for its request

[[models]]
name = "mlp"
path = "mlp.onnx"
"""
WAIT = 15.0


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("http_exchange")
    write_mlp(folder / "mlp.onnx", dims=(4, 8, 3))
    return folder


@pytest.fixture(scope="module")
def daemon(module_serve: Any, folder: Path) -> Daemon:
    return module_serve(CONFIG, directory=folder)  # type: ignore[no-any-return]


@pytest.fixture
def sock(daemon: Daemon) -> Iterator[socket.socket]:
    with socket.create_connection(("127.0.0.1", daemon.http_port or 0), timeout=WAIT) as sock:
        yield sock


def row(seed: int) -> list[float]:
    return [float(v) for v in np.random.default_rng(seed).standard_normal(4).astype(np.float32)]


def body(seed: int) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                   "data": row(seed)}]}).encode()


def post(target: str = "/v2/models/mlp/infer", payload: bytes = b"", version: str = "1.1",
         headers: tuple[str, ...] = ()) -> bytes:
    lines = [f"POST {target} HTTP/{version}", "Host: x", "Content-Type: application/json",
             *headers]
    if not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers):
        lines.append(f"Content-Length: {len(payload)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


def assert_answers(folder: Path, answer: tuple[int, dict[str, str], bytes], seed: int) -> None:
    status, headers, content = answer
    assert status == 200, content
    assert headers["content-type"] == "application/json"
    doc = json.loads(content)
    assert doc["model_name"] == "mlp"
    expected = reference_session(folder / "mlp.onnx").run(
        None, {"x": np.array([row(seed)], dtype=np.float32)})[0]
    (output,) = doc["outputs"]
    assert output["shape"] == [1, 3]
    np.testing.assert_allclose(np.array(output["data"], dtype=np.float32).reshape(1, 3),
                               expected, **SERVED)


class Responses:
    """Reads responses one after another from a socket that may hold several at once."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.data = b""

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        assert chunk, f"closed before a whole response: {self.data!r}"
        self.data += chunk

    def next(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.data:
            self._more()
        head, self.data = self.data.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip()
                   for name, value in (line.split(":", 1) for line in lines)}
        length = int(headers["content-length"])
        while len(self.data) < length:
            self._more()
        content, self.data = self.data[:length], self.data[length:]
        return int(status_line.split()[1]), headers, content


def test_pipelined_requests_are_answered_in_order(sock: socket.socket, folder: Path) -> None:
    # Three inference requests with a probe between them, in one write: each answer is its
    # own request's, in the order asked.
    sock.sendall(post(payload=body(1)) + post(payload=body(2))
                 + b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n" + post(payload=body(3)))
    responses = Responses(sock)
    assert_answers(folder, responses.next(), 1)
    assert_answers(folder, responses.next(), 2)
    assert responses.next()[0] == 200
    assert_answers(folder, responses.next(), 3)


def test_expect_100_continue_is_answered_before_the_body_is_sent(
    sock: socket.socket, folder: Path
) -> None:
    payload = body(4)
    head = post(payload=payload, headers=("Expect: 100-continue",))[: -len(payload)]
    sock.sendall(head)
    interim = b""
    while b"\r\n\r\n" not in interim:
        chunk = sock.recv(1)
        assert chunk, "closed before 100 Continue"
        interim += chunk
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    # The body in two writes: the request waits for all of it.
    sock.sendall(payload[:10])
    sock.sendall(payload[10:])
    assert_answers(folder, read_response(sock), 4)


def test_an_http_1_0_request_is_answered_then_closed(sock: socket.socket, folder: Path) -> None:
    sock.sendall(post(payload=body(5), version="1.0"))
    answer = read_response(sock)
    assert_answers(folder, answer, 5)
    assert answer[1]["connection"] == "close"
    assert closed_by_server(sock)


def test_connection_close_closes_after_the_answer(sock: socket.socket, folder: Path) -> None:
    sock.sendall(post(payload=body(6), headers=("Connection: close",)))
    answer = read_response(sock)
    assert_answers(folder, answer, 6)
    # The header order of every other answer (uvicorn's): connection last.
    assert list(answer[1])[-3:] == ["content-type", "content-length", "connection"]
    assert answer[1]["connection"] == "close"
    assert closed_by_server(sock)


def test_expect_100_continue_with_the_body_already_sent_still_gets_its_100(
    sock: socket.socket, folder: Path
) -> None:
    sock.sendall(post(payload=body(13), headers=("Expect: 100-continue",)))
    interim = b""
    while not interim.endswith(b"\r\n\r\n"):
        chunk = sock.recv(1)
        assert chunk, "closed before any answer"
        interim += chunk
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert_answers(folder, read_response(sock), 13)


def test_clients_that_shut_their_side_after_pipelined_requests_log_no_error(
    daemon: Daemon, folder: Path
) -> None:
    # The transport closes on the client's end of file, before connection_lost: answers
    # still to write then are dropped, not written into a closed transport.
    mark = daemon.mark()
    for seed in range(50):
        with socket.create_connection(("127.0.0.1", daemon.http_port or 0),
                                      timeout=WAIT) as sock:
            sock.sendall(post(payload=body(seed)) * 3)
            sock.shutdown(socket.SHUT_WR)
            if seed % 2:  # half of them read what comes, until the daemon closes
                while sock.recv(65536):
                    pass
    with socket.create_connection(("127.0.0.1", daemon.http_port or 0), timeout=WAIT) as sock:
        sock.sendall(post(payload=body(14)))
        assert_answers(folder, read_response(sock), 14)
    later = daemon.log().splitlines()[mark:]
    assert not [line for line in later if " ERROR " in line or "Traceback" in line], later


def test_a_chunked_body_is_read_whole(sock: socket.socket, folder: Path) -> None:
    payload = body(7)
    pieces = [payload[:5], payload[5:40], payload[40:]]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    sock.sendall(post(payload=chunked, headers=("Transfer-Encoding: chunked",)))
    assert_answers(folder, read_response(sock), 7)


def test_a_percent_encoded_path_reaches_its_model(sock: socket.socket, folder: Path) -> None:
    sock.sendall(post("/v2/models/m%6Cp/infer", body(8)))
    assert_answers(folder, read_response(sock), 8)


def test_a_body_over_the_limit_is_413_and_the_connection_goes_on(
    sock: socket.socket, folder: Path
) -> None:
    # Declared over the limit: answered before the body is read, which is then read and
    # dropped; the next request on the connection is served.
    sock.sendall(post(payload=b"x" * (LIMIT + 1)) + post(payload=body(9)))
    responses = Responses(sock)
    status, headers, content = responses.next()
    assert status == 413, content
    assert "exceeds the limit of 4096" in json.loads(content)["error"]
    assert headers.get("connection") != "close"
    assert_answers(folder, responses.next(), 9)


def test_a_bad_body_is_a_400_and_the_connection_goes_on(
    sock: socket.socket, folder: Path
) -> None:
    sock.sendall(post(payload=b"{not json") + post(payload=body(10)))
    responses = Responses(sock)
    status, _, content = responses.next()
    assert status == 400
    assert "not valid JSON" in json.loads(content)["error"]
    assert_answers(folder, responses.next(), 10)


def infer_requests(daemon: Daemon, code: str) -> float:
    text = httpx.get(f"{daemon.url}/metrics", timeout=WAIT).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (sample.name == "snooze_requests_total" and labels.get("operation") == "infer"
                    and labels.get("protocol") == "http" and labels.get("code") == code):
                return sample.value
    return 0.0


def test_a_client_that_leaves_halfway_through_its_body_is_a_cancelled_request(
    daemon: Daemon, sock: socket.socket, folder: Path
) -> None:
    before = infer_requests(daemon, "499")
    payload = body(11)
    sock.sendall(post(payload=payload, headers=("Expect: 100-continue",))[: -len(payload)])
    assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue")  # it waits on the body now
    sock.sendall(payload[:10])
    sock.close()
    deadline = time.monotonic() + WAIT
    while infer_requests(daemon, "499") == before:
        assert time.monotonic() < deadline, "the request was never ended as cancelled"
    # The daemon serves on.
    with socket.create_connection(("127.0.0.1", daemon.http_port or 0), timeout=WAIT) as other:
        other.sendall(post(payload=body(12)))
        assert_answers(folder, read_response(other), 12)
