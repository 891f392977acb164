"""The book's reference pages are the code's: every models.toml key, SNOOZE_* variable, CLI
command and flag, HTTP route, gRPC method, metric, log event, error kind and lifecycle move the
code defines is documented, and nothing documented is missing from the code. Each test reads
the page's tables (docs/*.md) and the code's own definitions, and compares both ways."""

from __future__ import annotations

import argparse
import ast
import re
import types
import typing
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from snoozeml.api.boundary import ERRORS, OTHER_DOMAIN_ERROR, UNEXPECTED
from snoozeml.api.metrics.prometheus import Metrics
from snoozeml.cli.main import build_parser
from snoozeml.config.env import _ENV_KEYS
from snoozeml.config.settings import Config, parse_config
from snoozeml.engine.lifecycle import TRANSITIONS, Event, State
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.service import InferenceService
from snoozeml.operations import OPERATIONS

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs"
SRC = ROOT / "src" / "snoozeml"


# --- reading the pages ------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    headings: tuple[str, ...]  # the headings it sits under, outermost first
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def _cells(line: str) -> tuple[str, ...]:
    """A table line's cells; `\\|` is a pipe inside a cell."""
    return tuple(cell.strip().replace("\\|", "|")
                 for cell in re.split(r"(?<!\\)\|", line.strip().strip("|")))


def tables(page: str) -> list[Table]:
    """Every table of a page (outside code blocks), with the headings above it."""
    found: list[Table] = []
    headings: list[tuple[int, str]] = []
    block: list[str] = []
    fenced = False

    def close() -> None:
        if len(block) >= 2:
            rows = tuple(_cells(line) for line in block[2:])
            found.append(Table(tuple(text for _, text in headings), _cells(block[0]), rows))
        block.clear()

    for line in (DOCS / page).read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if line.startswith("|"):
            block.append(line)
            continue
        close()
        heading = re.match(r"(#{1,6}) (.*)", line)
        if heading:
            level = len(heading.group(1))
            headings = [(lvl, text) for lvl, text in headings if lvl < level]
            headings.append((level, heading.group(2)))
    close()
    return found


def names(cell: str) -> list[str]:
    """The code spans of a cell, each cut at its first space (`--config CONFIG` is --config)."""
    return [span.split()[0] for span in re.findall(r"`([^`]+)`", cell) if span.strip()]


def nearest(table: Table, pattern: str) -> list[str]:
    """What `pattern` finds in the closest heading above the table that has any."""
    for heading in reversed(table.headings):
        found = re.findall(pattern, heading)
        if found:
            return list(found)
    return []


def differ(documented: object, defined: object, what: str) -> str:
    """An assertion message naming both sides of a difference between two sets or dicts (of
    values, or of sets: then per key)."""
    missing: object
    extra: object
    if isinstance(documented, dict) and isinstance(defined, dict):
        if all(isinstance(v, set) for v in (*documented.values(), *defined.values())):
            missing = {k: sorted(v - documented.get(k, set())) for k, v in defined.items()
                       if v - documented.get(k, set())}
            extra = {k: sorted(v - defined.get(k, set())) for k, v in documented.items()
                     if v - defined.get(k, set())}
        else:
            missing = {k: v for k, v in defined.items() if documented.get(k) != v}
            extra = {k: v for k, v in documented.items() if defined.get(k) != v}
    else:
        assert isinstance(documented, set)
        assert isinstance(defined, set)
        missing = sorted(defined - documented, key=str)
        extra = sorted(documented - defined, key=str)
    return (f"{what}: in the code but not in the docs (or documented otherwise): {missing}; "
            f"in the docs but not in the code (or otherwise there): {extra}")


# --- models.toml: every key of every table ----------------------------------------------------


