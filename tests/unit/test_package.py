"""What importing snoozeml (snoozeml/__init__.py) sets for the libraries it loads afterwards:
numpy's OpenBLAS threads sleep as soon as their work is done instead of spinning, unless the
environment already chose."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# A fresh interpreter: OpenBLAS reads its settings when numpy is imported. After a product big
# enough for OpenBLAS to share it out, the CPU its threads then use is measured over 0.3 s: a
# window to observe idling in, long enough to see their 0.1 s of spinning.
BLAS_IDLE = """
import json, os, threading
import snoozeml
import numpy as np

def workers_ms():
    me, tick, total = threading.get_native_id(), os.sysconf("SC_CLK_TCK"), 0
    for task in os.listdir("/proc/self/task"):
        if int(task) != me:
            with open(f"/proc/self/task/{task}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total * 1000 / tick

matrix = np.ones((600, 600))
matrix @ matrix
done = workers_ms()
threading.Event().wait(0.3)
print(json.dumps({"timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"),
                  "threads": len(os.listdir("/proc/self/task")), "idle_ms": workers_ms() - done}))
"""


def run(env: dict[str, str]) -> dict[str, object]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OPENBLAS_THREAD_TIMEOUT", "GOTO_THREAD_TIMEOUT")}
    result = subprocess.run([sys.executable, "-c", BLAS_IDLE], capture_output=True, text=True,
                            timeout=60, check=False, env={**clean, **env})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads read from /proc")
def test_numpys_blas_threads_sleep_once_their_work_is_done() -> None:
    seen = run({})
    assert seen["timeout"] == "4"
    assert seen["idle_ms"] <= 20  # spinning, they used about 100 ms of it


@pytest.mark.parametrize("name", ["OPENBLAS_THREAD_TIMEOUT", "GOTO_THREAD_TIMEOUT"])
def test_a_timeout_the_environment_sets_is_kept(name: str) -> None:
    seen = run({name: "28"})
    assert seen["timeout"] == ("28" if name == "OPENBLAS_THREAD_TIMEOUT" else None)
