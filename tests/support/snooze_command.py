"""The `snooze` command run for real (`python -m snoozeml`) in a folder, the models.toml it
reads, the authenticator that config builds, and a key made by `snooze keys new`: what the
CLI tests of `snooze keys` and `snooze token` and the daemon tests with auth share."""

from __future__ import annotations

import hashlib
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


def new_key(role: str, name: str) -> tuple[str, str]:
    """A key from `snooze keys new`, and the config entry it printed (its hash only)."""
    out = subprocess.run(
        [sys.executable, "-m", "snoozeml", "keys", "new", "--role", role, "--name", name],
        check=True, capture_output=True, text=True).stdout
    key = next(word for word in out.split() if word.startswith("snz_"))
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert digest in out
    return key, f'{{ name = "{name}", role = "{role}", sha256 = "{digest}" }}'
