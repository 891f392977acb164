"""`snooze pull` end to end, against a Hub-compatible server on 127.0.0.1
(tests/support/fake_hub.py) that huggingface_hub reaches through HF_ENDPOINT: nothing here
touches the internet.

Every pull is a real `python -m snoozeml pull` process; the daemon is the real `snooze serve`,
answering the pulled ONNX model with onnxruntime and the pulled BERT with PyTorch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from daemon import Daemon, free_ports
from fake_hub import FakeHub
from onnx_models import SERVED, write_mlp

from snoozeml.cli import exit_codes

ORG = "snooze-test"
WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "fast", "slow", "red", "blue",
         "model", "serve", "sleep", "wake", "idle", "memory", "batch", "hub", "pull", "text"]


SENTENCES = ["the cat sat on the mat", "a dog ran"]


def in_process_embeddings(folder: Path, sentences: list[str]) -> np.ndarray:
    """Mean-pooled, L2-normalised BERT embeddings computed here, one sentence at a time."""
    import torch
    from tokenizers import Tokenizer
    from transformers import BertModel

    model: Any = BertModel.from_pretrained(folder)
    model.eval()
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rows = []
    for sentence in sentences:
        encoding = tokenizer.encode(sentence)
        ids = torch.tensor([encoding.ids])
        with torch.inference_mode():
            hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                           token_type_ids=torch.tensor([encoding.type_ids])).last_hidden_state
        rows.append(torch.nn.functional.normalize(hidden.mean(dim=1), dim=1)[0].numpy())
    return np.stack(rows)


def tiny_bert(folder: Path) -> dict[str, bytes]:
    """A random 2-layer BERT saved by transformers as safetensors, with a WordPiece
    tokenizer.json built by the tokenizers library: the files of a Hub repository."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = [*specials, *letters, *(f"##{c}" for c in letters), *WORDS]
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=64)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder)

    tokenizer = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)},
                                           unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab.index("[CLS]")), ("[SEP]", vocab.index("[SEP]"))])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    return files


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    made = tmp_path_factory.mktemp("repositories")
    mlp = write_mlp(made / "mlp.onnx", dims=(4, 8, 3)).read_bytes()
    bert_folder = made / "bert"
    bert_folder.mkdir()
    bert = tiny_bert(bert_folder)
    external = made / "external"
    external.mkdir()
    onnx.save_model(onnx.load(str(made / "mlp.onnx")), str(external / "model.onnx"),
                    save_as_external_data=True, location="weights.pb", size_threshold=0)
    not_needed = {"README.md": b"# a model card\n", ".gitattributes": b"*.onnx filter=lfs\n"}
    with FakeHub() as fake:
        fake.add(f"{ORG}/mlp", {**not_needed, "model.onnx": mlp,
                                "training_args.bin": b"pickled trainer state"}, tags=("v1",))
        fake.add(f"{ORG}/tiny-bert", {
            **not_needed, **bert,
            "pytorch_model.bin": b"the same weights, pickled",
            "onnx/model.onnx": mlp, "onnx/model_quantized.onnx": mlp,
        })
        fake.add(f"{ORG}/external-data", {
            **not_needed, **{p.name: p.read_bytes() for p in external.iterdir()}})
        fake.add(f"{ORG}/empty", dict(not_needed))
        fake.add(f"{ORG}/gated-mlp", {**not_needed, "model.onnx": mlp}, gated=True)
        yield fake


