"""The soak test's traffic: good requests over JSON, binary and gRPC, checked against
onnxruntime; bad requests that must get their own 4xx or gRPC code; clients that leave
mid-request; repository calls; and the threads that send them, cycle after cycle."""

from __future__ import annotations

import random
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import numpy as np
import orjson
from harness.daemon import Daemon
from harness.oip import JSON_HEADERS, grpc_output, grpc_request, http_output

from scenarios.soak.clients import GOOD_TIMEOUT_S, Clients, Gate, Tally
from scenarios.soak.served import BLINK_IDLE_S, Case, ServedModel, answer_matches
from snoozeml.proto import inference_pb2 as pb


@dataclass
class Traffic:
    """What every client thread shares."""

    daemon: Daemon
    models: list[ServedModel]
    gate: Gate
    tally: Tally
    churn_until: float = 0.0  # monotonic time: the workers send to churn models until then

    def check(self, label: str, got: np.ndarray, case: Case) -> None:
        if not answer_matches(got, case.expected):
            expected = case.expected
            diff = float(np.max(np.abs(got - expected))) if got.shape == expected.shape else None
            self.tally.problem("wrong", f"{label}: shape {got.shape} {got.dtype}, expected "
                               f"{expected.shape} {expected.dtype}; max abs diff {diff}")

    # good requests

    def http_infer(self, c: Clients, model: ServedModel, case: Case, binary: bool) -> None:
        label = f"{'http_binary' if binary else 'http_json'} {model.name}"
        if binary:
            headers = {"Content-Type": "application/octet-stream",
                       "Inference-Header-Content-Length": str(case.header_length)}
            body = case.binary_body
        else:
            headers, body = JSON_HEADERS, case.json_body
        try:
            response = c.http.post(f"/v2/models/{model.name}/infer", content=body,
                                   headers=headers)
        except httpx.HTTPError as exc:
            self.tally.problem("failed", f"{label}: {exc!r}")
            return
        if response.status_code != 200:
            self.tally.problem("failed", f"{label}: {response.status_code} "
                               f"{response.text[:300]}")
            return
        header_length = response.headers.get("inference-header-content-length")
        self.check(label, http_output(response.content, header_length), case)

    def grpc_infer(self, c: Clients, model: ServedModel, case: Case) -> None:
        try:
            response = c.grpc.ModelInfer(case.grpc, timeout=GOOD_TIMEOUT_S)
        except grpc.RpcError as exc:
            self.tally.problem("failed", f"grpc {model.name}: {_rpc_error(exc)}")
            return
        self.check(f"grpc {model.name}", grpc_output(response), case)

    def infer(self, c: Clients, rng: random.Random, model: ServedModel) -> str:
        case = rng.choice(model.cases)
        kind = rng.choice(("http_json", "http_binary", "grpc"))
        if kind == "grpc":
            self.grpc_infer(c, model, case)
        else:
            self.http_infer(c, model, case, binary=kind == "http_binary")
        return kind

    def metadata(self, c: Clients, rng: random.Random, model: ServedModel) -> str | None:
        try:
            if rng.random() < 0.5:
                response = c.http.get(f"/v2/models/{model.name}")
                name = response.json().get("name") if response.status_code == 200 else None
                outcome = f"{response.status_code} {response.text[:200]}"
            else:
                reply = c.grpc.ModelMetadata(pb.ModelMetadataRequest(name=model.name),
                                             timeout=GOOD_TIMEOUT_S)
                name, outcome = reply.name, f"name {reply.name!r}"
        except (httpx.HTTPError, grpc.RpcError) as exc:
            name, outcome = None, _rpc_error(exc) if isinstance(exc, grpc.RpcError) else repr(exc)
        if name != model.name:
            self.tally.problem("failed", f"metadata {model.name}: {outcome}")
        return None

    # bad requests: each must get its own 4xx (or gRPC code), and nothing else

    def bad(self, c: Clients, rng: random.Random, model: ServedModel) -> str | None:
        w, name = model.width, model.name
        x = [0.5] * w

        def doc(tensor: dict[str, Any]) -> bytes:
            return orjson.dumps({"inputs": [{"name": "x", "shape": [1, w], "datatype": "FP32",
                                             "data": x, **tensor}]})

        http_cases: list[tuple[str, str, bytes, dict[str, str], int]] = [
            ("wrong shape", name, doc({"shape": [1, w + 1], "data": [*x, 0.5]}), {}, 400),
            ("element count", name, doc({"data": x[:-1]}), {}, 400),
            ("wrong datatype", name, doc({"datatype": "FP64"}), {}, 400),
            ("unknown input", name, doc({"name": "nope"}), {}, 400),
            ("garbage JSON", name, b'{"inputs": [{"name": "x", "shape": [1,', {}, 400),
            ("unknown model", "no-such-model", doc({}), {}, 404),
            ("binary header past the body", name, model.cases[0].binary_body,
             {"Inference-Header-Content-Length": str(len(model.cases[0].binary_body) + 8)}, 400),
        ]
        choice = rng.randrange(len(http_cases) + 2)
        if choice < len(http_cases):
            label, target, body, extra, want = http_cases[choice]
            headers = {**JSON_HEADERS, **extra}
            try:
                response = c.http.post(f"/v2/models/{target}/infer", content=body,
                                       headers=headers)
            except httpx.HTTPError as exc:
                self.tally.problem("failed", f"bad http ({label}) {name}: {exc!r}")
                return None
            if response.status_code != want or "error" not in response.text:
                self.tally.problem("unexpected", f"bad http ({label}) {name}: wanted {want}, "
                                   f"got {response.status_code} {response.text[:200]}")
            return None
        want_code: grpc.StatusCode
        if choice == len(http_cases):
            label, want_code = "unknown model", grpc.StatusCode.NOT_FOUND
            request = grpc_request("no-such-model", model.cases[0].model_input)
        else:
            label, want_code = "short raw contents", grpc.StatusCode.INVALID_ARGUMENT
            request = pb.ModelInferRequest()
            request.CopyFrom(model.cases[0].grpc)
            request.raw_input_contents[0] = request.raw_input_contents[0][:-4]
        try:
            c.grpc.ModelInfer(request, timeout=GOOD_TIMEOUT_S)
        except grpc.RpcError as exc:
            if exc.code() != want_code:
                self.tally.problem("unexpected", f"bad grpc ({label}) {name}: wanted {want_code}, "
                                   f"got {_rpc_error(exc)}")
            return None
        self.tally.problem("unexpected", f"bad grpc ({label}) {name}: answered OK")
        return None

    # clients that leave before the answer

    def disconnect(self, c: Clients, rng: random.Random, model: ServedModel) -> str | None:
        self._disconnect(c, rng, model)
        return None

    def _disconnect(self, c: Clients, rng: random.Random, model: ServedModel) -> None:
        case = rng.choice(model.cases)
        choice = rng.randrange(6)
        if choice < 3:
            self._raw_socket(rng, model, case, choice)
        elif choice == 3:  # httpx gives up reading after a few ms and drops the connection
            timeout = httpx.Timeout(GOOD_TIMEOUT_S, read=rng.uniform(0.0005, 0.005))
            try:
                response = c.http.post(f"/v2/models/{model.name}/infer",
                                       content=case.json_body, headers=JSON_HEADERS,
                                       timeout=timeout)
            except httpx.TimeoutException:
                return
            except httpx.HTTPError as exc:
                self.tally.problem("failed", f"http read timeout {model.name}: {exc!r}")
                return
            if response.status_code != 200:
                self.tally.problem("failed", f"http read timeout {model.name}: "
                                   f"{response.status_code} {response.text[:200]}")
                return
            self.check(f"http read timeout {model.name}", http_output(response.content, None),
                       case)
        elif choice == 4:  # a gRPC call cancelled mid-flight
            future = c.grpc.ModelInfer.future(case.grpc, timeout=GOOD_TIMEOUT_S)
            time.sleep(rng.uniform(0, 0.004))
            if not future.cancel():
                self._grpc_outcome(f"grpc cancel {model.name}", future.exception, future.result,
                                   case, grpc.StatusCode.CANCELLED)
        else:  # a gRPC deadline of a few ms
            future = c.grpc.ModelInfer.future(case.grpc, timeout=rng.uniform(0.0005, 0.005))
            self._grpc_outcome(f"grpc deadline {model.name}", future.exception, future.result,
                               case, grpc.StatusCode.DEADLINE_EXCEEDED)

    def _grpc_outcome(self, label: str, exception: Callable[[], Any],
                      result: Callable[[], Any], case: Case, allowed: grpc.StatusCode) -> None:
        try:
            error = exception()
        except grpc.FutureCancelledError:
            return
        if error is None:
            self.check(label, grpc_output(result()), case)
        elif not isinstance(error, grpc.RpcError) or error.code() not in (
            allowed, grpc.StatusCode.CANCELLED
        ):
            self.tally.problem("failed", f"{label}: {_rpc_error(error)}")

    def _raw_socket(self, rng: random.Random, model: ServedModel, case: Case, how: int) -> None:
        body = case.json_body
        head = (f"POST /v2/models/{model.name}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        try:
            with socket.create_connection(("127.0.0.1", self.daemon.http_port), 10) as sock:
                if how == 0:  # half the body, a moment, then gone
                    sock.sendall(head + body[: len(body) // 2])
                    time.sleep(rng.uniform(0, 0.02))
                elif how == 1:  # the whole request, then gone before the answer
                    sock.sendall(head + body)
                else:  # the headers only, then a reset instead of a close
                    sock.sendall(head)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError as exc:
            self.tally.problem("failed", f"raw socket {model.name}: {exc!r}")

    # repository

    def admin(self, c: Clients, rng: random.Random, model: ServedModel) -> str | None:
        self._admin(c, rng, model)
        return None

    def _admin(self, c: Clients, rng: random.Random, model: ServedModel) -> None:
        action = rng.choice(("load", "unload"))
        try:
            if rng.random() < 0.5:
                response = c.http.post(f"/v2/repository/models/{model.name}/{action}")
                if response.status_code != 200:
                    self.tally.problem("failed", f"http {action} {model.name}: "
                                       f"{response.status_code} {response.text[:200]}")
            elif action == "load":
                c.grpc.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=model.name),
                                           timeout=GOOD_TIMEOUT_S)
            else:
                c.grpc.RepositoryModelUnload(
                    pb.RepositoryModelUnloadRequest(model_name=model.name), timeout=GOOD_TIMEOUT_S)
        except grpc.RpcError as exc:
            self.tally.problem("failed", f"grpc {action} {model.name}: {_rpc_error(exc)}")
        except httpx.HTTPError as exc:
            self.tally.problem("failed", f"http {action} {model.name}: {exc!r}")



def _rpc_error(exc: BaseException) -> str:
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else ""
        return f"{code} {str(details)[:200]}"
    return repr(exc)


def _session(traffic: Traffic, body: Callable[[Clients], None]) -> None:
    """Run `body` once per cycle, inside the gate, with fresh connections."""
    while traffic.gate.enter():
        clients = Clients(traffic.daemon)
        try:
            body(clients)
        finally:
            clients.close()
            traffic.gate.leave()


def _guarded(traffic: Traffic, action: Callable[..., str | None], *args: Any) -> str | None:
    try:
        return action(*args)
    except Exception as exc:  # a bug of this script: counted (it fails the run), not fatal
        traffic.tally.problem("soak_error", repr(exc))
        return None


def worker(traffic: Traffic, seed: str) -> None:
    rng = random.Random(seed)
    hot = [m for m in traffic.models if m.role == "hot"]
    churn = [m for m in traffic.models if m.role == "churn"]
    actions: dict[str, Callable[[Clients, random.Random, ServedModel], str | None]] = {
        "infer": traffic.infer, "metadata": traffic.metadata, "bad": traffic.bad,
        "disconnect": traffic.disconnect,
    }
    weights = (72, 4, 12, 12)

    def cycle(c: Clients) -> None:
        while traffic.gate.is_open:
            churning = time.monotonic() < traffic.churn_until
            model = rng.choice(churn) if churning and rng.random() < 0.6 else rng.choice(hot)
            kind = rng.choices(list(actions), weights)[0]
            # infer answers which protocol it used; the others count under their own kind
            traffic.tally.count(_guarded(traffic, actions[kind], c, rng, model) or kind)

    _session(traffic, cycle)


def blinker(traffic: Traffic, seed: str) -> None:
    """Requests to the blink models more than their idle timeout apart."""
    rng = random.Random(seed)
    blinks = [m for m in traffic.models if m.role == "blink"]

    def cycle(c: Clients) -> None:
        while traffic.gate.pause(rng.uniform(BLINK_IDLE_S + 0.3, BLINK_IDLE_S + 1.5)):
            _guarded(traffic, traffic.infer, c, rng, rng.choice(blinks))
            traffic.tally.count("blink")

    _session(traffic, cycle)


def admin(traffic: Traffic, seed: str, every_s: float) -> None:
    """Repository load or unload of a random non-pinned model, every ~`every_s` seconds."""
    rng = random.Random(seed)
    targets = [m for m in traffic.models if not m.pinned]

    def cycle(c: Clients) -> None:
        while traffic.gate.pause(rng.uniform(0.5, 1.5) * every_s):
            _guarded(traffic, traffic.admin, c, rng, rng.choice(targets))
            traffic.tally.count("admin")

    _session(traffic, cycle)
