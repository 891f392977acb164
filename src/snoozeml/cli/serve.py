"""`snooze serve`: load models.toml and run the daemon until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from snoozeml.config.settings import Config, load_config, parse_config
from snoozeml.errors import ConfigError
from snoozeml.logs import configure_logging


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} is out of range 0..65535")
    return value


def _host(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the host must not be empty")
    return text


def register(commands: Any) -> None:
    parser = commands.add_parser("serve", help="run the inference daemon")
    parser.add_argument("-c", "--config", type=Path, default=Path("models.toml"),
                        help="models.toml to serve (default: ./models.toml)")
    parser.add_argument("--host", type=_host,
                        help="address to listen on (overrides [server].host)")
    parser.add_argument("--http-port", type=_port, help="HTTP port; 0 picks a free one")
    parser.add_argument("--grpc-port", type=_port, help="gRPC port; 0 picks a free one")
    parser.add_argument("--log-level", type=str.lower,
                        choices=["debug", "info", "warning", "error"])
    parser.add_argument("--model", action="append", default=[], type=_model_arg,
                        metavar="NAME=PATH",
                        help="also serve the model at PATH (an .onnx file, a folder holding "
                        "one, or a safetensors model folder) as NAME; repeatable. Without a "
                        "config file, the server's defaults apply")
    # The cyclic GC stays paused until the daemon has started (cli/main.py, server.py).
    parser.set_defaults(handler=run, starts_daemon=True)


def _model_arg(text: str) -> tuple[str, Path]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, not {text!r}")
    return name, Path(path).absolute()


def _with_models(config: Config, models: list[tuple[str, Path]]) -> Config:
    """`config` with the `--model` entries added (ConfigError naming each that cannot be)."""
    if not models:
        return config  # the Hub package's scanners are imported only for a --model
    from snoozeml.errors import InvalidInput
    from snoozeml.hub.by_path import spec_for_path

    taken = {m.name for m in config.models}
    added = []
    problems = []
    for name, path in models:
        if name in taken:
            problems.append(f"--model {name}: a model named {name!r} is already configured")
            continue
        try:
            added.append(spec_for_path(name, path, config.server))
        except InvalidInput as exc:
            problems.append(f"--model {name}: {exc.message}")
        taken.add(name)
    if problems:
        raise ConfigError(problems)
    return config.model_copy(update={"models": [*config.models, *added]})


def _apply_flags(config: Config, args: argparse.Namespace) -> Config:
    overrides = {
        key: value
        for key, value in (
            ("host", args.host),
            ("http_port", args.http_port),
            ("grpc_port", args.grpc_port),
            ("log_level", args.log_level),
        )
        if value is not None
    }
    if not overrides:
        return config
    return config.model_copy(update={"server": config.server.model_copy(update=overrides)})


def run(args: argparse.Namespace) -> int:
    from snoozeml.auth.authenticator import Authenticator
    from snoozeml.engine.memory.probes import visible_gpus

    try:
        if args.model and not args.config.exists():  # the models come from the flags alone
            config = parse_config({}, environ=os.environ)
        else:
            config = load_config(args.config, os.environ, visible_gpus())
        config = _with_models(_apply_flags(config, args), args.model)
        auth = Authenticator.from_config(config.auth, os.environ)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"snooze: {problem}", file=sys.stderr)
        print(f"snooze: invalid configuration ({len(exc.problems)} problem(s)); not starting",
              file=sys.stderr)
        return 2
    configure_logging(config.server.log_level)
    if config.source is not None and any(m.module for m in config.models):
        # `module = "pkg.mod:factory"` may name a module next to models.toml.
        sys.path.append(str(config.source.parent))

    from snoozeml.heap import limit_malloc_arenas

    limit_malloc_arenas()  # before the heavy imports and the threads they start
    from snoozeml.api.http.uvicorn_private import unsupported_uvicorn

    lacking = unsupported_uvicorn()
    if lacking is not None:  # the HTTP protocol would break on its first request, or sooner
        print(f"snooze: {lacking}", file=sys.stderr)
        print("snooze: unsupported uvicorn; not starting", file=sys.stderr)
        return 2
    from snoozeml.server import Daemon  # the heavy imports only once the config is valid

    loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop on Linux/macOS
        pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(Daemon(config, auth).run())
