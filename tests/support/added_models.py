"""A real ModelManager with no configured models and an MLP on disk, and the AddedModels over
it: where the tests of engine/added/models.py and engine/added/modelmesh.py run their scenarios,
step by
step on one event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from onnx_models import write_mlp

from snoozeml.config.settings import parse_config
from snoozeml.engine.added.models import AddedModels
from snoozeml.engine.registry import ModelManager

T = TypeVar("T")


def run_with_added(tmp_path: Path, scenario: Callable[[ModelManager, AddedModels, Path],
                                                      Awaitable[T]],
                   server: dict[str, Any] | None = None) -> T:
    """`server`: the `[server]` table of the config (none by default)."""
    path = write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))
    config = parse_config({"server": server} if server else {},
                          source=tmp_path / "models.toml")

    async def main() -> T:
        manager = ModelManager(config)
        try:
            return await scenario(manager, AddedModels(manager), path)
        finally:
            await manager.shutdown()

    return asyncio.run(main())
