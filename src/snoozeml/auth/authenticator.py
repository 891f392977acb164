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

Tokens are auth/tokens.py's, imported only when the config has an [auth.jwt] table: without
one, PyJWT and cryptography are never loaded.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from snoozeml.auth.credentials import ApiKey, Principal, load_api_keys, utf8
from snoozeml.auth.refusals import PermissionDenied, Reason, Unauthenticated
from snoozeml.config.auth import ROLES, AuthConfig
from snoozeml.errors import ConfigError
from snoozeml.operations import Operation

if TYPE_CHECKING:
    from snoozeml.auth.tokens import Tokens

# Importers of this module find the refusals and the principal here too.
__all__ = ["REQUIRED_ROLE", "Authenticator", "PermissionDenied", "Principal", "Reason",
           "Unauthenticated", "required_role"]


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
    Operation.RERANK: "inference",
    Operation.TEI_RERANK: "inference",
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

_RANK: Mapping[str, int] = {role: rank for rank, role in enumerate(ROLES)}


def required_role(operation: Operation, metrics_public: bool = False) -> str | None:
    """The least role `operation` needs; None when it is public."""
    if operation is Operation.METRICS and metrics_public:
        return None
    return REQUIRED_ROLE[operation]


class Authenticator:
    """Authenticates a request's credentials and authorises its operation (see the module's
    docstring). Called on the event loop only (its memory of verified tokens is not locked)."""

    def __init__(self, enabled: bool, needed: Mapping[Operation, str | None],
                 keys: tuple[ApiKey, ...], tokens: Tokens | None) -> None:
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
        tokens = None
        if auth.jwt:  # PyJWT and cryptography are imported only for a config that uses them
            from snoozeml.auth.tokens import Tokens

            tokens = Tokens.from_config(auth.jwt, environ, problems, clock)
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
