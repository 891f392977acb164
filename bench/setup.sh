#!/usr/bin/env bash
# Installs the load generators the HTTP benchmark uses (wrk; hyperfine for ad-hoc CLI timing).
# Does nothing when wrk is already on PATH. Needs root (or sudo) on Debian/Ubuntu.
set -euo pipefail

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
