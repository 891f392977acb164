"""What authentication costs: the check in-process, and the infer path with auth on vs off.

Usage (from the repository root, after ``bash bench/setup.sh``)::

    .venv/bin/python bench/run_auth.py [--duration 10] [--rounds 3] [--out results.md]

1. In-process. ``Authenticator.check(Operation.INFER, authorization, api_key)`` timed with
   ``timeit`` (``--calls`` calls per run, the median of ``--repeats`` runs, in microseconds
   per call), for: auth off; an API key in ``X-API-Key``; the same key as ``Authorization:
   Bearer``; a JWT HS256; a JWT RS256 (2048-bit key, a PEM public key in the config); and,
   for the cost of a refusal, an unknown key and an HS256 token with a wrong signature. The
   authenticator is built from a ``models.toml`` by the daemon's own config loader, with
   ``--keys`` API keys configured (a check compares against every one). Tokens are verified
   every time: nothing is cached.
2. End to end. Two daemons at once on the bench MLP (64 -> 256 -> 64, preloaded, pinned,
   ``intra_op_threads = 1``): ``off`` without ``[auth]``, ``on`` with one API key from
   ``snooze keys new`` and HS256 JWTs (the secret in an environment variable, the token from
   ``snooze token``). wrk sends the one-row JSON infer body at ``-c1`` and ``-c32`` to three
   variants: ``off`` (no credentials), ``key`` (``X-API-Key`` to the ``on`` daemon) and
   ``jwt`` (``Authorization: Bearer <token>`` to it). ``--rounds`` rounds; in each, per load,
   the three variants one after the other (the order reversed every other round), each a wrk
   warm-up then ``--duration`` seconds. The report gives the median requests/s, p50 and p99 of
   each, the daemon's CPU time per request (psutil: user + system, all threads), and the
   ratios on/off, paired within a round (seconds apart, so they share the machine's drift).
   One answer per variant is checked against onnxruntime in-process before and after; the
   ``on`` daemon must refuse a request without credentials (401) and a load by the key
   (403), and must count no refusal during the runs.

Prints a markdown report; ``--out FILE`` also writes it there, ``--json FILE`` the raw numbers.
It never appends to any file, never prints a key, token or secret, and stops every daemon it
started, also on errors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from harness import (
    Daemon,
    check_infer,
    command_line,
    machine_line,
    median_or_nan,
    model_status,
    new_session,
    process_cpu_s,
    random_rows,
    run_wrk,
    spread,
    wait_loaded,
    wait_ready,
    write_body,
    wrk_errors,
)
from models import write_bench_mlp

MODEL = "mlp"
WIDTH = 64  # the bench MLP's input features
SECRET_ENV = "SNOOZE_BENCH_JWT_SECRET"
LOADS = (1, 32)  # wrk connections
VARIANTS = ("off", "key", "jwt")


# --- configuration -----------------------------------------------------------------------

SERVER = f"""\
[server]
host = "127.0.0.1"
http_port = 0
grpc_port = 0
idle_timeout = "never"

