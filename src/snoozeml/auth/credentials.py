"""The credentials auth/authenticator.py checks against, read once at start: API key hashes (from
the config, or hashed here from a variable or file) and secrets (the JWT secret too). The
public keys that verify tokens are auth/public_keys.py's. Every problem is one line for
ConfigError."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from snoozeml.config.auth import SHA256_HEX, AuthConfig, read_secret
from snoozeml.errors import describe_exception


@dataclass(frozen=True, slots=True)
class Principal:
    name: str  # the API key's configured name, or the token's `sub` ("" without one)
    role: str  # one of ROLES
    via: str  # "api_key" or "jwt"


@dataclass(frozen=True, slots=True)
class ApiKey:
    digest: bytes  # SHA-256 of the key
    principal: Principal


def utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # one-to-one, for any str a header gives


def load_api_keys(auth: AuthConfig, environ: Mapping[str, str],
              problems: list[str]) -> tuple[ApiKey, ...]:
    keys: list[ApiKey] = []
    first: dict[bytes, int] = {}
    for i, entry in enumerate(auth.api_keys):
        where = f"auth.api_keys[{i}]"
        digest: bytes | None = None
        if entry.sha256 is not None:
            if SHA256_HEX.match(entry.sha256):
                digest = bytes.fromhex(entry.sha256)
            else:
                problems.append(f"{where}.sha256: must be 64 hexadecimal digits")
        else:
            source = "key_env" if entry.key_env is not None else "key_file"
            key = read_secret_or_problem(entry.key_env, entry.key_file, environ,
                                         f"{where}.{source}", problems)
            digest = None if key is None else hashlib.sha256(utf8(key)).digest()
        if digest is not None and digest in first:
            # One key under two names would make its role ambiguous.
            problems.append(f"{where}: the same key as api_keys[{first[digest]}]")
        elif digest is not None:
            first[digest] = i
            keys.append(ApiKey(digest, Principal(entry.name, entry.role, "api_key")))
    return tuple(keys)


def read_secret_or_problem(env: str | None, file: Path | None, environ: Mapping[str, str],
                           where: str, problems: list[str]) -> str | None:
    if env is None and file is None:
        problems.append(f"{where}: no variable or file named")
        return None
    try:
        value = read_secret(env, file, environ)
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{where}: cannot read {file}: {reason_for(exc)}")
        return None
    if not value:
        problems.append(f"{where}: " + (f"environment variable {env} is not set or empty"
                                        if env is not None else f"{file} is empty"))
        return None
    return value


def reason_for(exc: Exception) -> str:
    """An error's words for a problem line: the OS's for a file, the exception's otherwise."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else describe_exception(exc)
