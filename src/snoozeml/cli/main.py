"""`snooze`: the command line. Each command lives in its own module and stays thin."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from snoozeml import __version__
from snoozeml.heap import pause_collection, resume_collection


def build_parser() -> argparse.ArgumentParser:
    # Imported here, inside main's KeyboardInterrupt guard: Ctrl-C during the first imports
    # must not print a traceback.
    from snoozeml.cli import keys, monitor, pull, scan, serve, token

    parser = argparse.ArgumentParser(
        prog="snooze",
        description="SnoozeML: multi-model inference that scales idle models to zero.",
    )
    parser.add_argument("--version", action="version", version=f"snooze {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve.register(commands)
    pull.register(commands)
    scan.register(commands)
    keys.register(commands)
    token.register(commands)
    monitor.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # The commands' modules load with the cyclic GC off (snoozeml/heap.py); `serve` keeps it off
    # until the daemon has started (server.py resumes it), every other command resumes it now.
    pause_collection()
    try:
        args = build_parser().parse_args(argv)
        if not getattr(args, "starts_daemon", False):
            resume_collection(freeze=False)
        code: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    finally:
        resume_collection(freeze=False)
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
