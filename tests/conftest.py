from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

# The shared fakes and builders in tests/support/ import as plain modules (`from daemon import
# Daemon`); test modules never import each other.
sys.path.insert(0, str(Path(__file__).parent / "support"))

from daemon import Daemon, write_config

DaemonFactory = Callable[..., Daemon]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[DaemonFactory]:
    """Start real daemons on a models.toml body written into tmp_path; all stopped at the end."""
    started: list[Daemon] = []

    def start(config_body: str, args: Sequence[str] = (), env: dict[str, str] | None = None,
              directory: Path | None = None) -> Daemon:
        config = write_config(directory or tmp_path, config_body)
        daemon = Daemon(config, args, env)
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        daemon.stop()


def _private_cache() -> None:
    """The daemons and backends the tests start keep their ONNX weights cache in a folder of
    the test session's own (inherited by daemon subprocesses), never the user's ~/.cache."""
    import atexit
    import os
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="snooze-test-cache-")
    os.environ["XDG_CACHE_HOME"] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)


_private_cache()