def snooze(cwd: Path, *args: str, endpoint: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m snoozeml ARGS` with a clean Hugging Face environment of its own."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("HF_", "HUGGING_FACE_")) and k != "TRANSFORMERS_OFFLINE"}
    clean.update(HF_ENDPOINT=endpoint, HF_HOME=str(cwd / "hf-home"), **env)
    return subprocess.run([sys.executable, "-m", "snoozeml", *args], cwd=cwd, env=clean,
                          capture_output=True, text=True, timeout=180, check=False)


def pull(hub: FakeHub, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    result = snooze(cwd, "pull", *args, endpoint=hub.endpoint, **env)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def entries(config: Path) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in tomllib.loads(config.read_text())["models"]}


def output(body: dict[str, Any], name: str) -> np.ndarray:
    entry = next(o for o in body["outputs"] if o["name"] == name)
    return np.asarray(entry["data"], dtype=np.float32).reshape(entry["shape"])


def files_in(folder: Path) -> dict[str, int]:
    """Downloaded files (not huggingface_hub's .cache metadata) and their mtimes."""
    return {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns for p in folder.rglob("*")
            if p.is_file() and ".cache" not in p.relative_to(folder).parts}


# --- Done means 1: pull, write entries, serve --------------------------------------------


def test_pull_downloads_what_serving_needs_and_the_daemon_serves_both_models(
    hub: FakeHub, tmp_path: Path, serve: Any
) -> None:
    mark = hub.mark()
    for repo in (f"{ORG}/mlp", f"{ORG}/tiny-bert"):
        result = pull(hub, tmp_path, repo)
        assert result.returncode == exit_codes.OK, result.stderr

    models = tmp_path / "models"
    assert set(files_in(models / "snooze-test--mlp")) == {"model.onnx"}
    assert set(files_in(models / "snooze-test--tiny-bert")) == {
        "config.json", "model.safetensors", "tokenizer.json", "vocab.txt"}
    fetched = hub.downloads(mark)
    for unwanted in ("README.md", "training_args.bin", "pytorch_model.bin", "onnx/"):
        assert not any(unwanted in path for path in fetched), fetched

    config = tmp_path / "models.toml"
    written = entries(config)
    assert sorted(written) == ["mlp", "tiny-bert"]
    assert written["mlp"] == {"name": "mlp", "path": "models/snooze-test--mlp/model.onnx",
                              "format": "onnx", "batching": {"max_batch_size": 32}}
    bert = written["tiny-bert"]
    assert (bert["path"], bert["format"], bert["task"], bert["tokenize"]) == (
        "models/snooze-test--tiny-bert", "torch", "feature-extraction", True)

    daemon: Daemon = serve(config.read_text(), directory=tmp_path)
    x = np.random.default_rng(7).standard_normal((3, 4), dtype=np.float32)
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        index = client.post("/v2/repository/index", json={}).json()
        assert sorted(m["name"] for m in index) == ["mlp", "tiny-bert"]
        response = client.post("/v2/models/mlp/infer", json={"inputs": [
            {"name": "x", "shape": [3, 4], "datatype": "FP32", "data": x.ravel().tolist()}]})
        sentences = client.post("/v2/models/tiny-bert/infer", json={
            "inputs": [{"name": "text", "shape": [len(SENTENCES)], "datatype": "BYTES",
                        "data": SENTENCES}],
            "outputs": [{"name": "embedding"}]})
    assert response.status_code == 200, response.text
    session = ort.InferenceSession(str(models / "snooze-test--mlp" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(output(response.json(), "y"), session.run(None, {"x": x})[0],
                               **SERVED)
    # The torch entry serves too: the sentences, tokenized by the daemon, embed as in-process.
    assert sentences.status_code == 200, sentences.text
    np.testing.assert_allclose(output(sentences.json(), "embedding"),
                               in_process_embeddings(models / "snooze-test--tiny-bert", SENTENCES),
                               atol=1e-5)


def test_format_onnx_takes_the_onnx_folder(hub: FakeHub, tmp_path: Path) -> None:
    result = pull(hub, tmp_path, f"{ORG}/tiny-bert", "--format", "onnx")

    assert result.returncode == exit_codes.OK, result.stderr
    assert set(files_in(tmp_path / "models" / "snooze-test--tiny-bert")) == {
        "config.json", "onnx/model.onnx", "tokenizer.json", "vocab.txt"}
    assert entries(tmp_path / "models.toml") == {"tiny-bert-onnx": {
        "name": "tiny-bert-onnx", "path": "models/snooze-test--tiny-bert/onnx/model.onnx",
        "format": "onnx", "batching": {"max_batch_size": 32}}}


def test_external_data_named_by_the_model_comes_along(hub: FakeHub, tmp_path: Path) -> None:
    result = pull(hub, tmp_path, f"{ORG}/external-data")

    assert result.returncode == exit_codes.OK, result.stderr
    assert set(files_in(tmp_path / "models" / "snooze-test--external-data")) == {
        "model.onnx", "weights.pb"}
    assert list(entries(tmp_path / "models.toml")) == ["external-data"]


def test_pulling_again_changes_nothing(hub: FakeHub, tmp_path: Path) -> None:
    repos = (f"{ORG}/mlp@v1", f"{ORG}/tiny-bert")
    for repo in repos:
        assert pull(hub, tmp_path, repo).returncode == exit_codes.OK
    config = tmp_path / "models.toml"
    before = config.read_bytes()
    files = files_in(tmp_path / "models")
    mark = hub.mark()

    for repo in repos:
        again = pull(hub, tmp_path, repo)
        assert again.returncode == exit_codes.OK, again.stderr
        assert "nothing changed" in again.stdout

    assert config.read_bytes() == before
    assert files_in(tmp_path / "models") == files
    assert hub.downloads(mark, "GET") == []
    assert hub.downloads(mark, "HEAD") == []


def test_offline_mode_uses_what_was_pulled_and_nothing_else(hub: FakeHub,
                                                            tmp_path: Path) -> None:
    assert pull(hub, tmp_path, f"{ORG}/mlp").returncode == exit_codes.OK
    config = tmp_path / "models.toml"
    before = config.read_bytes()
    mark = hub.mark()

    again = pull(hub, tmp_path, f"{ORG}/mlp", HF_HUB_OFFLINE="1")
    missing = pull(hub, tmp_path, f"{ORG}/tiny-bert", HF_HUB_OFFLINE="1")

    assert again.returncode == exit_codes.OK, again.stderr
    assert config.read_bytes() == before
    assert missing.returncode == exit_codes.HUB_UNREACHABLE
    assert "HF_HUB_OFFLINE is set" in missing.stderr
    assert hub.requests()[mark:] == []


def test_a_token_from_hf_token_opens_a_gated_repository(hub: FakeHub, tmp_path: Path) -> None:
    result = pull(hub, tmp_path, f"{ORG}/gated-mlp", HF_TOKEN=hub.token)

    assert result.returncode == exit_codes.OK, result.stderr
    assert "gated-mlp" in entries(tmp_path / "models.toml")


# --- Done means 3: every failure its own message and exit code -----------------------------


@pytest.mark.parametrize(("reference", "code", "message"), [
    (f"{ORG}/no-such-model", exit_codes.REPO_NOT_FOUND,
     "repository snooze-test/no-such-model not found"),
    (f"{ORG}/mlp@v9", exit_codes.REVISION_NOT_FOUND, "revision 'v9' not found in snooze-test/mlp"),
    (f"{ORG}/empty", exit_codes.NOTHING_SERVABLE,
     "snooze-test/empty (revision main) has nothing SnoozeML can serve"),
    (f"{ORG}/gated-mlp", exit_codes.ACCESS_DENIED,
     "snooze-test/gated-mlp is a gated repository and no token is set"),
])
def test_pull_failures(hub: FakeHub, tmp_path: Path, reference: str, code: int,
                       message: str) -> None:
    result = pull(hub, tmp_path, reference)

    assert result.returncode == code, result.stderr
    assert f"snooze: {message}" in result.stderr
    assert not (tmp_path / "models.toml").exists()


def test_an_unusable_models_toml_stops_the_pull_before_any_download(
    hub: FakeHub, tmp_path: Path
) -> None:
    config = tmp_path / "models.toml"
    config.write_text("[[models]\nname = 'broken'\n")
    mark = hub.mark()

    result = pull(hub, tmp_path, f"{ORG}/mlp")

    assert result.returncode == exit_codes.USAGE
    assert "invalid TOML" in result.stderr
    assert hub.requests()[mark:] == []
    assert config.read_text() == "[[models]\nname = 'broken'\n"


def test_an_unreachable_hub(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{free_ports()[0]}"

    result = snooze(tmp_path, "pull", f"{ORG}/mlp", endpoint=endpoint)

    assert result.returncode == exit_codes.HUB_UNREACHABLE, result.stderr
    assert f"snooze: cannot reach the Hub at {endpoint}" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "models.toml").exists()

