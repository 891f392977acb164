"""Backends: base.py is the contract every backend meets; one folder a backend (onnx/, torch/),
and text/ for the tokenizer side both share. Imports nothing from engine/ or api/."""
