"""The shape of the code, held by tests: which layer may import which, no import cycles, and no
module past ~400 lines without a reason written at its top.

    snoozeml.{errors,units,logs,datatypes,operations,heap,config}     below everything
    snoozeml.runtime      backends; nothing from engine/ or api/, no web or gRPC library
    snoozeml.engine       models, batching, memory, events; nothing from api/, no web or gRPC
    snoozeml.api          the transports
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import snoozeml

SRC = Path(snoozeml.__file__).parent
WEB = ("fastapi", "starlette", "uvicorn", "grpc", "grpc_health", "grpc_reflection", "httpx")
GENERATED = SRC / "proto"
MODULES = sorted(p for p in SRC.rglob("*.py") if GENERATED not in p.parents)
MAX_LINES = 400
REASON = "Long because"  # how a module past MAX_LINES says why, in its docstring


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function (absolute names)."""
    package = module_name(path) if path.name == "__init__.py" else \
        module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(f"{p}.") for p in prefixes)


FOUNDATION = ("snoozeml.errors", "snoozeml.units", "snoozeml.logs", "snoozeml.datatypes",
              "snoozeml.operations", "snoozeml.heap", "snoozeml.config.settings",
              "snoozeml.config.lines", "snoozeml.config.auth", "snoozeml.auth.authenticator",
              "snoozeml.auth.credentials")
# What each layer must not import.
RULES: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (FOUNDATION, ("snoozeml.runtime", "snoozeml.engine", "snoozeml.api", "snoozeml.server",
                  "snoozeml.cli", "snoozeml.hub", *WEB)),
    (("snoozeml.runtime",), ("snoozeml.engine", "snoozeml.api", "snoozeml.server", *WEB)),
    (("snoozeml.engine",), ("snoozeml.api", "snoozeml.server", "snoozeml.cli", *WEB)),
    # The monitor is a client of the daemon's HTTP API, never of its insides.
    (("snoozeml.monitor",), ("snoozeml.runtime", "snoozeml.engine", "snoozeml.api",
                             "snoozeml.server", "snoozeml.hub")),
]


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_each_module_imports_only_from_the_layers_below_it(path: Path) -> None:
    name = module_name(path)
    for layer, forbidden in RULES:
        if under(name, *layer):
            above = sorted(i for i in imports(path) if under(i, *forbidden))
            assert above == [], f"{name} imports {above}"


def test_the_package_has_no_import_cycle() -> None:
    modules = {module_name(path): path for path in MODULES}
    edges = {name: {m for m in imports(path) if m in modules and m != name
                    and not name.startswith(f"{m}.")}  # a package's own __init__ is no edge
             for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name in trail:
            cycle = " -> ".join((*trail[trail.index(name):], name))
            raise AssertionError(f"import cycle: {cycle}")
        if name in done:
            return
        for target in sorted(edges[name]):
            visit(target, (*trail, name))
        done.add(name)

    for name in sorted(modules):
        visit(name, ())


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_a_long_module_says_why_at_its_top(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    if lines > MAX_LINES:
        docstring = ast.get_docstring(ast.parse(text)) or ""
        assert REASON in docstring, (
            f"{module_name(path)} has {lines} lines: split it, or say why not "
            f"('{REASON} ...') in its docstring"
        )
