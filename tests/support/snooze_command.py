"""The `snooze` command run for real (`python -m snoozeml`) in a folder, the models.toml it
reads, and the authenticator that config builds: what the CLI tests of `snooze keys` and
`snooze token` share."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from snoozeml.auth.authenticator import Authenticator
from snoozeml.config.settings import load_config


def snooze(*args: str, cwd: Path, env: dict[str, str] | None = None,
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "snoozeml", *args], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=60, check=False)


def write(directory: Path, body: str) -> Path:
    path = directory / "models.toml"
    path.write_text(textwrap.dedent(body).lstrip("\n"))
    return path


def authenticator(path: Path, environ: dict[str, str]) -> Authenticator:
    return Authenticator.from_config(load_config(path, environ).auth, environ)
