"""`snooze scan DIR [--write models.toml]`: find models in a folder; print their entries, or
merge them into a models.toml."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "scan", help="find ONNX and safetensors models in a folder and print their entries",
        description="Find ONNX and safetensors models under DIR and print [[models]] entries "
                    "for them (paths relative to the current directory), or add them to a "
                    "models.toml with --write.")
    parser.add_argument("directory", type=Path, metavar="DIR",
                        help="the folder to scan (or one model file)")
    parser.add_argument("--write", type=Path, metavar="CONFIG",
                        help="add the models this file lacks to it (created if missing), "
                             "keeping everything it has; paths are written relative to it")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from snoozeml.cli import exit_codes
    from snoozeml.hub import merge_into, render_toml, scan

    directory: Path = args.directory
    if not directory.exists():
        print(f"snooze: no such file or folder: {directory}", file=sys.stderr)
        return exit_codes.USAGE
    try:
        result = scan(directory)
        for skipped in result.skipped:
            print(f"snooze: skipped {skipped.path}: {skipped.reason}", file=sys.stderr)
        if not result.models:
            print(f"snooze: no ONNX or safetensors model found in {directory}", file=sys.stderr)
            return exit_codes.NOTHING_SERVABLE
        if args.write is None:
            sys.stdout.write(render_toml(result.models))
            return exit_codes.OK
        merge = merge_into(args.write, result.models)
    except Exception as exc:  # the command's boundary: one line, never a traceback
        return exit_codes.report_failure(exc, "scan")
    for model in merge.added:
        print(f"added {model.name} ({model.format}{f', {model.role}' if model.role else ''}) "
              f"to {args.write}")
    for skip in merge.skipped:
        print(f"kept {skip.model.name}: {skip.reason}")
    if not merge.added:
        print(f"{args.write} already has every model found; nothing changed")
    return exit_codes.OK
