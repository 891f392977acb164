"""`snooze monitor [--url URL] [--api-key KEY] [--interval 1s] [--once]`: the terminal
dashboard (snoozeml.monitor), or with --once the models table printed once."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from snoozeml.units import parse_duration

DEFAULT_URL = "http://127.0.0.1:8080"
MIN_INTERVAL_S = 0.1


def _interval(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    assert seconds is not None  # "never" is not allowed here
    if seconds < MIN_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"the interval must be at least {MIN_INTERVAL_S}s")
    return seconds


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL")
    return text.rstrip("/")


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "monitor", help="watch a daemon's models in the terminal",
        description="A live dashboard of one daemon, over HTTP only: its models' states, "
                    "traffic, latency, memory and timers, and its recent events. Press ? in "
                    "it for the keys.")
    parser.add_argument("--url", type=_url, default=DEFAULT_URL,
                        help=f"the daemon's HTTP address (default: {DEFAULT_URL})")
    parser.add_argument("--api-key", default=os.environ.get("SNOOZE_API_KEY"), metavar="KEY",
                        help="API key sent as X-API-Key when auth is on (default: "
                             "$SNOOZE_API_KEY); readonly to watch, admin to load and unload")
    parser.add_argument("--interval", type=_interval, default=1.0, metavar="DURATION",
                        help="time between polls, e.g. 1s, 500ms (default: 1s)")
    parser.add_argument("--once", action="store_true",
                        help="print the models table once as plain text and exit")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.once:
        from snoozeml.monitor.client import MonitorError
        from snoozeml.monitor.once import table_once

        try:
            print(asyncio.run(table_once(args.url, args.api_key, args.interval)))
        except MonitorError as exc:
            print(f"snooze: {exc.message}", file=sys.stderr)
            return 1
        return 0
    from snoozeml.monitor.app import MonitorApp

    MonitorApp(args.url, args.api_key, args.interval).run()
    return 0
