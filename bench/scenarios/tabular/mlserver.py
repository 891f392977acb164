"""MLServer with its own scikit-learn runtime (mlserver-sklearn), the server the tabular
scenario sets the daemon beside: installed into its own venv on first use, with the
scikit-learn of this venv (a joblib file loads only in the version that wrote it), started
on free loopback ports."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
from harness.daemon import free_port

MLSERVER_VERSION = "1.7.1"
# uvloop 0.22 made asyncio.get_event_loop() raise without a running loop, which MLServer
# 1.7.1's inference workers call at start: every worker dies and the server stops.
UVLOOP = "uvloop<0.22"
DEFAULT_MLSERVER_VENV = Path(tempfile.gettempdir()) / "snooze-bench-mlserver"


@dataclass
class MLServerSetup:
    """What became of MLServer: its executable, or why there is none."""

    executable: Path | None = None
    note: str = ""


def install_mlserver(venv: Path, timeout_s: float) -> MLServerSetup:
    """mlserver and mlserver-sklearn into their own venv (never the project's); reuses a venv
    that already has them."""
    executable = venv / "bin" / "mlserver"
    sklearn = version("scikit-learn")
    if executable.exists():
        return MLServerSetup(executable, f"MLServer from {venv} (installed before)")
    print(f"installing mlserver {MLSERVER_VERSION} into {venv} (up to {timeout_s:g} s)",
          file=sys.stderr)
    start = time.monotonic()
    log = venv.parent / f"{venv.name}-install.log"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                       capture_output=True, timeout=300)
        with log.open("w") as out:
            done = subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install",
                 f"mlserver=={MLSERVER_VERSION}", f"mlserver-sklearn=={MLSERVER_VERSION}",
                 f"scikit-learn=={sklearn}", UVLOOP],
                stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return MLServerSetup(None, f"mlserver did not install within {timeout_s:g} s ({log})")
    except (OSError, subprocess.CalledProcessError) as exc:
        return MLServerSetup(None, f"no venv for mlserver: {exc}")
    if done.returncode != 0 or not executable.exists():
        tail = " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        return MLServerSetup(None, f"pip install mlserver failed ({done.returncode}): {tail}")
    return MLServerSetup(executable, f"mlserver {MLSERVER_VERSION} installed into {venv} in "
                                     f"{time.monotonic() - start:.0f} s")


def write_repository(folder: Path, name: str, joblib_file: Path,
                     batching: tuple[int, float] | None) -> Path:
    """An MLServer model folder: the joblib file and its model-settings.json (adaptive
    batching of (rows, seconds) when `batching` is given)."""
    model = folder / name
    model.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(joblib_file, model / "model.joblib")
    settings: dict[str, Any] = {"name": name, "implementation": "mlserver_sklearn.SKLearnModel",
                                "parameters": {"uri": "./model.joblib"}}
    if batching is not None:
        settings.update(max_batch_size=batching[0], max_batch_time=batching[1])
    (model / "model-settings.json").write_text(json.dumps(settings))
    return folder


class MLServer:
    """``mlserver start FOLDER`` on free loopback ports, `workers` inference processes."""

    def __init__(self, executable: Path, folder: Path, name: str, workers: int, log: Path,
                 start_timeout_s: float = 180.0) -> None:
        self.port = free_port()
        (folder / "settings.json").write_text(json.dumps({
            "http_port": self.port, "grpc_port": free_port(), "metrics_port": free_port(),
            "host": "127.0.0.1", "parallel_workers": workers, "debug": False}))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1"}
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen([str(executable), "start", str(folder)],
                                     stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + start_timeout_s
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"mlserver exited with {self.proc.returncode}:\n"
                                       f"{self.tail()}")
                try:
                    if client.get(f"/v2/models/{name}/ready").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"mlserver not ready in {start_timeout_s:g} s:\n"
                                       f"{self.tail()}")
                time.sleep(0.5)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, lines: int = 30) -> str:
        self._out.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._out.close()
