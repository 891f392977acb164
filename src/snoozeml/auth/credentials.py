"""The credentials auth/authenticator.py checks against, read once at start: API key hashes (from
the config,
or hashed here from a variable or file), the JWT secret, a PEM public key or a JWKS document,
each kept only with the algorithms it can verify. Every problem is one line for ConfigError."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from snoozeml.config.auth import SHA256_HEX, AuthConfig, read_secret
from snoozeml.errors import describe_exception

PublicKey = (rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey
             | ed448.Ed448PublicKey)


@dataclass(frozen=True, slots=True)
class Principal:
    name: str  # the API key's configured name, or the token's `sub` ("" without one)
    role: str  # one of ROLES
    via: str  # "api_key" or "jwt"


@dataclass(frozen=True, slots=True)
class ApiKey:
    digest: bytes  # SHA-256 of the key
    principal: Principal


@dataclass(frozen=True, slots=True)
class VerifyingKey:
    key: PublicKey
    algorithms: frozenset[str]  # the allowed algorithms this key can verify


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
        problems.append(f"{where}: cannot read {file}: {_why(exc)}")
        return None
    if not value:
        problems.append(f"{where}: " + (f"environment variable {env} is not set or empty"
                                        if env is not None else f"{file} is empty"))
        return None
    return value


def load_pem(path: Path, keyed: frozenset[str], problems: list[str]) -> VerifyingKey | None:
    where = "auth.jwt.public_key_file"
    try:
        key = load_pem_public_key(path.read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        problems.append(f"{where}: cannot use {path} as a PEM public key: {_why(exc)}")
        return None
    fits = _algorithms_for(key) & keyed
    if not fits or not isinstance(key, PublicKey):
        problems.append(f"{where}: this {type(key).__name__} verifies none of "
                        f"{', '.join(sorted(keyed))}")
        return None
    return VerifyingKey(key, fits)


def load_jwks(path: Path, keyed: frozenset[str],
          problems: list[str]) -> dict[str | None, VerifyingKey]:
    """The JWKS's signing keys that verify an allowed algorithm, by kid; under None too, the
    key for a token without a kid, when there is only one."""
    where = "auth.jwt.jwks_file"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError included
        problems.append(f"{where}: cannot use {path} as a JWKS document: {_why(exc)}")
        return {}
    entries = document.get("keys") if isinstance(document, dict) else None
    usable: list[tuple[str | None, VerifyingKey]] = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        try:
            key = _public(jwt.PyJWK(entry).key)
        except jwt.PyJWTError:
            continue  # as PyJWKSet does: a key PyJWT cannot use is skipped
        fits = _algorithms_for(key) & keyed
        if isinstance(entry.get("alg"), str):  # a key that names its algorithm verifies
            fits &= {entry["alg"]}  # only that one
        kid = entry.get("kid")
        if fits and isinstance(key, PublicKey) and (kid is None or isinstance(kid, str)):
            usable.append((kid, VerifyingKey(key, fits)))
    if not usable:
        problems.append(f"{where}: no key in it verifies {', '.join(sorted(keyed))}")
    keys: dict[str | None, VerifyingKey] = {kid: k for kid, k in usable if kid is not None}
    if len(keys) < sum(kid is not None for kid, _ in usable):
        problems.append(f"{where}: two keys have the same kid")
    if len(usable) == 1:
        keys[None] = usable[0][1]
    return keys


def _public(key: object) -> object:  # a JWKS may hold a private key: keep its public half
    public_key = getattr(key, "public_key", None)
    return public_key() if callable(public_key) else key


def _why(exc: Exception) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else describe_exception(exc)


_RSA = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC = {"secp256r1": frozenset({"ES256"}), "secp384r1": frozenset({"ES384"}),
       "secp521r1": frozenset({"ES512"})}


def _algorithms_for(key: object) -> frozenset[str]:
    if isinstance(key, rsa.RSAPublicKey):
        return _RSA
    if isinstance(key, ec.EllipticCurvePublicKey):
        return _EC.get(key.curve.name, frozenset())
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return frozenset({"EdDSA"})
    return frozenset()
