"""The auth scenario's configs and credentials (API keys from ``snooze keys new``, an HS256
token from ``snooze token``, an RS256 key pair made here), and the in-process timing of
``Authenticator.check``. Nothing here prints a key, token or secret."""

from __future__ import annotations

import os
import re
import secrets
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from harness.config import Raw, write_config

MODEL = "mlp"
SECRET_ENV = "SNOOZE_BENCH_JWT_SECRET"
SERVED = [{"name": MODEL, "path": "mlp.onnx", "preload": True, "intra_op_threads": 1}]


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


@dataclass(frozen=True)
class Credentials:
    key: str  # an API key of role inference
    hs_token: str
    rs_token: str
    config: Path  # the auth-on models.toml
    env: dict[str, str]  # the environment with the JWT secret
    private: rsa.RSAPrivateKey  # signs RS256 tokens

    def fresh_tokens(self, count: int, algorithm: str) -> list[str]:
        """``count`` different tokens (each ``jti`` its own), so none was seen before."""
        now = int(time.time())
        key: Any = self.env[SECRET_ENV] if algorithm == "HS256" else self.private
        claims = {"sub": "bench", "role": "inference", "iat": now, "exp": now + 3600}
        return ["Bearer " + jwt.encode({**claims, "jti": str(i)}, key, algorithm=algorithm)
                for i in range(count)]


def write_configs(workdir: Path, python: str, keys: int, ttl: str) -> tuple[Path, Credentials]:
    """The auth-off and auth-on configs, and the credentials for the second."""
    server = {"idle_timeout": "never"}
    off = write_config(workdir / "off.toml", SERVED, server=server)
    entries = []
    key = ""
    for i in range(keys):  # the key used is the last one compared
        key, entry = new_api_key(python, "inference", f"bench-{i}")
        entries.append(Raw(entry))
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    (workdir / "jwt_rs256.pem").write_bytes(pem)
    on = write_config(workdir / "on.toml", SERVED, server=server, tables={"auth": {
        "api_keys": entries, "jwt": {"algorithms": ["HS256", "RS256"], "secret_env": SECRET_ENV,
                                     "public_key_file": "jwt_rs256.pem"}}})
    env = dict(os.environ, **{SECRET_ENV: secrets.token_urlsafe(48)})
    now = int(time.time())
    rs_token = jwt.encode({"sub": "bench", "role": "inference", "iat": now, "exp": now + 3600},
                          private, algorithm="RS256")
    out = snooze(python, "token", "--role", "inference", "--ttl", ttl, "--subject", "bench",
                 "-c", str(on), env=env)
    hs_token = next((word for word in out.split() if word.count(".") == 2), None)
    if hs_token is None:
        raise RuntimeError("snooze token printed no token")
    return off, Credentials(key, hs_token, rs_token, on, env, private)


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


def refused(check: Callable[[], object]) -> Callable[[], None]:
    """``check``, which must raise Unauthenticated, as a call that swallows it."""
    from snoozeml.auth.authenticator import Unauthenticated

    def call() -> None:
        try:
            check()
        except Unauthenticated:
            return
        raise RuntimeError("a bad credential was accepted")

    return call


def in_process(creds: Credentials, calls: int, repeats: int) -> list[CheckCost]:
    """Each credential's ``check(Operation.INFER, …)``, after checking it authenticates."""
    from snoozeml.auth.authenticator import Authenticator
    from snoozeml.config.settings import load_config
    from snoozeml.operations import Operation

    auth = Authenticator.from_config(load_config(creds.config, creds.env).auth, creds.env)
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
    fresh = {alg: iter(creds.fresh_tokens(few * (repeats + 1) + 10, alg))
             for alg in ("HS256", "RS256")}
    checks: list[tuple[str, Callable[[], object], int]] = [
        ("auth off", lambda: off.check(infer, None, None), calls),
        ("API key, X-API-Key", lambda: auth.check(infer, None, key), calls),
        ("API key, Bearer", lambda: auth.check(infer, bearer, None), calls),
        ("JWT HS256, again (remembered)", lambda: auth.check(infer, hs, None), calls),
        ("JWT RS256 (2048-bit), again (remembered)", lambda: auth.check(infer, rs, None), calls),
        ("JWT HS256, first use", lambda: auth.check(infer, next(fresh["HS256"]), None), few),
        ("JWT RS256 (2048-bit), first use",
         lambda: auth.check(infer, next(fresh["RS256"]), None), few),
        ("refused: unknown key", refused(lambda: auth.check(infer, None, unknown)), calls),
        ("refused: HS256 wrong signature", refused(lambda: auth.check(infer, forged, None)),
         calls),
    ]
    return [time_check(label, call, count, repeats) for label, call, count in checks]