def _model_in(annotation: object) -> tuple[type[BaseModel] | None, bool]:
    """The settings model an annotation holds (a table, or a list of them: `is_list`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is list:
        model, _ = _model_in(args[0])
        return model, True
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in args:
            model, is_list = _model_in(arg)
            if model is not None:
                return model, is_list
    return None, False


def code_tables() -> dict[str, set[str]]:
    """Each TOML table's keys, by its dotted name: a nested table is a table of its own
    (`server.memory`), a list of tables both a key and a table (`models.inputs`)."""
    keys: dict[str, set[str]] = defaultdict(set)

    def walk(model: type[BaseModel], table: str) -> None:
        for name, field in model.model_fields.items():
            inner, is_list = _model_in(field.annotation)
            if inner is None or is_list:
                keys[table].add(name)
            if inner is not None:
                walk(inner, f"{table}.{name}")

    top = set()
    for name, field in Config.model_fields.items():
        inner, _ = _model_in(field.annotation)
        if inner is None:
            top.add(name)
        else:
            walk(inner, name)
    # `source` is where load_config read the file from: set by it, never written in the file.
    assert top == {"source"}, f"top-level keys that are not tables: {top}"
    return dict(keys)


def documented_tables() -> dict[str, set[str]]:
    """configuration.md's key tables, each under the closest heading naming a TOML table
    (`[server]`, `[[models]]`, `[[models.inputs]]` and `[[models.outputs]]`, …)."""
    keys: dict[str, set[str]] = defaultdict(set)
    for table in tables("configuration.md"):
        if table.header[0] != "key":
            continue
        owners = nearest(table, r"`\[\[?([\w.]+)\]\]?`")
        assert owners, f"a key table under no `[table]` heading: {table.headings}"
        for owner in owners:
            for row in table.rows:
                keys[owner].update(names(row[0]))
    return dict(keys)


def test_every_config_key_is_documented_and_every_documented_key_exists() -> None:
    documented, defined = documented_tables(), code_tables()
    assert documented == defined, differ(documented, defined, "models.toml keys")


def test_every_environment_variable_is_documented_with_the_key_it_overrides() -> None:
    defined = {var: ".".join(("server", *path)) for var, path in _ENV_KEYS.items()}
    documented = {
        names(row[0])[0]: names(row[1])[0]
        for table in tables("configuration.md") if table.header[0] == "variable"
        for row in table.rows
    }
    assert documented == defined, differ(documented, defined, "SNOOZE_* variables")


# --- the command line -------------------------------------------------------------------------


def code_arguments() -> set[tuple[str, str]]:
    """(command, argument) for every command of `snooze` (the command itself with ""), every
    option string and every positional's name; `-h/--help` aside."""
    found: set[tuple[str, str]] = set()

    def walk(parser: argparse.ArgumentParser, command: str) -> None:
        found.add((command, ""))
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if action.option_strings:
                found.update((command, option) for option in action.option_strings)
                continue
            found.add((command, str(action.metavar or action.dest)))
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{command} {name}".strip())

    walk(build_parser(), "")
    return found


def documented_arguments() -> set[tuple[str, str]]:
    """cli.md: each `snooze …` heading is a command; its `argument` tables, its arguments."""
    found: set[tuple[str, str]] = set()
    text = (DOCS / "cli.md").read_text()
    for heading in re.findall(r"^#+ .*`snooze([\w ]*)`", text, flags=re.MULTILINE):
        found.add((heading.strip(), ""))
    for table in tables("cli.md"):
        if table.header[0] != "argument":
            continue
        commands = nearest(table, r"`snooze([\w ]*)`")
        assert len(commands) == 1, f"an argument table under no one command: {table.headings}"
        found.update((commands[0].strip(), name) for row in table.rows for name in names(row[0]))
    return found


def test_every_command_and_flag_is_documented_and_every_documented_one_exists() -> None:
    documented, defined = documented_arguments(), code_arguments()
    assert documented == defined, differ(documented, defined, "snooze commands and arguments")


# --- HTTP routes and gRPC methods -------------------------------------------------------------


def expand(path: str) -> list[str]:
    """Every path an optional-segment notation stands for:
    `/v2/models[/{name}[/versions/{v}]]/stats` is three paths."""
    start = path.find("[")
    if start < 0:
        return [path.replace("{v}", "{version}")]
    depth = 0
    for end in range(start, len(path)):
        depth += {"[": 1, "]": -1}.get(path[end], 0)
        if depth == 0:
            break
    head, inner, rest = path[:start], path[start + 1:end], path[end + 1:]
    return [head + middle + tail for middle in ["", *expand(inner)] for tail in expand(rest)]


