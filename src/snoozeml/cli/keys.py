"""`snooze keys new --role ROLE --name NAME`: make an API key, print it once, and print the
config line that stores only its SHA-256 hash.

The key goes to stdout and nowhere else: nothing is logged, and nothing of it is kept.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import secrets
import sys
from typing import Any

from snoozeml.config.auth import ROLES

PREFIX = "snz_"  # recognisable in a leaked log or a secret scanner
ENTROPY_BYTES = 32  # 256 bits


def _name(text: str) -> str:
    if not text or not text.isprintable():
        raise argparse.ArgumentTypeError("the name must be non-empty printable text")
    return text


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "keys", help="make API keys for [auth]",
        description="Make API keys for the [auth] table of models.toml.")
    actions = parser.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    new = actions.add_parser(
        "new", help="print a new random API key once, and the config line holding its hash",
        description="Print a new random API key (shown only this once: models.toml keeps its "
                    "SHA-256 hash, never the key) and the line to paste under [auth].")
    new.add_argument("--role", required=True, choices=ROLES,
                     help="what the key may do; each role includes those before it")
    new.add_argument("--name", required=True, type=_name,
                     help="the key's name, logged with the requests it makes (e.g. ci)")
    new.set_defaults(handler=run_new)


def new_key() -> str:
    """A new API key: the prefix and 256 random bits, URL-safe."""
    return PREFIX + secrets.token_urlsafe(ENTROPY_BYTES)


def config_entry(name: str, role: str, key: str) -> str:
    """The inline TOML table of one key, holding its hash: `{ name = ..., sha256 = ... }`."""
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    # A JSON string of printable text is a TOML basic string too.
    return (f"{{ name = {json.dumps(name, ensure_ascii=False)}, role = {json.dumps(role)}, "
            f'sha256 = "{digest}" }}')


def run_new(args: argparse.Namespace) -> int:
    from snoozeml.cli import exit_codes

    key = new_key()
    entry = config_entry(args.name, args.role, key)
    sys.stdout.write(
        f"{key}\n"
        "# The key above is shown only this once; clients send it as "
        "`Authorization: Bearer <key>` or `X-API-Key: <key>`.\n"
        "# Paste the next line under [auth] in models.toml, or append "
        f"`{entry},` to an existing api_keys list:\n"
        f"api_keys = [{entry}]\n")
    return exit_codes.OK
