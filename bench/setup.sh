#!/usr/bin/env bash
# Installs what the benchmarks use beyond the dev install: wrk (hyperfine for ad-hoc CLI timing)
# from Debian, and py-spy (the throughput scenario's profile) into the project's venv. Skips what
# is there already. Needs root (or sudo) on Debian/Ubuntu for wrk.
set -euo pipefail

VENV_PY="$(dirname "$0")/../.venv/bin/python"
if [ -x "$VENV_PY" ] && ! "$VENV_PY" -m pip show py-spy >/dev/null 2>&1; then
    "$VENV_PY" -m pip install -q py-spy
fi

if command -v wrk >/dev/null 2>&1; then
    echo "wrk already installed: $(command -v wrk)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update
$SUDO apt-get install -y wrk hyperfine
