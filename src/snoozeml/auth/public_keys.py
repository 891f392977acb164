"""The public keys that verify JSON Web Tokens, read once at start from a PEM file or a JWKS
document, each kept only with the algorithms it can verify. Every problem is one line for
ConfigError. Imported only when [auth.jwt] names an algorithm that needs a key (it brings in
PyJWT's and cryptography's key classes)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from snoozeml.auth.credentials import reason_for

PublicKey = (rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey
             | ed448.Ed448PublicKey)


@dataclass(frozen=True, slots=True)
class VerifyingKey:
    key: PublicKey
    algorithms: frozenset[str]  # the allowed algorithms this key can verify


def load_pem(path: Path, keyed: frozenset[str], problems: list[str]) -> VerifyingKey | None:
    where = "auth.jwt.public_key_file"
    try:
        key = load_pem_public_key(path.read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        problems.append(f"{where}: cannot use {path} as a PEM public key: {reason_for(exc)}")
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
        problems.append(f"{where}: cannot use {path} as a JWKS document: {reason_for(exc)}")
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
