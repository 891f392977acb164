"""Model folders laid out as the Hugging Face Hub lays them out, with stand-in weights: what
`snooze scan` finds and what its entries render from."""

from __future__ import annotations

import json
from pathlib import Path


def hf_folder(folder: Path, architectures: list[str], *, tokenizer: bool = True,
              weights: tuple[str, ...] = ("model.safetensors",)) -> Path:
    """A Hugging Face layout; the scan reads only names and JSON, so weights are stand-ins."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": architectures}))
    for name in weights:
        (folder / name).write_bytes(b"stand-in: the scan never reads weights")
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder
