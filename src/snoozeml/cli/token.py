"""`snooze token --role ROLE --ttl 1h [-c models.toml] [--subject NAME]`: mint a JWT for a
daemon whose [auth.jwt] has an HS256/384/512 secret.

Only the token goes to stdout; the secret is read from where the config says and printed
nowhere.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from snoozeml.config.auth import HMAC_ALGORITHMS, ROLES
from snoozeml.units import parse_duration

DEFAULT_SUBJECT = "snooze-cli"


def _ttl(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not seconds:
        raise argparse.ArgumentTypeError("the ttl must be longer than 0s")
    return seconds


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "token", help="mint a JWT for a daemon configured with an HS256/384/512 secret",
        description="Print a JSON Web Token signed with the [auth.jwt] secret of a models.toml "
                    "(its first HS algorithm), carrying a role, an expiry, and the issuer and "
                    "audience the config checks.")
    parser.add_argument("--role", required=True, choices=ROLES,
                        help="the role the token grants; each includes those before it")
    parser.add_argument("--ttl", required=True, type=_ttl,
                        help="how long the token is valid, e.g. 15m, 1h")
    parser.add_argument("-c", "--config", type=Path, default=Path("models.toml"),
                        help="the daemon's models.toml (default: ./models.toml)")
    parser.add_argument("--subject", default=DEFAULT_SUBJECT,
                        help=f"the token's `sub`, logged with its requests "
                             f"(default: {DEFAULT_SUBJECT})")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import jwt

    from snoozeml.cli import exit_codes
    from snoozeml.config.auth import read_secret
    from snoozeml.config.settings import load_config
    from snoozeml.errors import ConfigError

    try:
        config = load_config(args.config, os.environ)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"snooze: {problem}", file=sys.stderr)
        print(f"snooze: invalid configuration ({len(exc.problems)} problem(s)); no token "
              "minted", file=sys.stderr)
        return exit_codes.USAGE
    settings = config.auth.jwt if config.auth is not None else None
    algorithm = next((a for a in settings.algorithms if a in HMAC_ALGORITHMS), None) \
        if settings is not None else None
    secret = ""
    if settings is not None and algorithm is not None:
        try:
            secret = read_secret(settings.secret_env, settings.secret_file, os.environ)
        except (OSError, UnicodeDecodeError) as exc:  # removed since the config was read
            print(f"snooze: cannot read the JWT secret: {type(exc).__name__}", file=sys.stderr)
            return exit_codes.USAGE
    if settings is None or algorithm is None or not secret:
        print("snooze: snooze token mints HS256/384/512 tokens; this config has no JWT secret "
              f"({args.config} needs [auth.jwt] with an HS algorithm and secret_env or "
              "secret_file)", file=sys.stderr)
        return exit_codes.USAGE
    if config.auth is not None and not config.auth.enabled:
        print(f"snooze: note: auth is disabled in {args.config} (enabled = false); the daemon "
              "does not ask for this token", file=sys.stderr)
    now = int(time.time())
    claims: dict[str, Any] = {
        settings.role_claim: [args.role] if settings.role_claim == "roles" else args.role,
        "sub": args.subject, "iat": now, "nbf": now, "exp": now + math.ceil(args.ttl),
    }
    if settings.issuer is not None:
        claims["iss"] = settings.issuer
    if settings.audience is not None:
        claims["aud"] = settings.audience
    print(jwt.encode(claims, secret, algorithm=algorithm))
    return exit_codes.OK
