"""infinity's ONNX engine (``--engine optimum``): ``optimum[onnxruntime]`` installed into the
infinity venv on first use, with what that venv already holds pinned (torch, numpy, transformers,
sentence-transformers: infinity-emb 0.0.78 wants numpy below 2, which optimum would otherwise
upgrade), and a ``sitecustomize`` that holds onnxruntime to the scenario's threads.

infinity builds its onnxruntime session without session options, and onnxruntime then takes a
thread per physical core (``OMP_NUM_THREADS`` does not reach it); the daemon's ONNX model runs
``intra_op_threads`` threads. The ``sitecustomize`` (on ``PYTHONPATH`` of the infinity process
only) sets ``intra_op_num_threads`` of every session made without one to
``SNOOZE_BENCH_ORT_THREADS``, so both run the same threads.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

OPTIMUM = "optimum[onnxruntime]>=1.24.0"
PINNED = ("torch", "numpy", "transformers", "sentence-transformers")

SITECUSTOMIZE = '''\
"""Written by SnoozeML's bench (scenarios/embeddings/optimum.py): onnxruntime sessions made
without intra_op_num_threads get SNOOZE_BENCH_ORT_THREADS of them."""
import os

try:
    import onnxruntime as _ort
except ImportError:
    _ort = None

if _ort is not None and os.environ.get("SNOOZE_BENCH_ORT_THREADS"):
    _THREADS = int(os.environ["SNOOZE_BENCH_ORT_THREADS"])
    _init = _ort.InferenceSession.__init__

    def _with_threads(self, path_or_bytes, sess_options=None, *args, **kwargs):
        if sess_options is None:
            sess_options = _ort.SessionOptions()
        if sess_options.intra_op_num_threads == 0:
            sess_options.intra_op_num_threads = _THREADS
        _init(self, path_or_bytes, sess_options, *args, **kwargs)

    _ort.InferenceSession.__init__ = _with_threads
'''


def has_optimum(venv: Path) -> bool:
    """Whether infinity in ``venv`` can load its optimum engine."""
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from infinity_emb._optional_imports import CHECK_ONNXRUNTIME as c; "
         "import infinity_emb.transformer.utils_optimum; "
         "import sys; sys.exit(0 if c.is_available and c._marked_as_dirty is None else 1)"],
        capture_output=True, check=False, timeout=120)
    return done.returncode == 0


def installed_pins(venv: Path) -> list[str]:
    """``name==version`` of PINNED as the venv has them now."""
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.metadata as m\n"
         f"for p in {PINNED!r}:\n"
         "    try: print(p + '==' + m.version(p).split('+')[0])\n"
         "    except m.PackageNotFoundError: pass"],
        capture_output=True, text=True, check=True, timeout=120)
    return done.stdout.split()


def install_optimum(venv: Path, timeout_s: float) -> str | None:
    """``optimum[onnxruntime]`` into the infinity venv unless it is there; None when infinity's
    optimum engine is ready, else why not."""
    if has_optimum(venv):
        return None
    print(f"installing {OPTIMUM} into {venv} (up to {timeout_s:g} s)", file=sys.stderr)
    start = time.monotonic()
    log = venv.parent / f"{venv.name}-optimum-install.log"
    pins = venv.parent / f"{venv.name}-optimum-constraints.txt"
    try:
        pins.write_text("".join(pin + "\n" for pin in installed_pins(venv)))
        with log.open("w") as out:
            done = subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pip", "install", "-c", str(pins), OPTIMUM],
                stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"{OPTIMUM} did not install within {timeout_s:g} s (log: {log})"
    except (OSError, subprocess.CalledProcessError) as exc:
        return f"{OPTIMUM} not installed: {exc}"
    if done.returncode != 0:
        tail = " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        return f"pip install {OPTIMUM} failed ({done.returncode}): {tail}"
    if not has_optimum(venv):
        return f"{OPTIMUM} installed, but infinity cannot load its optimum engine (log: {log})"
    print(f"{OPTIMUM} installed in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return None


def ort_threads_env(folder: Path, threads: int) -> dict[str, str]:
    """The environment that holds the infinity process's onnxruntime to ``threads``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {"PYTHONPATH": str(folder), "SNOOZE_BENCH_ORT_THREADS": str(threads)}
