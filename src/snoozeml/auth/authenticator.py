"""Who is calling, and whether they may: API keys and JSON Web Tokens, checked against the role
each operation needs.

`REQUIRED_ROLE` is the one role table, keyed by every `Operation`; roles are ordered, readonly <
inference < admin, each including those below it. `Authenticator.check` is the one check the
request boundary makes for both transports, on the raw credential headers, before any work:

- A public operation, or any operation while auth is off, passes without a look at the
  credentials (an invalid one included).
- A refusal says only "missing", "invalid" or "expired" (`Unauthenticated`), or which role was
  needed (`PermissionDenied`); never which part of a credential was wrong.
- An API key is known by its SHA-256 only, compared with `hmac.compare_digest` against every
  configured hash: the same work whether, and wherever, it matches.
- A token is verified with the secret (HS*) or public key (the rest) configured for the
  algorithm it names, if the config allows that algorithm: never `none`, and an RSA public key
  is never an HMAC secret.
- Hashes, parsed keys and each operation's role are prepared at start: a check costs one
  SHA-256 and a comparison per configured key, or one signature verification. A token that
  verified is remembered (by its SHA-256, at most `VERIFIED_TOKENS` of them) until its `exp`,
  which is checked again at every use: a client sending the same token again costs a hash.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Literal

import jwt

from snoozeml.auth.credentials import (
    ApiKey,
    Principal,
    PublicKey,
    VerifyingKey,
    load_api_keys,
    load_jwks,
    load_pem,
    read_secret_or_problem,
    utf8,
)
from snoozeml.config.auth import HMAC_ALGORITHMS, ROLES, AuthConfig, JwtConfig
from snoozeml.errors import ConfigError, SnoozeError
from snoozeml.operations import Operation

Reason = Literal["missing", "invalid", "expired"]


class Unauthenticated(SnoozeError):
    """No credential was given ("missing"), it matches nothing or fails a check ("invalid"),
    or a token's `exp` has passed ("expired"). The message is "<reason> credentials", no more."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(f"{reason} credentials")
        self.reason: Reason = reason


class PermissionDenied(SnoozeError):
    """The credential is genuine but its role is below the operation's (or it grants none).
    `principal` is the key's name or the token's subject ("" when the token has none)."""

    def __init__(self, message: str, principal: str) -> None:
        super().__init__(message)
        self.principal = principal


# The one role table. None: public, so that orchestrators can probe without credentials.
REQUIRED_ROLE: Mapping[Operation, str | None] = {
    Operation.SERVER_LIVE: None,
    Operation.SERVER_READY: None,
    Operation.HEALTH: None,
    Operation.SERVER_METADATA: "readonly",
    Operation.MODEL_METADATA: "readonly",
    Operation.MODEL_READY: "readonly",
    Operation.REPOSITORY_INDEX: "readonly",
    Operation.ADMIN_STATUS: "readonly",
    Operation.REFLECTION: "readonly",
    Operation.MODEL_STATS: "readonly",
    Operation.METRICS: "readonly",
    Operation.OPENAPI: "readonly",
    Operation.OPENAI_MODELS: "readonly",
    Operation.INFER: "inference",
    Operation.EMBEDDINGS: "inference",
    Operation.REPOSITORY_LOAD: "admin",
    Operation.REPOSITORY_UNLOAD: "admin",
    # ModelMesh's SPI sends no credentials, so its listener never checks them (its address,
    # loopback by default, is its guard): these roles say what the operations amount to.
    Operation.MODELMESH_STATUS: "readonly",
    Operation.MODELMESH_PREDICT_SIZE: "readonly",
    Operation.MODELMESH_MODEL_SIZE: "readonly",
    Operation.MODELMESH_LOAD: "admin",
    Operation.MODELMESH_UNLOAD: "admin",
}

MAX_CREDENTIAL_BYTES = 16 * 1024  # a longer credential is invalid, and never parsed
VERIFIED_TOKENS = 4096  # tokens remembered as verified, least recently used forgotten first

_RANK: Mapping[str, int] = {role: rank for rank, role in enumerate(ROLES)}
_NO_ROLE = "permission denied: the credential grants no known role"


def required_role(operation: Operation, metrics_public: bool = False) -> str | None:
    """The least role `operation` needs; None when it is public."""
    if operation is Operation.METRICS and metrics_public:
        return None
    return REQUIRED_ROLE[operation]


class Authenticator:
    """Authenticates a request's credentials and authorises its operation (see the module's
    docstring). Called on the event loop only (its memory of verified tokens is not locked)."""

    def __init__(self, enabled: bool, needed: Mapping[Operation, str | None],
                 keys: tuple[ApiKey, ...], tokens: _Tokens | None) -> None:
        self.enabled = enabled
        self._needed = dict(needed)
        self._keys = keys
        self._tokens = tokens

    @classmethod
    def from_config(cls, auth: AuthConfig | None, environ: Mapping[str, str],
                    clock: Callable[[], float] = time.time) -> Authenticator:
        """Read every secret and key now. Raises ConfigError, one line per problem, for a
        secret that cannot be read or parsed (the config's checks at load make that a race)."""
        if auth is None or not auth.enabled:
            return cls(False, dict.fromkeys(Operation), (), None)
        problems: list[str] = []
        keys = load_api_keys(auth, environ, problems)
        tokens = _Tokens.from_config(auth.jwt, environ, problems, clock) if auth.jwt else None
        if problems:
            raise ConfigError(problems)
        needed = {op: required_role(op, auth.metrics_public) for op in Operation}
        return cls(True, needed, keys, tokens)

    def check(self, operation: Operation, authorization: str | None,
              api_key: str | None) -> Principal | None:
        """Who may call `operation` with these credentials: None when auth is off or the
        operation is public. `authorization` is the raw Authorization header (or gRPC
        `authorization` metadata) and wins over `api_key`, the raw X-API-Key. Raises
        Unauthenticated or PermissionDenied."""
        needed = self._needed[operation]
        if needed is None:
            return None
        principal = self._authenticate(authorization, api_key)
        if _RANK[principal.role] < _RANK[needed]:
            raise PermissionDenied(f"permission denied: {operation} needs role {needed!r} "
                                   f"(this credential has {principal.role!r})", principal.name)
        return principal

    def _authenticate(self, authorization: str | None, api_key: str | None) -> Principal:
        raw = authorization if authorization is not None else api_key
        if raw is None:
            raise Unauthenticated("missing")
        if len(raw) > MAX_CREDENTIAL_BYTES or (
                not raw.isascii() and len(utf8(raw)) > MAX_CREDENTIAL_BYTES):
            raise Unauthenticated("invalid")
        if authorization is not None:
            scheme, space, value = raw.partition(" ")
            if not space or scheme.lower() != "bearer":
                raise Unauthenticated("invalid")
        else:
            value = raw
        value = value.strip()
        if not value:
            raise Unauthenticated("invalid")
        if authorization is not None and self._tokens is not None and value.count(".") == 2:
            return self._tokens.verify(value)
        return self._api_key(value)

    def _api_key(self, presented: str) -> Principal:
        digest = hashlib.sha256(utf8(presented)).digest()
        found: Principal | None = None
        for entry in self._keys:
            # Every hash is compared, whatever matched before: the time taken tells nothing
            # about which key, if any, matches.
            if hmac.compare_digest(digest, entry.digest) and found is None:
                found = entry.principal
        if found is None:
            raise Unauthenticated("invalid")
        return found


class _Tokens:
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
                    clock: Callable[[], float]) -> _Tokens:
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
