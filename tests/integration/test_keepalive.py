"""The adaptive keep-alive against the real daemon (issue 34): a periodic model learns to stay
loaded, a model with long regular gaps is unloaded after use and pre-warmed for its next request,
the histories survive a restart, and a corrupt history file is ignored.

The requests are paced (time.sleep between them) because the pacing *is* the traffic the policy
learns; waits for what the daemon does are on its log lines. A model with gaps of 15 s would
need ten of them (minutes) to learn from scratch on a real clock, so that test starts the daemon
with ten such gaps already in its history file (the restart path), and then shows one real gap;
the learning itself, gap by gap, is tests/unit/engine/keepalive/test_keeper.py's, on a fake
clock. The pre-warm storm test seeds its histories the same way.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
from oip_http import status_of
from onnx_models import write_mlp
from prometheus_client.parser import text_string_to_metric_families

from snoozeml.engine.keepalive.histogram import IdleHistogram

BODY = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


def infer(client: httpx.Client, name: str = "m") -> None:
    response = client.post(f"/v2/models/{name}/infer", json=BODY)
    assert response.status_code == 200, response.text


def config(tmp_path: Path, idle_timeout: str) -> str:
    write_mlp(tmp_path / "m.onnx")
    return f"""
[server]
cache_dir = "{tmp_path / 'cache'}"
keep_alive = "adaptive"

