"""The credentials the Authenticator checks against, read once at start (auth/credentials.py):
API keys from a variable or a file, and the public keys tokens verify with (PEM files and
JWKS documents, each kept with the algorithms it can verify); what cannot be read stops the
start with one line each."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import pytest
from auth_tokens import INFER, authenticator, b64url, bearer, hs_jwt, refused, sha256, token
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from snoozeml.auth.authenticator import Authenticator, Principal
from snoozeml.config.auth import ApiKeyConfig, JwtConfig
from snoozeml.config.settings import parse_config
from snoozeml.errors import ConfigError
from snoozeml.operations import Operation


def pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def other_rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def keyed(tmp_path: Path, key: Any, *algorithms: str) -> Authenticator:
    """An Authenticator verifying `algorithms` with the public half of `key`, as a PEM file."""
    (tmp_path / "public.pem").write_bytes(pem(key))
    return authenticator(JwtConfig.model_validate({"algorithms": algorithms,
                                                   "public_key_file": tmp_path / "public.pem"}))


def test_keys_from_a_variable_or_a_file_are_hashed_at_start(tmp_path: Path) -> None:
    (tmp_path / "ops.key").write_text("snz_from-a-file\n")
    auth = authenticator(keys=[
        ApiKeyConfig(name="bot", role="readonly", key_env="BOT_KEY"),
        ApiKeyConfig(name="ops", role="admin", key_file=tmp_path / "ops.key"),
        ApiKeyConfig(name="ci", role="inference", sha256=sha256("snz_ci").upper()),
    ], environ={"BOT_KEY": "snz_from-a-variable"})
    (tmp_path / "ops.key").unlink()  # read once, at start
    assert auth.check(Operation.SERVER_METADATA, bearer("snz_from-a-variable"), None) == \
        Principal("bot", "readonly", "api_key")
    assert auth.check(INFER, None, "snz_from-a-file") == Principal("ops", "admin", "api_key")
    assert auth.check(INFER, None, "snz_ci") == Principal("ci", "inference", "api_key")


def test_unreadable_secrets_and_one_key_under_two_names_stop_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        authenticator(hs_jwt(), keys=[
            ApiKeyConfig(name="a", role="admin", key_env="UNSET"),
            ApiKeyConfig(name="b", role="admin", key_file=tmp_path / "gone.key"),
            ApiKeyConfig(name="c", role="admin", sha256=sha256("snz_same")),
            ApiKeyConfig(name="d", role="readonly", key_env="SAME"),
        ], environ={"SAME": "snz_same"})
    assert info.value.problems == [
        "auth.api_keys[0].key_env: environment variable UNSET is not set or empty",
        f"auth.api_keys[1].key_file: cannot read {tmp_path / 'gone.key'}: No such file or "
        "directory",
        "auth.api_keys[3]: the same key as api_keys[2]",
        "auth.jwt.secret_env: environment variable SNOOZE_JWT_SECRET is not set or empty",
    ]


def test_rs256_es256_and_eddsa_tokens_verify_with_a_pem_public_key(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey,
) -> None:
    cases: list[tuple[Any, str]] = [
        (rsa_key, "RS256"), (rsa_key, "PS256"),
        (ec.generate_private_key(ec.SECP256R1()), "ES256"),
        (ed25519.Ed25519PrivateKey.generate(), "EdDSA"),
    ]
    for private, algorithm in cases:
        auth = keyed(tmp_path, private, algorithm)
        assert auth.check(INFER, bearer(token(key=private, algorithm=algorithm)), None) == \
            Principal("alice", "inference", "jwt"), algorithm


def test_a_token_signed_by_another_key_or_for_another_key_type_is_invalid(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, other_rsa_key: rsa.RSAPrivateKey,
) -> None:
    auth = keyed(tmp_path, rsa_key, "RS256", "ES256")
    assert refused(auth, bearer(token(key=other_rsa_key, algorithm="RS256"))) == "invalid"
    es = ec.generate_private_key(ec.SECP256R1())
    assert refused(auth, bearer(token(key=es, algorithm="ES256"))) == "invalid"


def confused_token(public_pem: bytes) -> str:
    """An HS256 token whose HMAC secret is the server's RSA public key: what an attacker who
    knows the public key would forge. PyJWT refuses to make one, so it is made by hand."""
    now = int(time.time())
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = b64url(json.dumps({"sub": "mallory", "role": "admin", "exp": now + 60}).encode())
    signature = hmac.new(public_pem, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{b64url(signature)}"


def test_an_rsa_public_key_used_as_an_hmac_secret_is_refused(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey,
) -> None:
    forged = confused_token(pem(rsa_key))
    assert refused(keyed(tmp_path, rsa_key, "RS256"), bearer(forged)) == "invalid"
    (tmp_path / "public.pem").write_bytes(pem(rsa_key))
    both = authenticator(JwtConfig(algorithms=["RS256", "HS256"],
                                   public_key_file=tmp_path / "public.pem",
                                   secret_env="SNOOZE_JWT_SECRET"))
    assert refused(both, bearer(forged)) == "invalid"
    assert both.check(INFER, bearer(token()), None) is not None  # its own secret works


def jwks(tmp_path: Path, *entries: tuple[Any, str | None]) -> Authenticator:
    keys = []
    for private, kid in entries:
        algorithm = RSAAlgorithm if isinstance(private, rsa.RSAPrivateKey) else ECAlgorithm
        jwk = json.loads(algorithm.to_jwk(private.public_key()))
        keys.append({**jwk, "kid": kid} if kid is not None else jwk)
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": keys}))
    return authenticator(JwtConfig(algorithms=["RS256", "ES256"],
                                   jwks_file=tmp_path / "jwks.json"))


def test_the_jwks_key_is_chosen_by_kid(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, other_rsa_key: rsa.RSAPrivateKey,
) -> None:
    auth = jwks(tmp_path, (rsa_key, "one"), (other_rsa_key, "two"))
    for private, kid in ((rsa_key, "one"), (other_rsa_key, "two")):
        signed = token(key=private, algorithm="RS256", headers={"kid": kid})
        assert auth.check(INFER, bearer(signed), None) is not None
    swapped = token(key=rsa_key, algorithm="RS256", headers={"kid": "two"})
    assert refused(auth, bearer(swapped)) == "invalid"


def test_an_unknown_kid_or_none_among_several_keys_is_invalid(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey, other_rsa_key: rsa.RSAPrivateKey,
) -> None:
    auth = jwks(tmp_path, (rsa_key, "one"), (other_rsa_key, "two"))
    unknown = token(key=rsa_key, algorithm="RS256", headers={"kid": "three"})
    assert refused(auth, bearer(unknown)) == "invalid"
    assert refused(auth, bearer(token(key=rsa_key, algorithm="RS256"))) == "invalid"


def test_a_jwks_of_one_key_verifies_a_token_without_kid(tmp_path: Path) -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    auth = jwks(tmp_path, (private, "only"))
    assert auth.check(INFER, bearer(token(key=private, algorithm="ES256")), None) is not None
    other = token(key=private, algorithm="ES256", headers={"kid": "other"})
    assert refused(auth, bearer(other)) == "invalid"


def test_a_public_key_that_verifies_no_allowed_algorithm_stops_the_start(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey,
) -> None:
    with pytest.raises(ConfigError) as info:
        keyed(tmp_path, rsa_key, "ES256")
    assert info.value.problems == [
        f"auth.jwt.public_key_file: this {type(rsa_key.public_key()).__name__} verifies none "
        "of ES256"]


def test_keys_read_through_parse_config_resolve_against_the_config_folder(
    tmp_path: Path, rsa_key: rsa.RSAPrivateKey,
) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "public.pem").write_bytes(pem(rsa_key))
    raw = {"auth": {"api_keys": [{"name": "ci", "role": "inference", "key_env": "CI_KEY"}],
                    "jwt": {"algorithms": ["RS256"], "public_key_file": "keys/public.pem"}}}
    environ = {"CI_KEY": "snz_ci-key-long-enough-to-be-a-real-key"}
    config = parse_config(raw, source=tmp_path / "models.toml", environ=environ)
    auth = Authenticator.from_config(config.auth, environ)
    assert auth.check(INFER, None, environ["CI_KEY"]) == Principal("ci", "inference", "api_key")
    signed = token(key=rsa_key, algorithm="RS256", role="admin")
    assert auth.check(INFER, bearer(signed), None) == Principal("alice", "admin", "jwt")
