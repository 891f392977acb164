"""What authentication costs: the check in-process, and the infer path with auth on vs off
(issue 12).

1. In-process (``--only in-process``). ``Authenticator.check(Operation.INFER, authorization,
   api_key)`` timed with ``timeit`` (``--calls`` calls per run, the median of ``--repeats``
   runs, µs per call), for: auth off; an API key in ``X-API-Key``; the same key as
   ``Authorization: Bearer``; a JWT HS256; a JWT RS256 (2048-bit); a JWT never seen before
   (first use); and, for the cost of a refusal, an unknown key and an HS256 token with a wrong
   signature. The authenticator is built from a ``models.toml`` by the daemon's own config
   loader, with ``--keys`` API keys configured (a check compares against every one).
2. End to end (``--only end-to-end``). Two daemons at once on the bench MLP (preloaded,
   pinned, one intra-op thread): ``off`` without ``[auth]``, ``on`` with API keys from
   ``snooze keys new`` and HS256 JWTs (the secret in an environment variable, the token from
   ``snooze token``). wrk sends the one-row JSON body at each ``--concurrency`` (1 and 32) to
   ``off``, ``key`` (``X-API-Key`` to ``on``) and ``jwt`` (``Authorization: Bearer`` to
   ``on``), ``--rounds`` rounds, the order reversed every other round, a warm-up then
   ``--duration`` seconds each. The report gives medians, the daemon's CPU per request and the
   ratios on/off paired within a round. One answer per variant is checked before and after;
   ``on`` must refuse a request without credentials (401) and a load by the key (403), and
   count no refusal during the runs.

It never prints a key, token or secret.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import httpx
from harness.cli import Bench
from harness.oip import new_session, random_rows, write_body
from harness.pairs import PairedRun, measure, medians_table, ratios
from harness.report import Outcome, table
from harness.rounds import alternate
from harness.status import admin_status, check_infer, wait_loaded
from models import write_bench_mlp

from scenarios.auth.credentials import MODEL, CheckCost, Credentials, in_process, write_configs

WIDTH = 64  # the bench MLP's input features
VARIANTS = ("off", "key", "jwt")


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=20_000,
                        help="in-process: calls per timed run (20000)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="in-process: timed runs per credential (5)")
    parser.add_argument("--keys", type=int, default=3,
                        help="API keys in the config; each check compares against all (3)")


def end_to_end(bench: Bench, off_config: Path, creds: Credentials) -> list[PairedRun]:
    """Long because it checks the two daemons (answers, refusals, the auth_disabled line)
    before and after the rounds it runs; each step is a line or two."""
    args, workdir = bench.args, bench.workdir
    model_input = random_rows(1, WIDTH)
    body = workdir / "body.json"
    write_body(body, model_input)
    expected = new_session(workdir / "mlp.onnx").run(None, {"x": model_input})[0]
    headers = {"off": {}, "key": {"X-API-Key": creds.key},
               "jwt": {"Authorization": f"Bearer {creds.hs_token}"}}
    runs: list[PairedRun] = []
    with contextlib.ExitStack() as stack:
        off = stack.enter_context(bench.serve(off_config, [MODEL]))
        on = stack.enter_context(bench.serve(creds.config, env=creds.env))
        daemons = {"off": off, "key": on, "jwt": on}
        clients = {v: stack.enter_context(httpx.Client(base_url=daemons[v].base_url,
                                                       timeout=60.0, headers=headers[v]))
                   for v in VARIANTS}
        for client in clients.values():
            wait_loaded(client, MODEL)  # preloaded: no load inside the timings
            check_infer(client, MODEL, model_input, expected)
        if (status := on.client.post(f"/v2/models/{MODEL}/infer", json={}).status_code) != 401:
            raise RuntimeError(f"auth on: infer without credentials got {status}")
        if "auth_disabled" in "\n".join(on.log) or "auth_disabled" not in "\n".join(off.log):
            raise RuntimeError("auth_disabled logged by the wrong daemon")
        response = clients["key"].post(f"/v2/repository/models/{MODEL}/load")
        if response.status_code != 403:
            raise RuntimeError(f"auth on: a load by an inference key got {response.status_code}")
        refused_before = admin_status(clients["key"]).get("auth_refusals")
        for round_no in range(1, args.rounds + 1):
            for connections in args.concurrency:
                for variant in alternate(VARIANTS, round_no - 1):
                    runs.append(measure(daemons[variant], MODEL, body, variant, connections,
                                        round_no, args, headers[variant],
                                        client=clients[variant]))
        for client in clients.values():  # still right after the load
            check_infer(client, MODEL, model_input, expected)
        refused_after = admin_status(clients["key"]).get("auth_refusals")
        if refused_after != refused_before:
            raise RuntimeError(f"refusals during the runs: {refused_before} -> {refused_after}")
    return runs


def run(bench: Bench) -> Outcome:
    args = bench.args
    # The token must outlive the whole run.
    total_s = args.rounds * len(args.concurrency) * len(VARIANTS) * (
        args.duration + args.warm_up + 5)
    write_bench_mlp(bench.workdir / "mlp.onnx")
    off_config, creds = write_configs(bench.workdir, args.python, args.keys,
                                      f"{max(1, int(total_s // 3600) + 1)}h")
    lines = bench.header("## Auth benchmark: the cost of API keys and JWTs")
    costs: list[CheckCost] = []
    runs: list[PairedRun] = []
    if bench.only("in-process"):
        costs = in_process(creds, args.calls, args.repeats)
        lines += in_process_report(costs, args)
    if bench.only("end-to-end"):
        runs = end_to_end(bench, off_config, creds)
        lines += end_to_end_report(runs, args)
    return Outcome("\n".join(lines), {"in_process": costs, "runs": runs})


def in_process_report(costs: list[CheckCost], args: argparse.Namespace) -> list[str]:
    lines = [
        "### In-process: `Authenticator.check(Operation.INFER, …)`", "",
        f"{args.calls:,} calls per run (first uses: {max(1, min(args.calls // 10, 1000)):,}), "
        f"median of {args.repeats} runs; {args.keys} API keys configured. `again`: the same "
        "token every call, remembered after its first verification until its `exp`; `first "
        "use`: a token never seen before every call, verified in full.", ""]
    lines += table(["credential", "µs per check (median)", "range of runs"],
                   [(c.label, f"{c.median_us:.2f}",
                     f"{min(c.us_per_call):.2f} to {max(c.us_per_call):.2f}") for c in costs])
    return [*lines, ""]


def end_to_end_report(runs: list[PairedRun], args: argparse.Namespace) -> list[str]:
    lines = [
        "### End to end: infer with auth off and on", "",
        f"wrk -t{args.wrk_threads}, one-row JSON body; {args.rounds} round(s), each variant "
        f"{args.warm_up:g} s warm-up then {args.duration:g} s, the order reversed every other "
        "round. `key`: `X-API-Key`; `jwt`: `Authorization: Bearer` HS256.", ""]
    lines += medians_table(runs, VARIANTS)
    lines += ["", "Ratios on/off, paired within each round: median (range). A pair whose two "
              "runs differ in inline batches (see docs/batching.md) is left out when others "
              "remain.", ""]
    lines += table(["load", "variant", "req/s on/off", "p50 on/off", "p99 on/off",
                    "CPU µs/request on - off"],
                   [(f"c{c}", v, *ratios(runs, v, "off", c, same_inline=True))
                    for c in args.concurrency for v in VARIANTS[1:]], "llrrrr")
    return [*lines, ""]
