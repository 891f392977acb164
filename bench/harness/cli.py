"""The options every scenario shares, parsed once, and :class:`Bench`, what a scenario's
``run`` gets: its options, a scratch folder, the daemon starter and the report's header.

A scenario's row in ``scenarios.SCENARIOS`` says which common options it takes and their
defaults (``--duration`` is 10 s for one, 20 for another); its module's ``add_options`` adds
only what is its own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from harness.daemon import Daemon, serving
from harness.report import Outcome, command_line, machine_line


def seconds(text: str) -> float:
    """``600``, ``90s``, ``10m`` or ``1h`` as seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    text = text.strip()
    if text and text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text)


def seconds_or_share(text: str) -> float | str:
    """A duration, or a share of ``--duration`` (``20%``), resolved once both are parsed."""
    return text.strip() if text.strip().endswith("%") else seconds(text)


# name -> (flag, argparse keywords, help with {default} where it goes)
COMMON: dict[str, tuple[str, dict[str, Any], str]] = {
    "duration": ("--duration", {"type": seconds, "metavar": "S"},
                 "measured seconds per run: 10, 90s, 10m ({default})"),
    "warm_up": ("--warm-up", {"type": seconds_or_share, "metavar": "S"},
                "seconds of load before each measured run, or a share of --duration "
                "such as 20%% ({default})"),
    "rounds": ("--rounds", {"type": int, "metavar": "N"},
               "rounds of every case, the order changed every round ({default})"),
    "concurrency": ("--concurrency", {"type": int, "nargs": "+", "metavar": "C"},
                    "requests in flight, one or more levels ({default})"),
    "wrk_threads": ("--wrk-threads", {"type": int, "metavar": "N"},
                    "wrk threads (default: {default})"),
    "seed": ("--seed", {"type": int}, "seed of the inputs and the traffic ({default})"),
}


def build_parser(name: str, common: dict[str, Any], parts: Sequence[str],
                 module: ModuleType) -> argparse.ArgumentParser:
    """The scenario's parser: the common options it takes, with its defaults, then its own."""
    parser = argparse.ArgumentParser(
        prog=f"bench/run.py {name}", description=module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    for key, default in common.items():
        flag, kwargs, help_text = COMMON[key]
        shown = "1 at c1, 2 above" if key == "wrk_threads" and default is None else default
        if isinstance(shown, list):
            shown = " ".join(map(str, shown))
        parser.add_argument(flag, dest=key, default=default,
                            help=help_text.format(default=shown), **kwargs)
    if parts:
        parser.add_argument("--only", choices=parts, help="run one part only (default: all)")
    parser.add_argument("--out", type=Path, help="also write the markdown report to this file")
    parser.add_argument("--json", type=Path, help="also write the raw numbers to this file")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that runs the daemon (default: this one)")
    add_options: Callable[[argparse.ArgumentParser], None] | None = getattr(
        module, "add_options", None)
    if add_options is not None:
        add_options(parser)
    return parser


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """``--warm-up 20%`` as seconds of ``--duration``."""
    share = getattr(args, "warm_up", None)
    if isinstance(share, str):
        args.warm_up = getattr(args, "duration", 0.0) * float(share[:-1]) / 100
    return args


class Bench:
    """One run of a scenario: its options (``args``), a scratch folder (``workdir``, removed
    afterwards) and the machine line read when it started."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.machine = machine_line()

    def serve(self, config: Path, models: Sequence[str] = (), **kwargs: Any,
              ) -> contextlib.AbstractContextManager[Daemon]:
        """A daemon of ``--python`` serving ``config``: see :func:`harness.daemon.serving`."""
        return serving(self.args.python, config, models, **kwargs)

    def only(self, part: str) -> bool:
        """Whether ``part`` runs (``--only`` names it, or nothing)."""
        chosen = getattr(self.args, "only", None)
        return chosen is None or chosen == part

    def header(self, title: str, *notes: str) -> list[str]:
        """The report's first lines: the title, the machine, the command, then ``notes``."""
        return [title, "", f"- {self.machine}", f"- command: `{command_line()}`",
                *(f"- {note}" for note in notes), ""]


@contextlib.contextmanager
def bench(args: argparse.Namespace) -> Iterator[Bench]:
    with tempfile.TemporaryDirectory(prefix="snooze-bench-") as tmp:
        yield Bench(resolve(args), Path(tmp))


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return str(value)


def publish(outcome: Outcome, run: Bench) -> int:
    """Print the report, write ``--out`` and ``--json``; the exit code."""
    print(outcome.markdown)
    args = run.args
    if args.out is not None:
        args.out.write_text(outcome.markdown.rstrip("\n") + "\n", encoding="utf-8")
    if args.json is not None:
        raw = {"machine": run.machine, "command": command_line(),
               "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
               **(outcome.raw or {})}
        args.json.write_text(json.dumps(raw, indent=1, default=_plain) + "\n", encoding="utf-8")
    return 0 if outcome.passed else 1
