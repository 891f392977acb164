"""Choosing a Hub repository's files (hub/select.py): the weights of one format with the files
that serve them, `--include` and `--exclude` applied last."""

from __future__ import annotations

import pytest

from snoozeml.hub import select_files

BERT_WITH_EXPORTS = [
    ".gitattributes", "README.md", "config.json", "model.safetensors", "pytorch_model.bin",
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "1_Pooling/config.json",
    "onnx/model.onnx", "onnx/model_quantized.onnx", "onnx/model_fp16.onnx",
    "openvino/openvino_model.xml", "openvino/openvino_model.bin",
]


SUPPORT = ["1_Pooling/config.json", "config.json", "tokenizer.json", "tokenizer_config.json",
           "vocab.txt"]


@pytest.mark.parametrize(("files", "kwargs", "expected"), [
    pytest.param(BERT_WITH_EXPORTS, {}, sorted([*SUPPORT, "model.safetensors"]),
                 id="safetensors by default, no exports or .bin"),
    pytest.param(BERT_WITH_EXPORTS, {"prefer": "onnx"}, sorted([*SUPPORT, "onnx/model.onnx"]),
                 id="--format onnx takes onnx/model.onnx"),
    pytest.param(BERT_WITH_EXPORTS, {"prefer": "onnx",
                                     "include": ["onnx/model_quantized.onnx"],
                                     "exclude": ["onnx/model.onnx"]},
                 sorted([*SUPPORT, "onnx/model_quantized.onnx"]),
                 id="--include adds, --exclude removes"),
    pytest.param(["model.onnx", "model.onnx_data", "README.md", "train.bin"], {},
                 ["model.onnx", "model.onnx_data"], id="top-level onnx with its external data"),
    pytest.param(["onnx/model_q4.onnx", "onnx/model_fp16.onnx", "config.json"], {},
                 ["config.json", "onnx/model_fp16.onnx", "onnx/model_q4.onnx"],
                 id="only onnx/ variants and no model.onnx: all of them"),
    pytest.param(["config.json", "model.safetensors", "onnx/model.onnx"], {"prefer": "torch"},
                 ["config.json", "model.safetensors"], id="--format torch"),
    pytest.param(["README.md", ".gitattributes"], {}, [], id="nothing servable"),
    pytest.param(["config.json", "model.safetensors"], {"exclude": ["*.safetensors"]},
                 ["config.json"], id="exclude applies last"),
    pytest.param(["m.onnx", "extra/notes.txt"], {"include": ["extra/"]},
                 ["extra/notes.txt", "m.onnx"], id="a folder pattern means its files"),
])
def test_select_files(files: list[str], kwargs: dict[str, object], expected: list[str]) -> None:
    assert select_files(files, **kwargs) == expected  # type: ignore[arg-type]
