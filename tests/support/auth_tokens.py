"""API keys, JWT settings and tokens made here, and the Authenticator built from them: what the
tests of auth/authenticator.py and auth/credentials.py share."""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

import jwt
import pytest

from snoozeml.auth.authenticator import Authenticator, Unauthenticated
from snoozeml.config.auth import ROLES, ApiKeyConfig, AuthConfig, JwtConfig
from snoozeml.operations import Operation

SECRET = "a-test-secret-of-sixty-four-bytes-long-enough-for-hs256-384-512!"
ENV = {"SNOOZE_JWT_SECRET": SECRET}
KEYS = {role: f"snz_{role}-key-{'x' * 40}" for role in ROLES}  # one key per role
INFER = Operation.INFER


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def api_keys(*roles: str) -> list[ApiKeyConfig]:
    return [ApiKeyConfig.model_validate({"name": f"{role}-key", "role": role,
                                         "sha256": sha256(KEYS[role])})
            for role in roles or ROLES]


def hs_jwt(**settings: Any) -> JwtConfig:
    return JwtConfig(algorithms=["HS256"], secret_env="SNOOZE_JWT_SECRET", **settings)


def authenticator(jwt_config: JwtConfig | None = None, keys: list[ApiKeyConfig] | None = None,
                  environ: dict[str, str] | None = None, **auth: Any) -> Authenticator:
    config = AuthConfig(api_keys=api_keys() if keys is None else keys, jwt=jwt_config, **auth)
    return Authenticator.from_config(config, ENV if environ is None else environ)


def token(claims: dict[str, Any] | None = None, key: Any = SECRET, algorithm: str = "HS256",
          headers: dict[str, Any] | None = None, **extra: Any) -> str:
    now = int(time.time())
    body = {"sub": "alice", "role": "inference", "iat": now, "exp": now + 60, **extra}
    if claims is not None:
        body = claims
    return jwt.encode(body, key, algorithm=algorithm, headers=headers)


def bearer(value: str) -> str:
    return f"Bearer {value}"


def refused(auth: Authenticator, authorization: str | None, api_key: str | None = None,
            operation: Operation = INFER) -> str:
    """The reason `check` gives, asserting it refuses as Unauthenticated."""
    with pytest.raises(Unauthenticated) as info:
        auth.check(operation, authorization, api_key)
    assert info.value.message == f"{info.value.reason} credentials"
    return info.value.reason


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
