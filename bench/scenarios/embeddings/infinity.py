"""infinity, the dedicated embedding server the daemon is set beside: installed into its own
venv on first use (torch pinned by constraints.txt), started on a free loopback port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from harness.daemon import free_port
from harness.load import BENCH_DIR

from scenarios.embeddings.corpus import MODEL
from scenarios.embeddings.optimum import ort_threads_env
from scenarios.minilm import MINILM

CONSTRAINTS = BENCH_DIR.parent / "constraints.txt"
INFINITY_VERSION = "0.0.78"
DEFAULT_INFINITY_VENV = Path(tempfile.gettempdir()) / "snooze-bench-infinity"


@dataclass
class InfinitySetup:
    """What became of infinity: its executable, or why there is none."""

    executable: Path | None = None
    note: str = ""
    install_s: float | None = None


def install_infinity(venv: Path, timeout_s: float) -> InfinitySetup:
    """infinity-emb into its own venv (never the project's), torch pinned as in
    constraints.txt so pip doesn't pull CUDA torch; reuses a venv that already has it."""
    executable = venv / "bin" / "infinity_emb"
    if executable.exists():
        return InfinitySetup(executable, f"infinity-emb from {venv} (installed before)")
    print(f"installing infinity-emb {INFINITY_VERSION} into {venv} (up to {timeout_s:g} s)",
          file=sys.stderr)
    start = time.monotonic()
    log = venv.parent / f"{venv.name}-install.log"
    # Only the torch pin: the project's others (uvicorn's, say) are not infinity's to meet.
    pins = venv.parent / f"{venv.name}-constraints.txt"
    pins.write_text("".join(line + "\n" for line in CONSTRAINTS.read_text().splitlines()
                            if line.startswith("torch")))
    try:
        # pip comes from Python's own ensurepip (no download); then the packages from the index.
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True,
                       capture_output=True, timeout=300)
        remaining = max(1.0, timeout_s - (time.monotonic() - start))
        with log.open("w") as out:
            done = subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-c", str(pins),
                 f"infinity-emb[server,torch]=={INFINITY_VERSION}"],
                stdout=out, stderr=subprocess.STDOUT, timeout=remaining, check=False)
    except subprocess.TimeoutExpired:
        return InfinitySetup(None, f"infinity-emb did not install within {timeout_s:g} s "
                                   f"(log: {log})", time.monotonic() - start)
    except (OSError, subprocess.CalledProcessError) as exc:
        return InfinitySetup(None, f"no venv for infinity-emb: {exc}", time.monotonic() - start)
    elapsed = time.monotonic() - start
    if done.returncode != 0 or not executable.exists():
        tail = " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        return InfinitySetup(None, f"pip install infinity-emb failed ({done.returncode}): {tail}",
                             elapsed)
    return InfinitySetup(executable, f"infinity-emb {INFINITY_VERSION} installed into {venv} "
                                     f"in {elapsed:.0f} s", elapsed)


class Infinity:
    """``infinity_emb v2`` serving a folder (MiniLM's unless told) as ``name`` on a free
    loopback port, its routes under ``/v1``."""

    def __init__(self, executable: Path, threads: int, log: Path,
                 start_timeout_s: float = 300.0, model: Path = MINILM,
                 name: str = MODEL, engine: str = "torch") -> None:
        self.port = free_port()
        self.engine = engine
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
               "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        cmd = [str(executable), "v2", "--model-id", str(model), "--served-model-name", name,
               "--engine", engine, "--device", "cpu", "--dtype", "float32",
               "--batch-size", "32", "--no-bettertransformer", "--no-compile",
               "--no-vector-disk-cache", "--host", "127.0.0.1", "--port", str(self.port),
               "--url-prefix", "/v1", "--log-level", "warning"]
        cwd = None
        if engine == "optimum":
            # The graph as found (no quantized one preferred), mean pooling (optimum's "auto"
            # would pool the CLS token), onnxruntime held to ``threads`` (ort_threads_env).
            cmd += ["--onnx-do-not-prefer-quantized", "--pooling-method", "mean"]
            env.update(ort_threads_env(log.parent / "ort-threads", threads))
            # infinity hands optimum the graph's path as it globbed it, and optimum 2 matches
            # it against bare file names: so the folder is the working directory, named ".",
            # its graph at its top (onnx_export.infinity_copy). infinity keeps its optimised
            # graph under HF_HUB_CACHE/infinity_onnx/<provider>/<model id>: one per folder.
            cmd[cmd.index("--model-id") + 1] = "."
            cwd = model
            env["HF_HUB_CACHE"] = str(model.parent / f"{model.name}-hf-cache")
        self.log = log
        self._out = log.open("w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._out,
                                     stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                     start_new_session=True)
        deadline = time.monotonic() + start_timeout_s
        with httpx.Client(base_url=self.base_url, timeout=5.0) as client:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"infinity exited with {self.proc.returncode}:\n"
                                       f"{self.tail()}")
                try:
                    if client.get("/v1/models").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"infinity not ready in {start_timeout_s:g} s:\n"
                                       f"{self.tail()}")
                time.sleep(0.5)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, lines: int = 30) -> str:
        self._out.flush()
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._out.close()


def infinity_version(executable: Path) -> str:
    python = executable.parent / "python"
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; "
         "v = {x.metadata['Name'].lower().replace('_', '-'): x.version "
         "for x in m.distributions()}; print(' '.join(p + ' ' + v[p] for p in ("
         "'infinity-emb', 'sentence-transformers', 'transformers', 'torch', 'optimum', "
         "'onnxruntime') if p in v))"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"

