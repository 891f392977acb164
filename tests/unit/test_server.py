"""Auth off is said at every start, louder when the daemon listens beyond loopback; a start
loads nothing a configuration does not use."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

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
        "snoozeml.auth.tokens", "snoozeml.api.grpc.modelmesh", "snoozeml.engine.modelmesh",
        "snoozeml.api.openapi.document", "onnxruntime", "snoozeml.runtime.onnx.sessions",
        "psutil", "websockets", "wsproto")
# What every start needs: the check sees the daemon's modules, not an empty interpreter.
NEEDED = ("uvicorn", "grpc", "snoozeml.server", "snoozeml.api.http.rest",
          "snoozeml.runtime.onnx.backend")

# `snooze serve` in this interpreter; at server_started, the modules loaded so far are noted
# and SIGTERM ends the daemon as usual.
AT_START = """
import json, logging, os, signal, sys
from snoozeml.cli.main import main

noted = {}

class AtStart(logging.Handler):
    def emit(self, record):
        if record.getMessage().startswith("server_started") and not noted:
            noted["loaded"] = sorted(m for m in sys.argv[2].split(",") if m in sys.modules)
            os.kill(os.getpid(), signal.SIGTERM)

logging.getLogger("snoozeml").addHandler(AtStart())
code = main(["serve", "-c", sys.argv[1], "--host", "127.0.0.1", "--http-port", "0",
             "--grpc-port", "0"])
print(json.dumps({"code": code, **noted}))
"""


def test_a_start_without_auth_text_torch_or_modelmesh_imports_none_of_them(
    tmp_path: Path,
) -> None:
    write_mlp(tmp_path / "a.onnx")
    write_mlp(tmp_path / "b.onnx")
    config = tmp_path / "models.toml"
    config.write_text('[[models]]\nname = "a"\npath = "a.onnx"\n\n'
                      '[[models]]\nname = "b"\npath = "b.onnx"\npreload = true\n')
    result = subprocess.run(
        [sys.executable, "-c", AT_START, str(config), ",".join((*LAZY, *NEEDED))],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.splitlines()[-1])
    assert outcome["code"] == 0, result.stderr
    assert [m for m in outcome["loaded"] if m in LAZY] == []
    assert [m for m in NEEDED if m not in outcome["loaded"]] == []
