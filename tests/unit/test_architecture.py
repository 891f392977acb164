"""The shape of the code, held by tests: which layer may import which, which folders of a layer
stay apart, no import cycles, no module past 400 lines, and no function past 60 lines without
a reason in its docstring.

    snoozeml.{errors,units,logs,datatypes,operations,heap}, config/, auth/   below everything
    snoozeml.runtime      backends; nothing from engine/ or api/, no web or gRPC library
      runtime/onnx/ and runtime/torch/ never import each other; runtime/text/ neither
    snoozeml.engine       models, batching, memory, events; nothing from api/, no web or gRPC
      engine/batching/ calls its owner back through hooks: no replicas/ or memory/
      engine/observe/ subscribes to events: no batching/, replicas/ or memory/
    snoozeml.api          the transports, through the service: never the runtime
      api/http/ and api/grpc/ never import each other
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import snoozeml

SRC = Path(snoozeml.__file__).parent
WEB = ("fastapi", "starlette", "uvicorn", "grpc", "grpc_health", "grpc_reflection", "httpx")
GENERATED = SRC / "proto"
MODULES = sorted(p for p in SRC.rglob("*.py") if GENERATED not in p.parents)
MAX_LINES = 400
MAX_FUNCTION_LINES = 60
REASON = "Long because"  # how a function past MAX_FUNCTION_LINES says why, in its docstring


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
              "snoozeml.operations", "snoozeml.heap", "snoozeml.config", "snoozeml.auth")
# What each layer, or folder, must not import.
RULES: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (FOUNDATION, ("snoozeml.runtime", "snoozeml.engine", "snoozeml.api", "snoozeml.server",
                  "snoozeml.cli", "snoozeml.hub", *WEB)),
    (("snoozeml.config",), ("snoozeml.auth",)),
    (("snoozeml.runtime",), ("snoozeml.engine", "snoozeml.api", "snoozeml.server", *WEB)),
    (("snoozeml.runtime.onnx",), ("snoozeml.runtime.torch",)),
    (("snoozeml.runtime.torch",), ("snoozeml.runtime.onnx",)),
    (("snoozeml.runtime.text",), ("snoozeml.runtime.onnx", "snoozeml.runtime.torch")),
    (("snoozeml.engine",), ("snoozeml.api", "snoozeml.server", "snoozeml.cli", *WEB)),
    (("snoozeml.engine.batching",), ("snoozeml.engine.replicas", "snoozeml.engine.memory")),
    (("snoozeml.engine.observe",), ("snoozeml.engine.batching", "snoozeml.engine.replicas",
                                    "snoozeml.engine.memory")),
    (("snoozeml.api",), ("snoozeml.runtime", "snoozeml.server", "snoozeml.cli")),
    (("snoozeml.api.http",), ("snoozeml.api.grpc",)),
    (("snoozeml.api.grpc",), ("snoozeml.api.http",)),
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
def test_no_module_is_over_the_line_limit(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_LINES, f"{module_name(path)} has {lines} lines: split it"


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_a_long_function_says_why_in_its_docstring(path: Path) -> None:
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path)))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and (node.end_lineno or node.lineno) - node.lineno + 1 > MAX_FUNCTION_LINES
            and REASON not in (ast.get_docstring(node) or "")]
    assert long == [], (f"{module_name(path)}: split {', '.join(long)}, or say why not "
                        f"('{REASON} ...') in the docstring")


UVICORN_PRIVATE = "snoozeml.api.http.uvicorn_private"
UVICORN_PUBLIC = ("uvicorn", "uvicorn.Config", "uvicorn.Server", "uvicorn.run")


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_only_one_module_touches_uvicorns_internals(path: Path) -> None:
    # An upgrade of uvicorn that drops a private name must break one module, which
    # names it at start (unsupported_uvicorn), not inference somewhere else.
    if module_name(path) == UVICORN_PRIVATE:
        return
    private = sorted(i for i in imports(path)
                     if under(i, "uvicorn") and i not in UVICORN_PUBLIC)
    assert private == [], f"{module_name(path)} imports {private}: go through {UVICORN_PRIVATE}"


MODULE_MAP = SRC.parents[1] / "docs" / "architecture.md"


def test_the_module_map_in_the_docs_names_every_module() -> None:
    section = MODULE_MAP.read_text(encoding="utf-8").split("## Module map", 1)[1]
    named = set(re.findall(r"`([\w/]+\.py)`", section.split("\n## ", 1)[0]))
    modules = {str(p.relative_to(SRC)) for p in MODULES if p.name != "__init__.py"}
    assert sorted(modules - named) == [], "docs/architecture.md's module map misses these"
    stale = {name for name in named - modules if "/" in name and not name.startswith("tests/")}
    assert sorted(stale) == [], "docs/architecture.md's module map names these, which are gone"
