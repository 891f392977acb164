"""Finding GPUs through NVML (engine/memory/probes.py): where NVML's library does not load, no
GPU is found and pynvml is not even imported, and the start says what pynvml itself would.
The host's memory is read without importing psutil, and is what psutil says."""

from __future__ import annotations

import json
import subprocess
import sys

# A fresh interpreter: what the probe imports is the point. pynvml's own answer comes last.
SCRIPT = """
import json, logging, sys

said = []

class Keep(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())

logger = logging.getLogger("snoozeml")
logger.addHandler(Keep())
logger.setLevel(logging.INFO)
from snoozeml.engine.memory.probes import SystemProbe, visible_gpus

gpus = visible_gpus()
probe = SystemProbe().gpus()
imported = "pynvml" in sys.modules
import pynvml

try:
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    own = None
except Exception as exc:
    own = type(exc).__name__
print(json.dumps({"gpus": gpus, "probe": probe, "imported": imported, "own": own,
                  "said": said}))
"""


def test_without_nvmls_library_no_gpu_is_found_and_pynvml_is_not_imported() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["gpus"] == found["probe"]
    # pynvml is imported only where its library loads (a host with an NVIDIA driver).
    assert found["imported"] is (found["own"] != "NVMLError_LibraryNotFound")
    if found["own"] is None:  # NVML works here: whatever it finds, nothing is said
        assert not [line for line in found["said"] if "gpu_memory_unavailable" in line]
    else:  # the same words as pynvml's own error
        assert found["gpus"] == []
        assert [line for line in found["said"] if "gpu_memory_unavailable" in line] == [
            'gpu_memory_unavailable detail="no NVML GPU found; GPU budgets are inert" '
            f"error={found['own']}"]


def test_the_hosts_total_is_psutils_without_importing_it() -> None:
    script = ("import json, sys\n"
              "from snoozeml.engine.memory.probes import host_total, process_rss\n"
              "total, rss = host_total(), process_rss()\n"
              "imported = 'psutil' in sys.modules\n"
              "import psutil\n"
              "print(json.dumps([total, psutil.virtual_memory().total, imported, rss > 0]))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    total, psutils, imported, rss = json.loads(result.stdout)
    assert (total, imported, rss) == (psutils, False, True)