def test_every_http_route_is_in_the_route_table_and_every_listed_route_exists() -> None:
    defined = {route for spec in OPERATIONS.values() for route in spec.http}
    documented = {
        (row[0], path)
        for table in tables("http-api.md") if table.header[:2] == ("method", "path")
        for row in table.rows for notation in names(row[1]) for path in expand(notation)
    }
    assert documented == defined, differ(documented, defined, "HTTP routes")


def test_every_grpc_method_is_in_the_service_table_and_every_listed_method_exists() -> None:
    defined = {rpc for spec in OPERATIONS.values() for rpc in spec.grpc}
    documented = {
        f"/{names(row[0])[0]}/{method}"
        for table in tables("grpc-api.md") if table.header[:3] == ("service", "port", "methods")
        for row in table.rows for method in names(row[2])
    }
    assert documented == defined, differ(documented, defined, "gRPC methods")


# --- metrics ----------------------------------------------------------------------------------


def code_metrics() -> dict[str, str]:
    """Every snooze_* family of the daemon's registry, by its exposed name, with its type."""
    manager = ModelManager(parse_config({}))
    try:
        registry = Metrics([], InferenceService(manager).snapshot).registry
        return {
            family.name + ("_total" if family.type == "counter" else ""): family.type
            for family in registry.collect() if family.name.startswith("snooze_")
        }
    finally:
        manager.loader.shutdown()


def test_every_metric_is_documented_with_its_type_and_every_documented_one_exists() -> None:
    documented = {
        names(row[0])[0]: row[1]
        for table in tables("metrics.md") if table.header[0] == "metric"
        for row in table.rows
    }
    defined = code_metrics()
    assert documented == defined, differ(documented, defined, "metrics")


# --- log events -------------------------------------------------------------------------------


def _event_names(node: ast.expr) -> Iterator[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _event_names(node.body)
        yield from _event_names(node.orelse)
    else:
        raise AssertionError(f"a log_event whose name is not a literal: {ast.unparse(node)}")


def code_events() -> set[str]:
    """The first argument of every `log_event(…)` call in src/."""
    found: set[str] = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            function = node.func
            name = function.id if isinstance(function, ast.Name) else \
                function.attr if isinstance(function, ast.Attribute) else None
            if name == "log_event":
                found.update(_event_names(node.args[0]))
    return found


def test_every_log_event_is_documented_and_every_documented_one_is_logged() -> None:
    documented = {
        event
        for table in tables("log-events.md") if table.header[0] == "event"
        for row in table.rows for event in names(row[0])
    }
    defined = code_events()
    assert documented == defined, differ(documented, defined, "log events")


# --- errors -----------------------------------------------------------------------------------


def test_every_error_kind_is_documented_with_its_status_and_code() -> None:
    kinds = [kind for _, kind in ERRORS] + [OTHER_DOMAIN_ERROR, UNEXPECTED]
    defined = {kind.outcome: (str(kind.http_status), kind.grpc_code.name) for kind in kinds}
    documented = {
        names(row[0])[0]: (row[1], names(row[2])[0])
        for table in tables("errors.md") if table.header[0] == "kind"
        for row in table.rows
    }
    assert documented == defined, differ(documented, defined, "error kinds")


# --- the lifecycle diagram --------------------------------------------------------------------


def test_the_lifecycle_diagram_is_the_transition_table() -> None:
    text = (DOCS / "concepts.md").read_text()
    diagram = text.split("```mermaid\nstateDiagram-v2\n")[1].split("```")[0]
    drawn = {
        (State(source), Event(event)): State(target)
        for source, target, event in re.findall(r"^\s*(\w+) --> (\w+): (\w+)$", diagram,
                                                flags=re.MULTILINE)
    }
    assert drawn == TRANSITIONS, differ(drawn, dict(TRANSITIONS), "lifecycle moves")
    explained = {
        event
        for table in tables("concepts.md") if table.header[0] == "event"
        for row in table.rows for event in names(row[0])
    }
    assert explained == {event.value for event in Event}, \
        differ(explained, {event.value for event in Event}, "lifecycle events")
