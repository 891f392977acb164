"""Run one benchmark scenario and print its markdown report.

Usage (from the repository root, after ``bash bench/setup.sh``)::

    .venv/bin/python bench/run.py --list            # the scenarios, one line each
    .venv/bin/python bench/run.py NAME [options]    # e.g. http --duration 30 --out FILE
    .venv/bin/python bench/run.py NAME --help       # its options

The harness (``harness/``) parses the options every scenario shares, makes a scratch folder,
and prints the report (``--out FILE`` writes it there too, ``--json FILE`` the raw numbers);
the scenario (``scenarios/NAME``) starts its daemons, drives its load and writes its tables.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Sequence

from harness.cli import bench, build_parser, publish
from scenarios import SCENARIOS


def listing() -> str:
    width = max(map(len, SCENARIOS))
    lines = ["usage: bench/run.py NAME [options]   (NAME --help for its options)", ""]
    lines += [f"  {name:<{width}}  {s.duration:>8}  {s.summary}" for name, s in SCENARIOS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "-l", "--list"):
        print(listing())
        return 0 if argv else 2
    name = argv[0].removeprefix("run_").removesuffix(".py").replace("-", "_")
    scenario = SCENARIOS.get(name)
    if scenario is None:
        print(f"unknown scenario {argv[0]!r}\n\n{listing()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"scenarios.{scenario.module}")
    args = build_parser(name, dict(scenario.common), scenario.parts, module).parse_args(argv[1:])
    if scenario.wrk and getattr(args, "only", None) != "in-process" and not shutil.which("wrk"):
        print("wrk not found; run: bash bench/setup.sh", file=sys.stderr)
        return 2
    with bench(args) as run:
        return publish(module.run(run), run)


if __name__ == "__main__":
    sys.exit(main())