[[models]]
name = "m"
path = "m.onnx"
idle_timeout = "{idle_timeout}"
"""


def samples(client: httpx.Client, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    return {tuple(sorted(s.labels.items())): s.value
            for f in text_string_to_metric_families(response.text) if f.name == family
            for s in f.samples if s.name == f"{family}_total"}


def test_a_periodic_model_stops_cold_starting_within_ten_gaps(
    serve: Any, client_for: Any, tmp_path: Path,
) -> None:
    # A request every 2 s, a fixed window of 1 s: each gap unloads the model until it learns
    # (after four gaps as steady as a timer's; ten at most).
    daemon = serve(config(tmp_path, "1s"))
    client = client_for(daemon)
    loads: list[int] = []
    for _ in range(9):
        infer(client)
        loads.append(status_of(client, "m")["loads"])
        time.sleep(2.0)
    assert loads[0] == 1
    assert loads[1] == 2  # the fixed window: the first gap unloads it
    assert loads[-1] == loads[-4]  # no cold start on the last three requests
    keep = status_of(client, "m")["keep_alive"]
    assert keep["mode"] == "adaptive"
    assert keep["reason"] == "learned"
    assert keep["unload_after_s"] > 2.0
    assert keep["history"] == 8
    assert "keep_alive_plan model=m reason=learned" in daemon.log()


def test_a_model_with_regular_15s_gaps_is_unloaded_after_use_and_prewarmed_for_its_request(
    serve: Any, client_for: Any, tmp_path: Path,
) -> None:
    history = IdleHistogram()
    for _ in range(10):
        history.add(15.0)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "keepalive.json").write_text(
        json.dumps({"format": 1, "models": {"m": history.to_json()}}))
    daemon = serve(config(tmp_path, "5m"))
    client = client_for(daemon)

    mark = daemon.mark()
    infer(client)  # cold: the request's own load
    ended = time.monotonic()
    daemon.wait_for_log(r"model_unloaded model=m reason=idle", start=mark)
    planned = status_of(client, "m")["keep_alive"]
    assert (planned["reason"], planned["unload_after_s"]) == ("learned", 0.0)
    assert 10.0 <= planned["prewarm_after_s"] < 15.0
    assert planned["keep_until_s"] > 15.0
    assert planned["prewarm_at"] is not None
    unloaded = daemon.mark()  # the next load is the pre-warm's
    daemon.wait_for_log(r"prewarm model=m", start=unloaded, timeout=30)
    daemon.wait_for_log(r"model_loaded model=m ", start=unloaded, timeout=30)
    before = status_of(client, "m")
    assert before["state"] == "READY"
    assert before["keep_alive"]["loaded_by"] == "prewarm"
    time.sleep(max(15.0 - (time.monotonic() - ended), 0.0))  # the request comes on time
    infer(client)
    daemon.wait_for_log(r"prewarm_used model=m", start=mark)

    after = status_of(client, "m")
    assert after["loads"] == 2  # the first request's, and the pre-warm: no cold start
    assert after["keep_alive"]["prewarms"] == {"used": 1, "wasted": 0, "skipped": 0}
    assert after["keep_alive"]["history"] == 11
    colds = samples(client, "snooze_cold_starts")
    assert colds[(("cause", "request"), ("model", "m"))] == 1
    assert colds[(("cause", "prewarm"), ("model", "m"))] == 1
    assert samples(client, "snooze_prewarms")[(("model", "m"), ("outcome", "used"))] == 1
    assert samples(client, "snooze_idle_memory_byte_seconds")[(("model", "m"),)] > 0


def test_models_that_share_one_period_are_not_all_prewarmed_at_once(
    serve: Any, client_for: Any, tmp_path: Path,
) -> None:
    names = [f"m{i}" for i in range(8)]
    history = IdleHistogram()
    for _ in range(10):
        history.add(15.0)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "keepalive.json").write_text(json.dumps(
        {"format": 1, "models": dict.fromkeys(names, history.to_json())}))
    write_mlp(tmp_path / "m.onnx")
    entries = "".join(
        f'[[models]]\nname = "{name}"\npath = "m.onnx"\npreload = true\n\n' for name in names)
    daemon = serve(f'[server]\ncache_dir = "{tmp_path / "cache"}"\nkeep_alive = "adaptive"\n'
                   f'idle_timeout = "5m"\n\n{entries}')
    for name in names:
        daemon.wait_for_log(rf"model_loaded model={name} ")
    client = client_for(daemon)
    mark = daemon.mark()

    async def everyone() -> None:  # at one moment: their pre-warms fall due together
        async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as http:
            answers = await asyncio.gather(*(
                http.post(f"/v2/models/{name}/infer", json=BODY) for name in names))
        assert [a.status_code for a in answers] == [200] * len(names)

    asyncio.run(everyone())
    for name in names:  # each pre-warm starts or is skipped, about 13 s later
        daemon.wait_for_log(rf" prewarm(_skipped)? model={name}\b", start=mark, timeout=60)
    log = daemon.log()
    started = re.findall(r" prewarm model=(m\d)\b", log)
    skipped = re.findall(r" prewarm_skipped model=(m\d) reason=(\S+)", log)
    assert len(started) == 5  # the daemon's budget: 5 at once, 30 a minute
    assert sorted([*started, *(name for name, _ in skipped)]) == names
    assert {reason for _, reason in skipped} == {"rate_limit"}
    counted = samples(client, "snooze_prewarms")
    assert sum(v for k, v in counted.items() if ("outcome", "skipped") in k) == 3


def test_histories_are_kept_across_a_restart(
    serve: Any, client_for: Any, tmp_path: Path,
) -> None:
    body = config(tmp_path, "5m")
    daemon = serve(body)
    client = client_for(daemon)
    for _ in range(4):
        infer(client)
    assert status_of(client, "m")["keep_alive"]["history"] == 3
    assert daemon.stop() == 0
    saved = json.loads((tmp_path / "cache" / "keepalive.json").read_text())
    assert IdleHistogram.from_json(saved["models"]["m"]).count == 3

    again = serve(body)
    assert status_of(client_for(again), "m")["keep_alive"]["history"] == 3


def test_a_corrupt_history_file_is_ignored_with_a_warning(
    serve: Any, client_for: Any, tmp_path: Path,
) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "keepalive.json").write_text('{"format": 1, "models": {"m": [')
    daemon = serve(config(tmp_path, "5m"))
    client = client_for(daemon)
    daemon.wait_for_log(r"WARNING keepalive_history_ignored ")
    infer(client)
    infer(client)
    assert status_of(client, "m")["keep_alive"]["history"] == 1
