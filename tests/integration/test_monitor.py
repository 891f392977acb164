"""`snooze monitor` against real daemons (issue 13, Done means 4): the Textual app driven by its
`run_test` pilot shows the models and their states, loads and unloads from the keyboard, keeps
running through a refusal, and shows a daemon going away and coming back on the same port;
`--once` prints the table as plain text.

Every wait is on a condition the app or the daemon shows, with a deadline; `pilot.pause()`
only lets the app run between checks.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from daemon import Daemon, free_ports
from onnx_models import write_mlp
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from snoozeml.cli.keys import config_entry, new_key
from snoozeml.monitor.app import HelpScreen, MonitorApp
from snoozeml.monitor.table import COLUMN_KEYS

INTERVAL = 0.2  # seconds between the monitor's polls
SIZE = (150, 40)
ROW = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


def models_config(folder: Path) -> str:
    model = write_mlp(folder / "mlp.onnx", dims=(4, 8, 2))
    return f"""
[[models]]
name = "alpha"
path = "{model}"
preload = true

[[models]]
name = "beta"
path = "{model}"
"""


# --- reading the app, as a person would read the screen -----------------------------------------


def header(app: MonitorApp) -> str:
    return str(app.query_one("#summary", Static).content)


def cell(app: MonitorApp, model: str, column: str) -> str | None:
    """The text of one cell of the models table, or None while the model has no row."""
    table: DataTable[Any] = app.query_one("#models", DataTable)
    if model not in {key.value for key in table.rows}:
        return None
    return str(table.get_row(model)[COLUMN_KEYS.index(column)])


def shown_models(app: MonitorApp) -> list[str]:
    table: DataTable[Any] = app.query_one("#models", DataTable)
    return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]


async def until(pilot: Pilot[None], condition: Callable[[], object], what: str,
                limit_s: float = 30.0) -> None:
    """Let the app run until `condition()` holds; fail with `what` at the deadline."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            summary = pilot.app.query_one("#summary", Static).content
            raise AssertionError(f"the monitor never showed {what}; its header: {summary}")
        await pilot.pause(0.05)


async def select(pilot: Pilot[None], app: MonitorApp, model: str) -> None:
    """Move the table's cursor to `model` with the arrow keys."""
    await pilot.press("home")
    for _ in range(len(shown_models(app))):
        if app.selected_model == model:
            return
        await pilot.press("down")
    assert app.selected_model == model, shown_models(app)


