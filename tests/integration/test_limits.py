"""What one client can hold of the daemon, tried as a hostile client would, over raw sockets:
header and request-line sizes, open connections, idle keep-alive, and slow heads and bodies
(slowloris) over HTTP; metadata size, concurrent streams and pings over gRPC. Each refusal is
a clear answer to that client only; the daemon goes on serving everyone else."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from daemon import Daemon, write_config
from onnx_models import write_mlp
from raw_http import closed_by_server, read_response

from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

MAX_HEADER = 2048
MAX_TARGET = 1024
TIMEOUT = 1.0  # keep_alive_timeout, header_timeout and body_timeout alike
WAIT = 15.0  # how long a test waits for an answer that must come
CONFIG = f"""
[server]
max_header_size = {MAX_HEADER}
max_request_line = {MAX_TARGET}
keep_alive_timeout = "{TIMEOUT}s"
header_timeout = "{TIMEOUT}s"
body_timeout = "{TIMEOUT}s"
grpc_max_metadata_size = "4KiB"
grpc_max_concurrent_streams = 3
grpc_keepalive_time = "300ms"
grpc_keepalive_timeout = "300ms"
grpc_keepalive_min_time = "100ms"

[[models]]
name = "mlp"
path = "mlp.onnx"
"""
CAP = 4
CAP_CONFIG = f"""
[server]
max_connections = {CAP}
keep_alive_timeout = "60s"
"""
INFER = json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                "data": [1.0, 2.0, 3.0, 4.0]}]}).encode()


@pytest.fixture(scope="module")
def daemon(module_serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    folder = tmp_path_factory.mktemp("limits")
    write_mlp(folder / "mlp.onnx", dims=(4, 8, 2))
    return module_serve(CONFIG, directory=folder)  # type: ignore[no-any-return]


# --- raw HTTP/1.1 -----------------------------------------------------------------------


@contextlib.contextmanager
def connection(daemon: Daemon) -> Iterator[socket.socket]:
    with socket.create_connection(("127.0.0.1", daemon.http_port or 0), timeout=WAIT) as sock:
        yield sock


def request(target: str = "/v2/health/live", headers: list[tuple[str, str]] | None = None,
            method: str = "GET", body: bytes = b"") -> bytes:
    lines = [f"{method} {target} HTTP/1.1"]
    lines += [f"{name}: {value}" for name, value in headers or [("Host", "x")]]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def assert_refused(sock: socket.socket, status: int, words: str) -> dict[str, str]:
    code, headers, body = read_response(sock)
    assert code == status, body
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert words in json.loads(body)["error"], body
    assert closed_by_server(sock)
    return headers


def header_lines(total: int) -> list[tuple[str, str]]:
    """Header lines whose "name: value\\r\\n" bytes add up to `total`."""
    host = ("Host", "x")
    pad = total - (len("Host") + len("x") + 4) - (len("X-Pad") + 4)
    return [host, ("X-Pad", "p" * pad)]


def test_headers_up_to_the_limit_are_served(daemon: Daemon) -> None:
    with connection(daemon) as sock:
        sock.sendall(request(headers=header_lines(MAX_HEADER)))
        assert read_response(sock)[0] == 200


def test_one_byte_past_the_header_limit_is_431_and_closed(daemon: Daemon) -> None:
    with connection(daemon) as sock:
        sock.sendall(request(headers=header_lines(MAX_HEADER + 1)))
        assert_refused(sock, 431, f"limit of {MAX_HEADER} bytes (max_header_size)")


def test_a_200_kb_header_is_431_not_buffered(daemon: Daemon) -> None:
    with connection(daemon) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request(headers=[("Host", "x"), ("X-Big", "b" * 200_000)]))
        assert_refused(sock, 431, "max_header_size")


def test_a_header_line_that_never_ends_is_431_without_waiting_for_it(daemon: Daemon) -> None:
    with connection(daemon) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Endless: " + b"e" * 20_000)
        assert_refused(sock, 431, "max_header_size")  # at once, not the header deadline's 408


def test_trailers_that_never_end_after_a_chunked_body_are_431(daemon: Daemon) -> None:
    headers = [("Host", "x"), ("Content-Type", "application/json"),
               ("Transfer-Encoding", "chunked")]
    chunked = b"%x\r\n%s\r\n0\r\nX-Trailer: " % (len(INFER), INFER)
    with connection(daemon) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request("/v2/models/mlp/infer", headers, "POST", chunked))
            sock.sendall(b"t" * 600_000)  # more than one read holds
        assert_refused(sock, 431, "max_header_size")  # at once, not the body deadline's 408


def test_a_request_target_past_the_limit_is_414_and_closed(daemon: Daemon) -> None:
    at_limit = "/v2/health/live?" + "q" * (MAX_TARGET - len("/v2/health/live?"))
    with connection(daemon) as sock:
        sock.sendall(request(at_limit))
        assert read_response(sock)[0] == 200
        sock.sendall(request(at_limit + "q"))
        assert_refused(sock, 414, f"limit of {MAX_TARGET} bytes (max_request_line)")


def test_an_idle_keep_alive_connection_is_closed_after_keep_alive_timeout(
    daemon: Daemon,
) -> None:
    with connection(daemon) as sock:
        sock.sendall(request())
        assert read_response(sock)[0] == 200
        idle_since = time.monotonic()
        assert closed_by_server(sock)
        assert time.monotonic() - idle_since >= TIMEOUT - 0.05


def test_a_connection_that_never_sends_is_closed_after_keep_alive_timeout(
    daemon: Daemon,
) -> None:
    with connection(daemon) as sock:
        assert closed_by_server(sock)


def test_a_partial_head_is_408_after_header_timeout(daemon: Daemon) -> None:
    with connection(daemon) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        assert_refused(sock, 408, f"request headers not received within {TIMEOUT:g}s")
        assert time.monotonic() - started >= TIMEOUT - 0.05


def test_a_head_trickled_a_byte_at_a_time_still_ends_at_header_timeout(daemon: Daemon) -> None:
    """Slowloris: every byte arrives well within any idle timeout, the head never ends."""
    with connection(daemon) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        started = time.monotonic()
        sock.settimeout(TIMEOUT / 5)  # the client's pace: a byte each time nothing comes back
        answer = b""
        while not answer and time.monotonic() - started < WAIT:
            try:
                answer = sock.recv(65536)
            except TimeoutError:
                sock.sendall(b"X")
        assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_a_slow_body_is_408_after_body_timeout_and_the_daemon_serves_on(
    daemon: Daemon,
) -> None:
    headers = [("Host", "x"), ("Content-Type", "application/json"),
               ("Content-Length", str(len(INFER)))]
    with connection(daemon) as sock:
        sock.sendall(request("/v2/models/mlp/infer", headers, "POST", INFER[:10]))
        started = time.monotonic()
        assert_refused(sock, 408, f"request body not received within {TIMEOUT:g}s")
        assert time.monotonic() - started >= TIMEOUT - 0.05
    with connection(daemon) as sock:
        sock.sendall(request("/v2/models/mlp/infer", headers, "POST", INFER))
        status, _, body = read_response(sock)
        assert status == 200, body
        assert json.loads(body)["outputs"][0]["shape"] == [1, 2]


def test_connections_past_max_connections_get_503_and_the_open_ones_keep_working(
    module_serve: Any,
) -> None:
    capped: Daemon = module_serve(CAP_CONFIG)
    with contextlib.ExitStack() as stack:
        open_ones = [stack.enter_context(connection(capped)) for _ in range(CAP)]
        for sock in open_ones:  # each accepted, and counted, before the next test
            sock.sendall(request())
            assert read_response(sock)[0] == 200
        mark = capped.mark()
        with connection(capped) as extra:
            extra.sendall(request())
            headers = assert_refused(extra, 503, f"max_connections = {CAP}")
            assert headers["retry-after"] == "1"
        capped.wait_for_log(rf"http_connections_full max_connections={CAP}", start=mark)
        open_ones[0].sendall(request())
        assert read_response(open_ones[0])[0] == 200
        open_ones.pop().close()
        capped.wait_for_log(r"http_connections_available .*refused=1", start=mark)
        with connection(capped) as again:
            again.sendall(request())
            assert read_response(again)[0] == 200


@pytest.mark.parametrize(("nofile", "soft", "warned"), [
    ("256:4096", 1024 + 256, False),  # raised to fit, up to the hard limit
    ("256:512", 512, True),  # the hard limit is too low: said at start
])
def test_the_open_files_limit_is_raised_to_fit_max_connections(
    tmp_path: Path, nofile: str, soft: int, warned: bool
) -> None:
    config = write_config(tmp_path, "[server]\nmax_connections = 1024\n")
    daemon = Daemon(config, wrap=["prlimit", f"--nofile={nofile}", "--"]).start()
    try:
        assert psutil.Process(daemon.pid).rlimit(psutil.RLIMIT_NOFILE)[0] == soft
        assert ("open_files_low limit=512 max_connections=1024" in daemon.log()) is warned
    finally:
        daemon.stop()


# --- gRPC -------------------------------------------------------------------------------

SETTINGS, PING, GOAWAY = 4, 6, 7
ACK = 1
MAX_CONCURRENT_STREAMS, MAX_HEADER_LIST_SIZE = 3, 6
ENHANCE_YOUR_CALM = 0xB


class RawHttp2:
    """Just enough HTTP/2 to see what the gRPC listener does with a connection's pings."""

    def __init__(self, daemon: Daemon, answer_pings: bool = True) -> None:
        self.sock = socket.create_connection(("127.0.0.1", daemon.grpc_port or 0), timeout=WAIT)
        self.answer_pings = answer_pings
        self.frames: list[tuple[int, int, bytes]] = []  # (type, flags, payload) as received
        self.closed = False  # by the server: end of file, or a reset
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + self._frame(SETTINGS, 0))

    @staticmethod
    def _frame(kind: int, flags: int, payload: bytes = b"") -> bytes:
        return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + bytes(4) + payload

    def ping(self, number: int) -> None:
        self.sock.sendall(self._frame(PING, 0, struct.pack(">Q", number)))

    def _exactly(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            try:
                chunk = self.sock.recv(size - len(data))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.closed = True
                return None
            data += chunk
        return data

    def read(self, until: Any, seconds: float = WAIT) -> bool:
        """Read frames (answering the server's SETTINGS, and its PINGs if `answer_pings`)
        until `until(frame)`; False once the server closes or after `seconds`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                head = self._exactly(9)
            except TimeoutError:
                return False
            payload = self._exactly(int.from_bytes(head[:3], "big")) if head else None
            if head is None or payload is None:
                return False
            frame = (head[3], head[4], payload)
            self.frames.append(frame)
            if frame[0] == SETTINGS and not frame[1] & ACK:
                self._reply(self._frame(SETTINGS, ACK))
            if frame[0] == PING and not frame[1] & ACK and self.answer_pings:
                self._reply(self._frame(PING, ACK, payload))
            if until(frame):
                return True
        return False

    def _reply(self, frame: bytes) -> None:
        # The server may have closed already: what it sent before is still to be read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.sock.sendall(frame)

    def goaway(self) -> tuple[int, bytes] | None:
        """The GOAWAY received, if any: (error code, debug data)."""
        for kind, _, payload in self.frames:
            if kind == GOAWAY:
                return int.from_bytes(payload[4:8], "big"), payload[8:]
        return None

    def close(self) -> None:
        self.sock.close()


def acked(number: int) -> Any:
    return lambda f: f[0] == PING and f[1] & ACK and f[2] == struct.pack(">Q", number)


@pytest.fixture
def raw_http2(daemon: Daemon) -> Iterator[Any]:
    made: list[RawHttp2] = []

    def make(answer_pings: bool = True) -> RawHttp2:
        made.append(RawHttp2(daemon, answer_pings))
        return made[-1]

    yield make
    for connection_ in made:
        connection_.close()


def test_grpc_metadata_past_the_limit_is_refused_and_the_daemon_serves_on(
    daemon: Daemon,
) -> None:
    with grpc.insecure_channel(daemon.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ServerLive(pb.ServerLiveRequest(), metadata=[("x-pad", "p" * 5000)],
                            timeout=WAIT)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "metadata size exceeds hard limit" in (refused.value.details() or "")
        reply = stub.ServerLive(pb.ServerLiveRequest(), metadata=[("x-pad", "p" * 1000)],
                                timeout=WAIT)
        assert reply.live


def test_grpc_advertises_the_stream_and_metadata_limits(raw_http2: Any) -> None:
    conn = raw_http2()
    assert conn.read(lambda f: f[0] == SETTINGS and not f[1] & ACK)
    payload = conn.frames[-1][2]
    settings = {int.from_bytes(payload[i:i + 2], "big"): int.from_bytes(payload[i + 2:i + 6], "big")
                for i in range(0, len(payload), 6)}
    assert settings[MAX_CONCURRENT_STREAMS] == 3
    assert settings[MAX_HEADER_LIST_SIZE] == 4096


def test_grpc_a_ping_flood_gets_goaway_too_many_pings(raw_http2: Any) -> None:
    conn = raw_http2()
    for number in range(5):
        conn.ping(number)
    assert conn.read(lambda f: f[0] == GOAWAY)
    assert conn.goaway() == (ENHANCE_YOUR_CALM, b"too_many_pings")


def test_grpc_pings_no_more_often_than_keepalive_min_time_are_allowed_when_idle(
    raw_http2: Any,
) -> None:
    """gRPC's defaults would strike these (an idle connection may ping every 2 h)."""
    conn = raw_http2()
    for number in range(6):
        conn.ping(number)
        assert conn.read(acked(number))
        conn.read(lambda f: False, seconds=0.25)  # the client's pace, reading meanwhile
    conn.ping(99)  # answered after any GOAWAY the pings above earned
    assert conn.read(acked(99))
    assert conn.goaway() is None


def test_grpc_a_peer_that_does_not_answer_pings_is_dropped(raw_http2: Any) -> None:
    conn = raw_http2(answer_pings=False)
    assert not conn.read(lambda f: False)
    assert conn.closed
    assert any(kind == PING and not flags & ACK for kind, flags, _ in conn.frames)
    goaway = conn.goaway()
    assert goaway is not None
    assert goaway[1] == b"ping_timeout"
