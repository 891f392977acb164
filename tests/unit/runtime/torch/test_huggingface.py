"""A Hugging Face model served in process (runtime/torch/huggingface.py): a batch answers each
request as it would alone, and validation refuses a token id outside the vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from snoozeml.config.settings import ModelConfig
from snoozeml.errors import InvalidInput


def test_a_hugging_face_batch_answers_each_request_as_it_would_alone(
    torch_backend: Any, tmp_path: Path,
) -> None:
    from torch_models import TINY_BERT, save_bert, token_rows

    save_bert(tmp_path / "bert", **TINY_BERT)
    spec = ModelConfig(name="bert", path=tmp_path / "bert", format="torch", device="cpu")
    instance = torch_backend().load_blocking(spec)
    requests = []
    # Token ids share their width (requests of other widths are never batched together).
    for seed, lengths in enumerate([[3, 5], [2], [7, 1, 4]]):
        ids, mask = token_rows(lengths, 7, seed)
        request = {"input_ids": ids, "attention_mask": mask}
        instance.validate_inputs(request)
        requests.append(request)

    try:
        batched = instance.run_batch_blocking(requests, None)
        alone = [instance.run_blocking(request, None) for request in requests]
    finally:
        instance.close()

    for request, together, by_itself in zip(requests, batched, alone, strict=True):
        rows, width = request["input_ids"].shape
        assert together["last_hidden_state"].shape == (rows, width, TINY_BERT["hidden_size"])
        assert together["embedding"].shape == (rows, TINY_BERT["hidden_size"])
        for name in ("last_hidden_state", "embedding"):
            np.testing.assert_allclose(together[name], by_itself[name], rtol=1e-4, atol=1e-5)


def test_hugging_face_validation_refuses_a_token_id_outside_the_vocabulary(
    torch_backend: Any, tmp_path: Path,
) -> None:
    from torch_models import TINY_BERT, save_bert

    save_bert(tmp_path / "bert", **TINY_BERT)
    spec = ModelConfig(name="bert", path=tmp_path / "bert", format="torch", device="cpu")
    instance = torch_backend().load_blocking(spec)
    ids = np.array([[1, TINY_BERT["vocab_size"]]], np.int64)
    try:
        with pytest.raises(InvalidInput, match="outside"):
            instance.validate_inputs({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    finally:
        instance.close()


def test_text_rows_over_max_batch_tokens_run_sorted_by_length_and_answer_as_alone(
    torch_backend: Any,
) -> None:
    from torch_models import MINILM, SENTENCES

    spec = ModelConfig.model_validate({
        "name": "minilm", "path": MINILM, "format": "torch", "device": "cpu",
        "task": "feature-extraction", "tokenize": True, "batching": {"max_batch_tokens": 64}})
    instance = torch_backend().load_blocking(spec)
    widths: list[tuple[int, int]] = []
    hook = instance.model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True)
    requests = [{"text": np.array(SENTENCES[:4], dtype=object)},
                {"text": np.array(SENTENCES[4:], dtype=object)}]
    try:
        for request in requests:
            instance.validate_inputs(request)
        batched = instance.run_batch_blocking(requests, ["embedding", "token_count"])
        sorted_runs = list(widths)
        widths.clear()
        whole = instance.run_batch_blocking(requests, ["last_hidden_state", "embedding"])
        whole_runs = list(widths)
    finally:
        hook.remove()
        instance.close()

    counts = np.concatenate([part["token_count"] for part in batched])
    assert len(sorted_runs) > 1
    assert sum(rows for rows, _ in sorted_runs) == len(SENTENCES)
    assert all(rows * width <= 64 or rows == 1 for rows, width in sorted_runs)
    assert sorted(width for _, width in sorted_runs) == [width for _, width in sorted_runs]
    # With the token vectors wanted, the batch runs whole, padded to its longest row.
    assert whole_runs == [(len(SENTENCES), int(counts.max()))]
    for together, padded in zip(batched, whole, strict=True):
        np.testing.assert_allclose(together["embedding"], padded["embedding"], atol=1e-5)
