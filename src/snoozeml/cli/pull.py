"""`snooze pull ORG/NAME[@REVISION]`: download a Hugging Face repository's servable files and
add its models to models.toml."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def _model_name(text: str) -> str:
    if not _NAME.match(text):
        raise argparse.ArgumentTypeError(
            f"invalid model name {text!r} (letters, digits, '_', '-', '.'; starting with a "
            "letter or digit)")
    return text


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "pull", help="download a model from the Hugging Face Hub and add it to models.toml",
        description="Download what serving needs from a Hugging Face repository (weights, "
                    "configs, tokenizer files) into MODELS_DIR/ORG--NAME, then add an entry "
                    "per model to models.toml. HF_TOKEN, HF_ENDPOINT and HF_HUB_OFFLINE work "
                    "as with any Hugging Face tool. Pulling again changes nothing.")
    parser.add_argument("repo", metavar="ORG/NAME[@REVISION]",
                        help="the repository, optionally with a branch, tag or commit")
    parser.add_argument("--revision", metavar="R",
                        help="a branch, tag or commit hash (default: main)")
    parser.add_argument("-c", "--config", type=Path, default=Path("models.toml"),
                        help="the models.toml to add entries to (default: ./models.toml; "
                             "created if missing)")
    parser.add_argument("--models-dir", type=Path, metavar="DIR",
                        help="where repositories are downloaded (default: a models folder "
                             "next to the config file)")
    parser.add_argument("--format", choices=["onnx", "torch"], dest="prefer",
                        help="onnx: download ONNX weights only, preferring the onnx/ folder; "
                             "torch: safetensors only (default: safetensors and top-level ONNX, "
                             "or ONNX when there is nothing else)")
    parser.add_argument("--include", action="append", default=[], metavar="GLOB",
                        help="also download files matching GLOB (repeatable)")
    parser.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                        help="do not download files matching GLOB (repeatable; applied last)")
    parser.add_argument("--name", type=_model_name,
                        help="the model name to write (default: the repository's name)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from snoozeml.cli import exit_codes
    from snoozeml.hub import parse_reference, pull

    config: Path = args.config
    models_dir: Path = args.models_dir or config.absolute().parent / "models"
    try:
        repo_id, revision = parse_reference(args.repo, args.revision)
        result = pull(repo_id, revision, models_dir=models_dir, include=args.include,
                      exclude=args.exclude, prefer=args.prefer, config=config, name=args.name)
    except Exception as exc:  # the command's boundary: one line, never a traceback
        return exit_codes.report_failure(exc, "pull")

    source = (f"commit {result.commit[:12]}" if result.commit
              else "the Hub was unreachable: using the copy already downloaded")
    count = len(result.files)
    print(f"pulled {result.repo_id} (revision {result.revision}, {source}) into {result.folder}: "
          f"{count} file{'' if count == 1 else 's'}")
    for model in result.merge.added:
        print(f"added {model.name} ({model.format}{f', {model.role}' if model.role else ''}) "
              f"to {config}")
    for skip in result.merge.skipped:
        print(f"kept {skip.model.name}: {skip.reason}")
    if not result.merge.added:
        print(f"{config} already has every model of {result.repo_id}; nothing changed")
    return exit_codes.OK
