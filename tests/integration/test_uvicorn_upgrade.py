"""`snooze serve` on a uvicorn that lacks a private name the HTTP protocol uses: it says which,
with the versions it supports, and does not start (exit 2, no traceback).

The upgrade is played by a `sitecustomize` module the daemon's Python imports at start: it
deletes `HttpToolsProtocol._start_asgi_task` from the real uvicorn, as uvicorn before 0.45
lacks it. Everything else is the real command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import uvicorn

from snoozeml.api.http.uvicorn_private import SUPPORTED

REMOVE = """
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

del HttpToolsProtocol._start_asgi_task
"""


def test_serve_refuses_a_uvicorn_without_a_private_name_and_names_it(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(REMOVE)
    config = tmp_path / "models.toml"
    config.write_text("[server]\n")
    paths = [str(tmp_path), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}

    result = subprocess.run(
        [sys.executable, "-m", "snoozeml", "serve", "-c", str(config), "--http-port", "0",
         "--grpc-port", "0"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )

    assert result.returncode == 2, result.stdout + result.stderr
    assert (f"snooze: uvicorn {uvicorn.__version__} lacks HttpToolsProtocol._start_asgi_task, "
            "which the HTTP protocol builds on") in result.stderr
    assert f"supports uvicorn {SUPPORTED}" in result.stderr
    assert "snooze: unsupported uvicorn; not starting" in result.stderr
    assert "Traceback" not in result.stderr
    assert "server_started" not in result.stdout + result.stderr
