"""Auth off is said at every start, louder when the daemon listens beyond loopback; a start
loads nothing a configuration does not use."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

import pytest
from onnx_models import write_mlp

from snoozeml.auth.authenticator import Authenticator
from snoozeml.server import _warn_if_open


@pytest.mark.parametrize(("host", "level"), [
    ("127.0.0.1", logging.WARNING),
    ("::1", logging.WARNING),
    ("localhost", logging.WARNING),
    ("0.0.0.0", logging.ERROR),
    ("::", logging.ERROR),
    ("10.1.2.3", logging.ERROR),
    ("inference.internal", logging.ERROR),
])
def test_auth_off_is_a_warning_on_loopback_and_an_error_beyond(
    caplog: pytest.LogCaptureFixture, host: str, level: int
) -> None:
    with caplog.at_level(logging.INFO, logger="snoozeml"):
        _warn_if_open(Authenticator.from_config(None, {}), host)
    (record,) = [r for r in caplog.records if "auth_disabled" in r.getMessage()]
    assert record.levelno == level


def test_auth_on_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    from snoozeml.config.auth import ApiKeyConfig, AuthConfig

    auth = Authenticator.from_config(AuthConfig(api_keys=[ApiKeyConfig(
        name="k", role="admin", sha256="0" * 64)]), {})
    with caplog.at_level(logging.INFO, logger="snoozeml"):
        _warn_if_open(auth, "0.0.0.0")
    assert not [r for r in caplog.records if "auth_disabled" in r.getMessage()]


# Imported only when a configuration, or a request, needs them: [auth.jwt] (PyJWT and
# cryptography), a text or torch model, a model added by path (the Hub package), ModelMesh,
# the first GET /openapi.json, the first scrape of /metrics, an ONNX model's first load
# (onnxruntime: the preload begins after server_started), the first /admin/status (psutil);
# `snooze monitor` and `snooze pull`. FastAPI is not used at all, nor websockets (a WebSocket
# upgrade is refused by api/http/websocket_refusal.py).
LAZY = ("jwt", "cryptography", "transformers", "torch", "tokenizers", "textual",
        "huggingface_hub", "tomlkit", "fastapi", "prometheus_client", "snoozeml.hub",
        "snoozeml.auth.tokens", "snoozeml.api.grpc.modelmesh", "snoozeml.engine.added.modelmesh",
        "snoozeml.api.openapi.document", "onnxruntime", "snoozeml.runtime.onnx.sessions",
        "psutil", "websockets", "wsproto")
# What every start needs: the check sees the daemon's modules, not an empty interpreter.
NEEDED = ("uvicorn", "grpc", "snoozeml.server", "snoozeml.api.http.rest",
          "snoozeml.runtime.onnx.backend")

# `snooze serve` in this interpreter; at server_started, the modules loaded so far, the
# processes started so far and the cyclic GC's state are noted and SIGTERM ends the daemon as
# usual; the GC's state is noted again when the daemon hears the signal.
AT_START = """
import gc, json, logging, os, signal, sys

spawned = []

def spawns(event, args):
    if event in ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "os.system"):
        spawned.append(repr(args)[:200])

sys.addaudithook(spawns)
from snoozeml.cli.main import main

noted = {}

def collector():
    return {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}

class AtStart(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("server_started") and not noted:
            noted["loaded"] = sorted(m for m in sys.argv[2].split(",") if m in sys.modules)
            noted["gc_at_start"] = collector()
            noted["spawned"] = list(spawned)
            os.kill(os.getpid(), signal.SIGTERM)
        elif record.getMessage().startswith("shutdown_requested"):
            noted["gc_after_start"] = collector()

logging.getLogger("snoozeml").addHandler(AtStart())
code = main(["serve", "-c", sys.argv[1], "--host", "127.0.0.1", "--http-port", "0",
             "--grpc-port", "0"])
print(json.dumps({"code": code, **noted}))
"""


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What `AT_START` noted of a start with two ONNX models, no auth, text, torch or
    ModelMesh (the second model preloads, after server_started)."""
    folder = tmp_path_factory.mktemp("start")
    write_mlp(folder / "a.onnx")
    write_mlp(folder / "b.onnx")
    config = folder / "models.toml"
    config.write_text('[[models]]\nname = "a"\npath = "a.onnx"\n\n'
                      '[[models]]\nname = "b"\npath = "b.onnx"\npreload = true\n')
    result = subprocess.run(
        [sys.executable, "-c", AT_START, str(config), ",".join((*LAZY, *NEEDED))],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    outcome: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    assert outcome["code"] == 0, result.stderr
    return outcome


def test_a_start_without_auth_text_torch_or_modelmesh_imports_none_of_them(
    start: dict[str, Any],
) -> None:
    assert [m for m in start["loaded"] if m in LAZY] == []
    assert [m for m in NEEDED if m not in start["loaded"]] == []


def test_a_start_runs_no_other_process(start: dict[str, Any]) -> None:
    # ctypes.util.find_library runs `ldconfig -p`; snoozeml/heap.py opens glibc by its soname.
    assert start["spawned"] == []


def test_a_start_runs_without_the_cyclic_gc_then_freezes_what_it_built(
    start: dict[str, Any],
) -> None:
    assert start["gc_at_start"] == {"enabled": False, "frozen": 0}
    # Resumed as the listeners start: the modules, classes and servers (tens of thousands of
    # objects) are out of every later collection.
    assert start["gc_after_start"]["enabled"] is True
    assert start["gc_after_start"]["frozen"] > 10_000
