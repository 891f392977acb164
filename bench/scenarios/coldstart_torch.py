"""Cold start of all-MiniLM-L6-v2 through PyTorch in a warm process: the rehydration after an
idle unload, when torch, transformers and the model's class are already imported.

In one process, after one untimed load of each kind (imports, page cache), ``--rounds`` times
in turn, one intra-op thread (the daemon's default): ``transformers.AutoModel.from_pretrained``
of the folder (the baseline), ``TorchBackend().load_blocking`` of it (``tokenize = false``), and
the same with ``tokenize = true``. For SnoozeML's loads, also the process's resident memory
after the load above before it (after ``malloc_trim``, as the daemon measures a load), its
peak above before it (VmHWM reset through ``/proc/self/clear_refs``), and the path the weights
took (``weights_loaded``). Also run as a part of the ``coldstart`` scenario.
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

import torch
import transformers
from harness.cli import Bench
from harness.cpu import reset_peak, status_bytes
from harness.report import Outcome, table
from harness.rounds import spread
from harness.timing import elapsed_ms

from scenarios.minilm import MINILM

MIB = 1024 * 1024


class _Paths(logging.Handler):
    """The ``via=`` of every ``weights_loaded`` event."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("weights_loaded "):
            self.seen.append(message.split(" via=")[1].split()[0])


def _raw_load() -> float:
    from snoozeml.heap import release_memory_blocking

    ms, model = elapsed_ms(lambda: transformers.AutoModel.from_pretrained(
        str(MINILM), local_files_only=True).eval())
    del model
    release_memory_blocking()
    return ms


def _snoozeml_load(backend: Any, spec: Any) -> dict[str, float | None]:
    from snoozeml.heap import release_memory_blocking

    release_memory_blocking()
    before = status_bytes("VmRSS")
    reset_peak()
    ms, instance = elapsed_ms(lambda: backend.load_blocking(spec))
    peak = status_bytes("VmHWM")
    release_memory_blocking()  # what the daemon does before it measures the load
    after = status_bytes("VmRSS")
    instance.close()
    release_memory_blocking()
    if before is None or peak is None or after is None:
        return {"ms": ms, "peak": None, "resident": None}
    return {"ms": ms, "peak": float(peak - before), "resident": float(after - before)}


def measure_torch(rounds: int) -> dict[str, Any]:
    """Median-ready samples of each load kind, ``rounds`` of each in turn, in this process."""
    from snoozeml.config.settings import ModelConfig
    from snoozeml.runtime.torch.backend import TorchBackend

    torch.set_num_threads(1)
    paths = _Paths()
    logger = logging.getLogger("snoozeml")
    logger.addHandler(paths)
    logger.setLevel(logging.INFO)
    backend = TorchBackend()
    plain = ModelConfig(name="minilm", path=MINILM, format="torch", device="cpu")
    text = plain.model_copy(update={"tokenize": True})
    backend.prepare_blocking(plain)  # imports, as the daemon does before it measures
    _raw_load()
    _snoozeml_load(backend, plain)
    _snoozeml_load(backend, text)
    paths.seen.clear()
    samples: dict[str, list[Any]] = {"from_pretrained": [], "snoozeml": [], "snoozeml_text": []}
    for _ in range(rounds):
        samples["from_pretrained"].append(_raw_load())
        samples["snoozeml"].append(_snoozeml_load(backend, plain))
        samples["snoozeml_text"].append(_snoozeml_load(backend, text))
    logger.removeHandler(paths)
    return {
        "rounds": rounds,
        "weights_bytes": (MINILM / "model.safetensors").stat().st_size,
        "from_pretrained_ms": samples["from_pretrained"],
        "snoozeml_ms": [s["ms"] for s in samples["snoozeml"]],
        "snoozeml_text_ms": [s["ms"] for s in samples["snoozeml_text"]],
        "peak_bytes": [s["peak"] for s in samples["snoozeml"] if s["peak"] is not None],
        "resident_bytes": [s["resident"] for s in samples["snoozeml"]
                           if s["resident"] is not None],
        "paths": sorted(set(paths.seen)),
    }


def report(result: dict[str, Any]) -> list[str]:
    baseline = statistics.median(result["from_pretrained_ms"])
    lines = [
        "## Torch cold start in a warm process: all-MiniLM-L6-v2", "",
        f"- torch {torch.__version__}, transformers {transformers.__version__}; "
        f"{result['rounds']} rounds, one intra-op thread; weights "
        f"{result['weights_bytes'] / MIB:.1f} MiB; snoozeml's weights took: "
        f"{', '.join(result['paths'])}", ""]
    lines += table(["load", "median ms (min to max)", "median / baseline"], [
        (label, spread(values, ",.1f"), f"{statistics.median(values) / baseline:.2f}")
        for label, values in (
            ("transformers from_pretrained (baseline)", result["from_pretrained_ms"]),
            ("snoozeml load_blocking, tokenize = false", result["snoozeml_ms"]),
            ("snoozeml load_blocking, tokenize = true", result["snoozeml_text_ms"]))])
    peak = [v / MIB for v in result["peak_bytes"]]
    resident = [v / MIB for v in result["resident_bytes"]]
    return [*lines, "", "snoozeml load (tokenize = false), memory above the process before "
            f"it, MiB: peak {spread(peak, '.1f')}, resident after `malloc_trim` "
            f"{spread(resident, '.1f')}", ""]


def run(bench: Bench) -> Outcome:
    result = measure_torch(bench.args.rounds)
    title, _, *body = report(result)
    return Outcome("\n".join(bench.header(title) + body), result)
