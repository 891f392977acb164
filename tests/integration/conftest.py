"""Fixtures of the daemon tests: models generated once per session, daemons shared by a
module. Everything is real: onnxruntime, the `snooze serve` process, httpx over TCP."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from daemon import Daemon, write_config
from onnx_models import LoopModel, write_big_model, write_loop_model


@pytest.fixture(scope="session")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 120 MiB of FP32 weights in one .onnx file."""
    return write_big_model(tmp_path_factory.mktemp("big") / "big.onnx", megabytes=120)


@pytest.fixture(scope="session")
def loop_model(tmp_path_factory: pytest.TempPathFactory) -> LoopModel:
    """The model whose requests last as long as they ask, measured on this machine."""
    return LoopModel.measure(write_loop_model(tmp_path_factory.mktemp("loop") / "loop.onnx"))


StartDaemon = Callable[..., Daemon]


@pytest.fixture(scope="module")
def module_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartDaemon]:
    """Like `serve`, for daemons that every test of a module shares; all stopped at the end.
    Model paths in the config are relative to `directory`."""
    started: list[Daemon] = []

    def start(config_body: str, directory: Path | None = None,
              env: dict[str, str] | None = None) -> Daemon:
        folder = directory or tmp_path_factory.mktemp("daemon")
        daemon = Daemon(write_config(folder, textwrap.dedent(config_body)), (), env)
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        daemon.stop()


@pytest.fixture
def client_for() -> Iterator[Callable[[Daemon], httpx.Client]]:
    """HTTP clients for daemons started in the test, closed at its end."""
    clients: list[httpx.Client] = []

    def make(daemon: Daemon) -> httpx.Client:
        clients.append(httpx.Client(base_url=daemon.url, timeout=120))
        return clients[-1]

    yield make
    for client in clients:
        client.close()