[[models]]
name = "{MODEL}"
path = "mlp.onnx"
preload = true
intra_op_threads = 1
"""


def snooze(python: str, *args: str, env: dict[str, str] | None = None) -> str:
    """``python -m snoozeml ARGS``'s stdout (raises with its stderr if it fails)."""
    done = subprocess.run([python, "-m", "snoozeml", *args], capture_output=True, text=True,
                          env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"snooze {args[0]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done.stdout


def new_api_key(python: str, role: str, name: str) -> tuple[str, str]:
    """A key from ``snooze keys new``, and the config entry it printed for it (its hash)."""
    out = snooze(python, "keys", "new", "--role", role, "--name", name)
    key = next((word for word in out.split() if word.startswith("snz_")), None)
    entry = re.search(r"\{[^{}]*\bsha256 = \"[0-9a-f]{64}\"[^{}]*\}", out)
    if key is None or entry is None:
        raise RuntimeError("snooze keys new printed no snz_ key or no config entry")
    return key, entry.group(0)


def mint_token(python: str, config: Path, env: dict[str, str], ttl: str) -> str:
    """A HS256 token for the inference role from ``snooze token``."""
    out = snooze(python, "token", "--role", "inference", "--ttl", ttl, "--subject", "bench",
                 "-c", str(config), env=env)
    token = next((word for word in out.split() if word.count(".") == 2), None)
    if token is None:
        raise RuntimeError("snooze token printed no token")
    return token


@dataclass(frozen=True)
class Credentials:
    key: str  # an API key of role inference
    hs_token: str
    rs_token: str
    config: Path  # the auth-on models.toml
    env: dict[str, str]  # the environment with the JWT secret
    private: rsa.RSAPrivateKey  # signs RS256 tokens

    def fresh_tokens(self, count: int, algorithm: str) -> list[str]:
        """`count` different tokens (each `jti` its own), so none was seen before."""
        now = int(time.time())
        key: Any = self.env[SECRET_ENV] if algorithm == "HS256" else self.private
        claims = {"sub": "bench", "role": "inference", "iat": now, "exp": now + 3600}
        return ["Bearer " + jwt.encode({**claims, "jti": str(i)}, key, algorithm=algorithm)
                for i in range(count)]


def write_configs(workdir: Path, python: str, keys: int, ttl: str) -> tuple[Path, Credentials]:
    """The auth-off and auth-on configs, and the credentials for the second."""
    write_bench_mlp(workdir / "mlp.onnx")
    off = workdir / "off.toml"
    off.write_text(SERVER, encoding="utf-8")

    entries = []
    key = ""
    for i in range(keys):  # the key used is the last one compared
        key, entry = new_api_key(python, "inference", f"bench-{i}")
        entries.append(entry)
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    (workdir / "jwt_rs256.pem").write_bytes(pem)
    listed = ",\n    ".join(entries)
    on = workdir / "on.toml"
    on.write_text(f"""{SERVER}
[auth]
api_keys = [
    {listed},
]
[auth.jwt]
algorithms = ["HS256", "RS256"]
secret_env = "{SECRET_ENV}"
public_key_file = "jwt_rs256.pem"
""", encoding="utf-8")
    env = dict(os.environ, **{SECRET_ENV: secrets.token_urlsafe(48)})
    now = int(time.time())
    rs_token = jwt.encode({"sub": "bench", "role": "inference", "iat": now, "exp": now + 3600},
                          private, algorithm="RS256")
    hs_token = mint_token(python, on, env, ttl)
    return off, Credentials(key, hs_token, rs_token, on, env, private)


# --- in-process --------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckCost:
    label: str
    us_per_call: list[float]  # one per run

    @property
    def median_us(self) -> float:
        return statistics.median(self.us_per_call)


def time_check(label: str, call: Callable[[], object], calls: int, repeats: int) -> CheckCost:
    call()  # warm (and fail here, not in the loop, if it raises unexpectedly)
    runs = timeit.Timer(call).repeat(repeat=repeats, number=calls)
    cost = CheckCost(label, [run / calls * 1e6 for run in runs])
    print(f"in-process {label}: {cost.median_us:.2f} µs/call "
          f"({', '.join(f'{v:.2f}' for v in cost.us_per_call)})", file=sys.stderr, flush=True)
    return cost


def first_use(label: str, auth: Any, tokens: list[str], calls: int,
              repeats: int) -> CheckCost:
    """Checks of tokens never seen before (the authenticator remembers verified ones)."""
    from snoozeml.operations import Operation

    fresh = iter(tokens)
    return time_check(label, lambda: auth.check(Operation.INFER, next(fresh), None), calls,
                      repeats)


def refused(check: Callable[[], object]) -> Callable[[], None]:
    """``check``, which must raise Unauthenticated, as a call that swallows it."""
    from snoozeml.auth import Unauthenticated

    def call() -> None:
        try:
            check()
        except Unauthenticated:
            return
        raise RuntimeError("a bad credential was accepted")

    return call


def in_process(creds: Credentials, calls: int, repeats: int) -> list[CheckCost]:
    from snoozeml.auth import Authenticator
    from snoozeml.config import load_config
    from snoozeml.operations import Operation

    config = load_config(creds.config, creds.env)
    auth = Authenticator.from_config(config.auth, creds.env)
    off = Authenticator.from_config(None, {})
    if not auth.enabled or off.enabled:
        raise RuntimeError("the authenticators are not on and off as configured")
    infer = Operation.INFER
    few = max(1, min(calls // 10, 1000))  # first uses: each a token minted for it
    key, bearer = creds.key, f"Bearer {creds.key}"
    hs, rs = f"Bearer {creds.hs_token}", f"Bearer {creds.rs_token}"
    head, body, signature = creds.hs_token.split(".")
    forged = f"Bearer {head}.{body}.{'A' * len(signature)}"
    unknown = "snz_" + secrets.token_urlsafe(32)
    for label, (authorization, api_key) in {"key": (None, key), "bearer key": (bearer, None),
                                            "hs256": (hs, None), "rs256": (rs, None)}.items():
        principal = auth.check(infer, authorization, api_key)
        if principal is None or principal.role != "inference":
            raise RuntimeError(f"{label}: not authenticated as inference ({principal})")
    return [
        time_check("auth off", lambda: off.check(infer, None, None), calls, repeats),
        time_check("API key, X-API-Key", lambda: auth.check(infer, None, key), calls, repeats),
        time_check("API key, Bearer", lambda: auth.check(infer, bearer, None), calls, repeats),
        time_check("JWT HS256, again (remembered)", lambda: auth.check(infer, hs, None), calls,
                   repeats),
        time_check("JWT RS256 (2048-bit), again (remembered)",
                   lambda: auth.check(infer, rs, None), calls, repeats),
        first_use("JWT HS256, first use", auth,
                  creds.fresh_tokens(few * (repeats + 1) + 10, "HS256"), few, repeats),
        first_use("JWT RS256 (2048-bit), first use", auth,
                  creds.fresh_tokens(few * (repeats + 1) + 10, "RS256"), few, repeats),
        time_check("refused: unknown key",
                   refused(lambda: auth.check(infer, None, unknown)), calls, repeats),
        time_check("refused: HS256 wrong signature",
                   refused(lambda: auth.check(infer, forged, None)), calls, repeats),
    ]


# --- end to end --------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    round: int
    connections: int
    variant: str
    wrk: dict[str, Any]
    daemon_cpu_s: float
    inline: bool  # the model ran its short batches on the event loop (docs/batching.md)

    @property
    def per_s(self) -> float:
        return float(self.wrk["requests_per_s"])

    @property
    def cpu_us_per_request(self) -> float:
        return self.daemon_cpu_s / max(1, int(self.wrk["requests"])) * 1e6


@dataclass
class Target:
    """One variant: the daemon it loads and the headers it sends."""

    variant: str
    daemon: Daemon
    headers: dict[str, str]
    client: httpx.Client

    @property
    def url(self) -> str:
        return f"{self.daemon.base_url}/v2/models/{MODEL}/infer"


def inline(target: Target) -> bool:
    return bool(model_status(target.client, MODEL)["batching"].get("inline", False))


def refusals(client: httpx.Client) -> dict[str, int]:
    response = client.get("/admin/status")
    response.raise_for_status()
    return dict(response.json().get("auth_refusals") or {})


def check_auth_is_on(daemon: Daemon) -> None:
    """The ``on`` daemon refuses a request without credentials, and a load by the key."""
    with httpx.Client(base_url=daemon.base_url, timeout=30) as bare:
        response = bare.post(f"/v2/models/{MODEL}/infer", json={})
        if response.status_code != 401:
            raise RuntimeError(f"auth on: infer without credentials got {response.status_code}")
    if "auth_disabled" in "\n".join(daemon.log):
        raise RuntimeError("auth on: the daemon logged auth_disabled")


def measure(target: Target, connections: int, round_no: int, body: Path,
            args: argparse.Namespace) -> Run:
    run_wrk(target.url, body, args.wrk_threads, connections, args.warm_up,
            extra_headers=target.headers)
    before = process_cpu_s(target.daemon.pid)
    result = run_wrk(target.url, body, args.wrk_threads, connections, args.duration,
                     extra_headers=target.headers)
    cpu = process_cpu_s(target.daemon.pid) - before
    run = Run(round_no, connections, target.variant, result, cpu, inline(target))
    print(f"round {round_no} c{connections} {target.variant}: {json.dumps(result)} "
          f"daemon CPU {run.cpu_us_per_request:.1f} µs/request inline={run.inline}",
          file=sys.stderr, flush=True)
    if wrk_errors(result):
        raise RuntimeError(f"{target.variant} c{connections}: errors in {result}")
    return run


def end_to_end(off_config: Path, creds: Credentials, workdir: Path,
               args: argparse.Namespace) -> list[Run]:
    model_input = random_rows(1, WIDTH)
    body = workdir / "body.json"
    write_body(body, model_input)
    expected = new_session(workdir / "mlp.onnx").run(None, {"x": model_input})[0]
    daemons: list[Daemon] = []
    clients: list[httpx.Client] = []
    runs: list[Run] = []
    try:
        daemons.append(Daemon(args.python, off_config))
        daemons.append(Daemon(args.python, creds.config, env=creds.env))
        off, on = daemons
        print(f"daemons up: off http={off.http_port}, on http={on.http_port}", file=sys.stderr)
        headers = {"off": {}, "key": {"X-API-Key": creds.key},
                   "jwt": {"Authorization": f"Bearer {creds.hs_token}"}}
        targets = []
        for variant in VARIANTS:
            daemon = off if variant == "off" else on
            client = httpx.Client(base_url=daemon.base_url, timeout=60.0,
                                  headers=headers[variant])
            clients.append(client)
            targets.append(Target(variant, daemon, headers[variant], client))
        for target in targets:
            wait_ready(target.client, "/health/ready")
            wait_loaded(target.client, MODEL)  # preloaded: no load inside the timings
            check_infer(target.client, MODEL, model_input, expected)
        check_auth_is_on(on)
        response = targets[1].client.post(f"/v2/repository/models/{MODEL}/load")
        if response.status_code != 403:
            raise RuntimeError(f"auth on: a load by an inference key got {response.status_code}")
        if "auth_disabled" not in "\n".join(off.log):
            raise RuntimeError("auth off: the daemon did not log auth_disabled")
        refused_before = refusals(targets[1].client)
        for round_no in range(1, args.rounds + 1):
            order = targets if round_no % 2 else list(reversed(targets))
            for connections in LOADS:
                for target in order:
                    runs.append(measure(target, connections, round_no, body, args))
        for target in targets:  # still right after the load
            check_infer(target.client, MODEL, model_input, expected)
        refused_after = refusals(targets[1].client)
        if refused_after != refused_before:
            raise RuntimeError(f"refusals during the runs: {refused_before} -> {refused_after}")
    except BaseException:
        for daemon in daemons:
            print(f"--- daemon log (last lines) ---\n{daemon.tail()}", file=sys.stderr)
        raise
    finally:
        for client in clients:
            client.close()
        for daemon in daemons:
            daemon.stop_and_warn()
    return runs


# --- report ------------------------------------------------------------------------------



def in_process_report(costs: list[CheckCost], args: argparse.Namespace) -> list[str]:
    lines = [
        "### In-process: `Authenticator.check(Operation.INFER, …)`",
        "",
        f"{args.calls:,} calls per run (first uses: {max(1, min(args.calls // 10, 1000)):,}), "
        f"median of {args.repeats} runs; {args.keys} API keys configured. `again`: the same "
        "token every call, remembered after its first verification until its `exp`; `first "
        "use`: a token never seen before every call, verified in full.",
        "",
        "| credential | µs per check (median) | range of runs |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {c.label} | {c.median_us:.2f} | {min(c.us_per_call):.2f} to "
              f"{max(c.us_per_call):.2f} |" for c in costs]
    return [*lines, ""]


def end_to_end_report(runs: list[Run], args: argparse.Namespace) -> list[str]:
    lines = [
        "### End to end: infer with auth off and on",
        "",
        f"wrk -t{args.wrk_threads}, one-row JSON body; {args.rounds} round(s), each variant "
        f"{args.warm_up:g} s warm-up then {args.duration:g} s, the order reversed every other "
        "round. `key`: `X-API-Key`; `jwt`: `Authorization: Bearer` HS256.",
        "",
        "| load | variant | req/s | p50 ms | p99 ms | daemon CPU µs/request | inline runs |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for connections in LOADS:
        for variant in VARIANTS:
            mine = [r for r in runs if r.connections == connections and r.variant == variant]
            lines.append(
                f"| c{connections} | {variant} | {median_or_nan([r.per_s for r in mine]):,.0f} | "
                f"{median_or_nan([r.wrk['p50_ms'] for r in mine]):.3f} | "
                f"{median_or_nan([r.wrk['p99_ms'] for r in mine]):.3f} | "
                f"{median_or_nan([r.cpu_us_per_request for r in mine]):.1f} | "
                f"{sum(r.inline for r in mine)}/{len(mine)} |")
    lines += [
        "",
        "Ratios on/off, paired within each round: median (range). A pair whose two runs "
        "differ in inline batches (see docs/batching.md) is left out when others remain.",
        "",
        "| load | variant | req/s on/off | p50 on/off | p99 on/off | CPU µs/request on - off |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for connections in LOADS:
        base = {r.round: r for r in runs if r.connections == connections and r.variant == "off"}
        for variant in VARIANTS[1:]:
            pairs = [(base[r.round], r) for r in runs
                     if r.connections == connections and r.variant == variant]
            same = [(o, n) for o, n in pairs if o.inline == n.inline]
            pairs = same or pairs
            cpu = [n.cpu_us_per_request - o.cpu_us_per_request for o, n in pairs]
            lines.append(
                f"| c{connections} | {variant} | "
                f"{spread([n.per_s / o.per_s for o, n in pairs], '.3f')} | "
                f"{spread([n.wrk['p50_ms'] / o.wrk['p50_ms'] for o, n in pairs], '.3f')} | "
                f"{spread([n.wrk['p99_ms'] / o.wrk['p99_ms'] for o, n in pairs], '.3f')} | "
                f"{spread(cpu, '+.1f')} |")
    return [*lines, ""]


def report(machine: str, costs: list[CheckCost] | None, runs: list[Run] | None,
           args: argparse.Namespace) -> str:
    lines = [
        "## Auth benchmark: the cost of API keys and JWTs",
        "",
        f"- {machine}",
        f"- command: `{command_line()}`",
        "",
    ]
    if costs is not None:
        lines += in_process_report(costs, args)
    if runs is not None:
        lines += end_to_end_report(runs, args)
    return "\n".join(lines)


# --- main --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=20_000,
                        help="in-process: calls per timed run (20000)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="in-process: timed runs per credential (5)")
    parser.add_argument("--keys", type=int, default=3,
                        help="API keys in the config; each check compares against all (3)")
    parser.add_argument("--duration", type=float, default=10.0,
                        help="end to end: seconds per measured wrk run (10)")
    parser.add_argument("--warm-up", type=float, default=2.0,
                        help="end to end: seconds of wrk warm-up before each run (2)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="end to end: rounds of the three variants (3)")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk threads (1)")
    parser.add_argument("--only", choices=("in-process", "end-to-end"),
                        help="run one part only (default: both)")
    parser.add_argument("--out", type=Path, help="also write the markdown report to this file")
    parser.add_argument("--json", type=Path, help="also write the raw numbers to this file")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that runs the daemons and the snooze commands")
    args = parser.parse_args(argv)
    if min(args.calls, args.repeats, args.keys, args.rounds, args.wrk_threads) < 1:
        parser.error("--calls, --repeats, --keys, --rounds and --wrk-threads must be >= 1")
    if args.duration < 1:
        parser.error("--duration must be at least 1")
    args.warm_up = max(1.0, args.warm_up)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.only != "in-process" and shutil.which("wrk") is None:
        print("wrk not found; run: bash bench/setup.sh", file=sys.stderr)
        return 2
    machine = machine_line()
    # The token must outlive the whole run.
    total_s = args.rounds * len(LOADS) * len(VARIANTS) * (args.duration + args.warm_up + 5)
    ttl = f"{max(1, int(total_s // 3600) + 1)}h"
    costs: list[CheckCost] | None = None
    runs: list[Run] | None = None
    with tempfile.TemporaryDirectory(prefix="snooze-bench-") as tmp:
        workdir = Path(tmp)
        off_config, creds = write_configs(workdir, args.python, args.keys, ttl)
        if args.only in (None, "in-process"):
            costs = in_process(creds, args.calls, args.repeats)
        if args.only in (None, "end-to-end"):
            runs = end_to_end(off_config, creds, workdir, args)
    markdown = report(machine, costs, runs, args)
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n", encoding="utf-8")
    if args.json is not None:
        raw = {
            "machine": machine,
            "command": command_line(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "in_process": [asdict(c) for c in costs or []],
            "runs": [asdict(r) for r in runs or []],
        }
        args.json.write_text(json.dumps(raw, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
