"""The backend of a model that cannot be served here (runtime/unavailable.py): never out of
memory, counted against the host, and sized as its format would be, without raising."""

from __future__ import annotations

from pathlib import Path

from model_specs import spec_on

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.base import FileSizes
from snoozeml.runtime.unavailable import UnavailableBackend


def test_an_unavailable_backend_never_runs_out_of_memory() -> None:
    assert not UnavailableBackend("missing extra").is_out_of_memory(MemoryError())


def test_an_unavailable_model_counts_against_the_host() -> None:
    assert UnavailableBackend("no").memory_device(spec_on("cuda:0"), ["cuda:0"]) == "cpu"


def test_an_unavailable_model_is_sized_as_its_format_and_never_raises(tmp_path: Path) -> None:
    # A torch model without the torch extra is sized by its weight files, as with the extra.
    backend = UnavailableBackend("torch models need the extra")
    folder = tmp_path / "bert"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    (folder / "sub" / "config.json").write_bytes(b"\0" * 24)
    single = tmp_path / "w.safetensors"
    single.write_bytes(b"\0" * 77)

    def sizes(path: Path) -> FileSizes:
        return backend.file_sizes_blocking(ModelConfig(name="m", path=path, format="torch"))

    assert sizes(folder) == FileSizes(1000, 0)  # config.json takes no model memory
    assert sizes(single) == FileSizes(77, 0)
    assert sizes(tmp_path / "missing") == FileSizes(0, 0)
    assert sizes(tmp_path / "missing" / "model.safetensors") == FileSizes(0, 0)
