"""JSON Web Tokens: the secret and keys each allowed algorithm is verified with, read at start,
and each token's verification (see auth/authenticator.py's docstring for the rules). Imported
only when the config has an [auth.jwt] table: PyJWT and cryptography cost nothing otherwise."""

from __future__ import annotations

import base64
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import jwt

from snoozeml.auth.credentials import Principal, read_secret_or_problem, utf8
from snoozeml.auth.public_keys import PublicKey, VerifyingKey, load_jwks, load_pem
from snoozeml.auth.refusals import PermissionDenied, Unauthenticated
from snoozeml.config.auth import HMAC_ALGORITHMS, ROLES, JwtConfig

VERIFIED_TOKENS = 4096  # tokens remembered as verified, least recently used forgotten first

_RANK: Mapping[str, int] = {role: rank for rank, role in enumerate(ROLES)}
_NO_ROLE = "permission denied: the credential grants no known role"


class Tokens:
    """JWT verification: the allowed algorithms and the one key each may be verified with."""

    def __init__(self, config: JwtConfig, clock: Callable[[], float], secret: bytes | None,
                 keys: Mapping[str | None, VerifyingKey], by_kid: bool) -> None:
        self._hmac = frozenset(config.algorithms) & frozenset(HMAC_ALGORITHMS)
        self._keyed = frozenset(config.algorithms) - self._hmac
        self._secret = secret or b""
        self._keys = dict(keys)  # by kid; None: the key for a token without one
        self._by_kid = by_kid  # False for a PEM key, which any kid (or none) selects
        self._config = config
        self._clock = clock  # epoch seconds, for the expiry of a remembered token
        self._options: jwt.types.Options = {"require": ["exp"],
                                            "verify_aud": config.audience is not None}
        # SHA-256 of a token that verified -> (who, its exp): the signature, issuer, audience,
        # nbf and iat can only stay valid as time passes; exp is checked at every use.
        self._verified: OrderedDict[bytes, tuple[Principal, float]] = OrderedDict()

    @classmethod
    def from_config(cls, config: JwtConfig, environ: Mapping[str, str], problems: list[str],
                    clock: Callable[[], float]) -> Tokens:
        text: str | None = None
        if any(a in HMAC_ALGORITHMS for a in config.algorithms):
            where = f"auth.jwt.secret_{'env' if config.secret_env is not None else 'file'}"
            text = read_secret_or_problem(config.secret_env, config.secret_file, environ,
                                          where, problems)
        secret = None if text is None else text.encode("utf-8")
        keyed = frozenset(a for a in config.algorithms if a not in HMAC_ALGORITHMS)
        keys: dict[str | None, VerifyingKey] = {}
        if keyed and config.public_key_file is not None:
            pem = load_pem(config.public_key_file, keyed, problems)
            keys = {} if pem is None else {None: pem}
        elif keyed and config.jwks_file is not None:
            keys = load_jwks(config.jwks_file, keyed, problems)
        elif keyed:
            problems.append(f"auth.jwt.algorithms: {', '.join(sorted(keyed))} need "
                            "public_key_file or jwks_file")
        return cls(config, clock, secret, keys, by_kid=config.public_key_file is None)

    def verify(self, token: str) -> Principal:
        digest = hashlib.sha256(utf8(token)).digest()
        known = self._verified.get(digest)
        if known is not None:
            principal, expires = known
            if self._clock() <= expires + self._config.leeway:
                self._verified.move_to_end(digest)
                return principal
            del self._verified[digest]
            raise Unauthenticated("expired")
        principal, expires = self._verify(token)
        self._verified[digest] = (principal, expires)
        if len(self._verified) > VERIFIED_TOKENS:
            self._verified.popitem(last=False)
        return principal

    def _verify(self, token: str) -> tuple[Principal, float]:
        header = _unverified_header(token)
        alg, kid = header.get("alg"), header.get("kid")
        key: bytes | PublicKey
        if not isinstance(alg, str) or not isinstance(kid, str | None):
            raise Unauthenticated("invalid")
        if alg in self._hmac:
            key = self._secret  # never a public key, whatever the token says
        elif alg in self._keyed:
            chosen = self._keys.get(kid if self._by_kid else None)
            if chosen is None or alg not in chosen.algorithms:
                raise Unauthenticated("invalid")
            key = chosen.key
        else:
            raise Unauthenticated("invalid")  # `none`, and every algorithm not allowed
        try:
            # `algorithms=[alg]` is safe although it comes from the token: alg is one the
            # config allows, and the key is the one configured for it.
            claims: dict[str, Any] = jwt.decode(
                token, key, algorithms=[alg], options=self._options,
                leeway=self._config.leeway, issuer=self._config.issuer,
                audience=self._config.audience)
        except jwt.ExpiredSignatureError as exc:
            raise Unauthenticated("expired") from exc
        except (jwt.PyJWTError, ValueError, TypeError) as exc:
            # Every other failure, hostile input included (PyJWT lets a few ValueErrors and
            # TypeErrors through), is one answer.
            raise Unauthenticated("invalid") from exc
        subject = claims.get("sub")
        name = subject if isinstance(subject, str) else ""
        claim = self._config.role_claim
        held = claims.get(claim)
        if held is None and claim == "role":
            held = claims.get("roles")  # the default claim also reads the plural, as a list
        role = _highest_role(held)
        if role is None:
            raise PermissionDenied(_NO_ROLE, name)
        return Principal(name, role, "jwt"), float(claims["exp"])


def _unverified_header(token: str) -> dict[str, Any]:
    """The token's header, read only to choose the key: PyJWT parses it again, strictly, and
    refuses a token whose `alg` it reads differently. (Its own reader, run twice, would be
    most of the cost of a check.)"""
    segment = token.partition(".")[0]
    try:
        header = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except (ValueError, RecursionError) as exc:  # binascii and Unicode errors are ValueErrors
        raise Unauthenticated("invalid") from exc
    if not isinstance(header, dict):
        raise Unauthenticated("invalid")
    return header


def _highest_role(claim: object) -> str | None:
    """The highest known role of a claim that is a role or a list of roles."""
    values = [claim] if isinstance(claim, str) else claim if isinstance(claim, list) else []
    rank = max((_RANK.get(v, -1) for v in values if isinstance(v, str)), default=-1)
    return ROLES[rank] if rank >= 0 else None