@pytest.fixture(scope="module")
def daemon(module_serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    folder = tmp_path_factory.mktemp("monitor")
    return module_serve(models_config(folder), directory=folder)  # type: ignore[no-any-return]


@pytest.fixture
def traffic(daemon: Daemon) -> Iterator[Callable[[str], None]]:
    """`traffic("alpha")` keeps sending inference requests to alpha until the test ends."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def send(model: str) -> None:
        with httpx.Client(base_url=daemon.url, timeout=30) as client:
            while not stop.is_set():
                assert client.post(f"/v2/models/{model}/infer", json=ROW).status_code == 200

    def start(model: str) -> None:
        thread = threading.Thread(target=send, args=(model,), daemon=True)
        thread.start()
        threads.append(thread)

    yield start
    stop.set()
    for thread in threads:
        thread.join(30)


# --- the tests -----------------------------------------------------------------------------------


def test_the_table_shows_each_model_and_its_state_and_the_keys_load_and_unload_them(
        daemon: Daemon) -> None:
    async def scenario() -> None:
        app = MonitorApp(daemon.url, interval=INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: cell(app, "alpha", "state") == "READY"
                        and cell(app, "beta", "state") == "UNLOADED", "alpha READY, beta UNLOADED")
            assert "● connected" in header(app)
            assert "snoozeml 0.1.0" in header(app)
            assert "cpu" in header(app)  # the device's memory bar
            assert cell(app, "alpha", "replicas") == "1"
            assert cell(app, "alpha", "memory") != "-"
            assert str(cell(app, "alpha", "cold_start")).endswith(("ms", "s"))
            assert cell(app, "beta", "memory") == "-"

            await select(pilot, app, "alpha")
            await pilot.press("u")
            await until(pilot, lambda: cell(app, "alpha", "state") == "UNLOADED",
                        "alpha UNLOADED after u")
            assert "alpha unloaded" in app.notices

            await select(pilot, app, "beta")
            await pilot.press("l")
            await until(pilot, lambda: cell(app, "beta", "state") == "READY",
                        "beta READY after l")
            assert "beta loaded" in app.notices

    asyncio.run(scenario())
    with httpx.Client(base_url=daemon.url) as client:
        states = {m["name"]: (m["state"], m["reason"])
                  for m in client.get("/admin/status").json()["models"]}
    assert states == {"alpha": ("UNLOADED", "admin"), "beta": ("READY", "")}


def test_typing_a_filter_keeps_matching_models_and_the_table_sorts_and_help_shows(
        daemon: Daemon) -> None:
    async def scenario() -> None:
        app = MonitorApp(daemon.url, interval=INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: shown_models(app) == ["alpha", "beta"], "both models")
            await pilot.press("slash", "b", "e", "t")
            await until(pilot, lambda: shown_models(app) == ["beta"], "only beta")
            await pilot.press("escape")
            await until(pilot, lambda: shown_models(app) == ["alpha", "beta"], "both again")
            # Letters typed into the filter are text, not commands (`l` loads on the table).
            await pilot.press("slash", *"alpha")
            await until(pilot, lambda: shown_models(app) == ["alpha"], "only alpha")
            assert app.notices == []
            await pilot.press("enter")  # keeps the filter, back to the table
            assert app.selected_model == "alpha"
            await pilot.press("slash", "escape")
            await until(pilot, lambda: shown_models(app) == ["alpha", "beta"], "both again")
            # Keys act on the table again once the filter is left.
            await select(pilot, app, "alpha")
            await pilot.press("s")  # sort by name
            assert app.sort_key == "name"
            await pilot.press("r")
            await until(pilot, lambda: shown_models(app) == ["beta", "alpha"], "reversed")
            assert app.selected_model == "alpha"  # the selection follows its model

            # Help sits on top while the polls go on underneath; any key closes it.
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            polls = app.polls
            await until(pilot, lambda: app.polls > polls + 1, "polls under the help")
            await pilot.press("x")
            assert not isinstance(app.screen, HelpScreen)

    asyncio.run(scenario())


def test_requests_per_second_and_latency_come_from_the_daemons_metrics(
        daemon: Daemon, traffic: Callable[[str], None]) -> None:
    async def scenario() -> None:
        app = MonitorApp(daemon.url, interval=INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: cell(app, "beta", "per_s") not in (None, "-"),
                        "a rate for beta")
            traffic("beta")
            await until(pilot, lambda: cell(app, "beta", "p50") != "-"
                        and cell(app, "beta", "per_s") not in ("0", "-"), "beta's traffic")
            assert cell(app, "beta", "p99") != "-"
            assert str(cell(app, "beta", "p50")).endswith(("ms", "s"))

    asyncio.run(scenario())


def test_a_daemon_that_stops_shows_disconnected_and_one_back_on_the_port_reconnects(
        serve: Any, tmp_path: Path) -> None:
    port = free_ports()[0]
    config = models_config(tmp_path)
    first = serve(config, ["--http-port", str(port)])

    async def scenario() -> None:
        app = MonitorApp(f"http://127.0.0.1:{port}", interval=INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: cell(app, "alpha", "state") == "READY", "alpha READY")
            assert app.connected
            started = app.status.server.started_at if app.status else None

            await asyncio.to_thread(first.stop)
            await until(pilot, lambda: "disconnected" in header(app), "disconnected")
            assert not app.connected
            assert f"retrying every {INTERVAL:g}s" in header(app)

            second: Daemon = await asyncio.to_thread(serve, config, ["--http-port", str(port)])
            assert second.http_port == port
            await until(pilot, lambda: app.connected and "disconnected" not in header(app),
                        "connected again")
            assert "● connected" in header(app)
            assert app.status is not None
            assert app.status.server.started_at != started  # a new daemon, not a stale answer
            await until(pilot, lambda: cell(app, "alpha", "state") == "READY",
                        "alpha READY on the new daemon")

    asyncio.run(scenario())


def test_once_prints_the_table_as_plain_text(daemon: Daemon) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "snoozeml", "monitor", "--url", daemon.url, "--once",
         "--interval", "0.2s"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    head, *rows = result.stdout.splitlines()
    assert head.split() == ["MODEL", "STATE", "REPLICAS", "IN-FLIGHT", "QUEUED", "REQ/S", "P50",
                            "P99", "MEMORY", "IDLE", "IN", "COLD", "START"]
    assert [row.split()[0] for row in rows] == ["alpha", "beta"]
    with httpx.Client(base_url=daemon.url) as client:
        states = {m["name"]: m["state"] for m in client.get("/admin/status").json()["models"]}
    assert [row.split()[1] for row in rows] == [states["alpha"], states["beta"]]
    assert "\x1b[" not in result.stdout  # plain text, no colours


def test_once_exits_1_with_a_message_when_the_daemon_cannot_be_reached() -> None:
    url = f"http://127.0.0.1:{free_ports()[0]}"
    result = subprocess.run(
        [sys.executable, "-m", "snoozeml", "monitor", "--url", url, "--once"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"snooze: cannot reach {url}")
    assert "Traceback" not in result.stderr


def test_with_auth_a_readonly_key_watches_and_its_unload_is_refused_in_the_app(
        serve: Any, tmp_path: Path) -> None:
    readonly, admin = new_key(), new_key()
    entries = ",\n    ".join([config_entry("dashboard", "readonly", readonly),
                             config_entry("ops", "admin", admin)])
    daemon = serve(f"[auth]\napi_keys = [\n    {entries},\n]\n" + models_config(tmp_path))

    async def scenario() -> None:
        app = MonitorApp(daemon.url, api_key=readonly, interval=INTERVAL)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: cell(app, "alpha", "state") == "READY", "alpha READY")
            await select(pilot, app, "alpha")
            await pilot.press("u")
            await until(pilot, lambda: any("403" in n for n in app.notices), "the refusal")
            (refusal,) = [n for n in app.notices if "403" in n]
            assert refusal == ("unload 'alpha': 403 permission denied: repository_unload needs "
                               "role 'admin' (this credential has 'readonly')")
            polls = app.polls
            await until(pilot, lambda: app.polls > polls + 1, "polls going on")
            assert app.is_running
            assert cell(app, "alpha", "state") == "READY"

        nobody = MonitorApp(daemon.url, interval=INTERVAL)
        async with nobody.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "401" in header(nobody), "the 401 in the header")
            assert "● no access" in header(nobody)
            assert "missing credentials" in header(nobody)

    asyncio.run(scenario())
    with httpx.Client(base_url=daemon.url, headers={"X-API-Key": admin}) as client:
        (alpha,) = [m for m in client.get("/admin/status").json()["models"]
                    if m["name"] == "alpha"]
    assert alpha["state"] == "READY"
