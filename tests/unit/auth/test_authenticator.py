"""The Authenticator on real credentials: the role table, API keys hashed with SHA-256, tokens
signed by PyJWT with HMAC secrets, the role claim, and verified tokens remembered until they
expire. (Keys read from variables and files, PEM and JWKS public keys: test_credentials.py.)"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from auth_tokens import (
    INFER,
    KEYS,
    SECRET,
    api_keys,
    authenticator,
    b64url,
    bearer,
    hs_jwt,
    refused,
    sha256,
    token,
)

from snoozeml.auth.authenticator import (
    MAX_CREDENTIAL_BYTES,
    REQUIRED_ROLE,
    Authenticator,
    PermissionDenied,
    Principal,
    Unauthenticated,
    required_role,
)
from snoozeml.config.auth import ROLES, ApiKeyConfig, AuthConfig
from snoozeml.operations import OPERATIONS, Access, Operation


def hand_made(header: dict[str, Any], claims: dict[str, Any], signature: bytes = b"") -> str:
    return ".".join((b64url(json.dumps(header).encode()), b64url(json.dumps(claims).encode()),
                     b64url(signature)))


# --- the role table ----------------------------------------------------------------------


def test_the_role_table_names_every_operation() -> None:
    assert set(REQUIRED_ROLE) == set(Operation)


def test_each_role_follows_what_the_operation_exposes() -> None:
    by_access = {Access.PROBE: None, Access.READ: "readonly", Access.INFER: "inference",
                 Access.ADMIN: "admin"}
    for operation, spec in OPERATIONS.items():
        assert REQUIRED_ROLE[operation] == by_access[spec.access], operation


def test_probes_are_public_and_metrics_only_when_configured() -> None:
    public = {op for op in Operation if required_role(op) is None}
    assert public == {Operation.SERVER_LIVE, Operation.SERVER_READY, Operation.HEALTH}
    assert required_role(Operation.METRICS) == "readonly"
    assert required_role(Operation.METRICS, metrics_public=True) is None
    assert required_role(INFER, metrics_public=True) == "inference"


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("operation", list(Operation))
def test_every_operation_answers_every_role_as_the_table_says(
    operation: Operation, role: str,
) -> None:
    auth = authenticator(hs_jwt())
    needed = REQUIRED_ROLE[operation]
    credentials = {"api_key": bearer(KEYS[role]), "jwt": bearer(token(role=role))}
    for via, authorization in credentials.items():
        if needed is None:
            assert auth.check(operation, authorization, None) is None
        elif ROLES.index(role) >= ROLES.index(needed):
            principal = auth.check(operation, authorization, None)
            assert principal is not None
            assert (principal.role, principal.via) == (role, via)
        else:
            with pytest.raises(PermissionDenied) as info:
                auth.check(operation, authorization, None)
            assert info.value.message == (f"permission denied: {operation.value} needs role "
                                          f"{needed!r} (this credential has {role!r})")


def test_public_operations_ignore_credentials_even_invalid_ones() -> None:
    auth = authenticator()
    for operation in (Operation.SERVER_LIVE, Operation.SERVER_READY, Operation.HEALTH):
        assert auth.check(operation, None, None) is None
        assert auth.check(operation, "Basic nonsense", "wrong") is None


def test_metrics_public_opens_metrics_and_nothing_else() -> None:
    auth = authenticator(metrics_public=True)
    assert auth.check(Operation.METRICS, None, None) is None
    assert refused(auth, None, operation=Operation.MODEL_STATS) == "missing"


@pytest.mark.parametrize("config", [None, AuthConfig(enabled=False, api_keys=api_keys())],
                         ids=["absent", "disabled"])
def test_without_auth_every_operation_is_open(config: AuthConfig | None) -> None:
    auth = Authenticator.from_config(config, {})
    assert auth.enabled is False
    for operation in Operation:
        assert auth.check(operation, None, None) is None
        assert auth.check(operation, "Bearer garbage", "garbage") is None


# --- API keys ----------------------------------------------------------------------------


def test_an_api_key_authenticates_as_its_name_and_role() -> None:
    auth = authenticator()
    assert auth.check(INFER, bearer(KEYS["inference"]), None) == Principal(
        "inference-key", "inference", "api_key")
    assert auth.check(INFER, None, KEYS["admin"]) == Principal("admin-key", "admin", "api_key")


def test_the_bearer_scheme_is_case_insensitive_and_takes_several_spaces() -> None:
    auth = authenticator()
    for header in (f"bearer {KEYS['admin']}", f"BEARER   {KEYS['admin']}"):
        principal = auth.check(INFER, header, None)
        assert principal is not None
        assert principal.name == "admin-key"


def test_a_key_one_character_off_or_unknown_is_invalid() -> None:
    auth = authenticator()
    key = KEYS["admin"]
    assert refused(auth, bearer(key[:-1] + ("y" if key[-1] != "y" else "z"))) == "invalid"
    assert refused(auth, bearer(key + "x")) == "invalid"
    assert refused(auth, None, "snz_unknown") == "invalid"


@pytest.mark.parametrize("header", [
    "", "   ", "Bearer", "Bearer ", "Bearer    ", "Bearerx", f"Bearerx {KEYS['admin']}",
    f"Basic {KEYS['admin']}", f"Token {KEYS['admin']}", f"{KEYS['admin']}",
])
def test_a_malformed_or_empty_authorization_is_invalid(header: str) -> None:
    assert refused(authenticator(), header) == "invalid"


def test_an_empty_api_key_header_is_invalid() -> None:
    assert refused(authenticator(), None, "") == "invalid"
    assert refused(authenticator(), None, "  ") == "invalid"


def test_no_credentials_are_missing() -> None:
    assert refused(authenticator(), None, None) == "missing"


def test_authorization_wins_over_the_api_key_header() -> None:
    auth = authenticator()
    assert refused(auth, "Bearer wrong", KEYS["admin"]) == "invalid"
    principal = auth.check(INFER, bearer(KEYS["admin"]), "wrong")
    assert principal is not None
    assert principal.name == "admin-key"


def test_a_credential_over_the_size_limit_is_invalid_even_when_it_would_match() -> None:
    huge = "snz_" + "k" * MAX_CREDENTIAL_BYTES
    auth = authenticator(keys=[ApiKeyConfig(name="huge", role="admin", key_env="HUGE")],
                         environ={"HUGE": huge})
    assert refused(auth, bearer(huge)) == "invalid"
    assert refused(auth, None, huge) == "invalid"
    assert refused(authenticator(hs_jwt()), bearer("e" * 100_000 + ".a.b")) == "invalid"
    assert refused(authenticator(), None, "é" * (MAX_CREDENTIAL_BYTES // 2 + 1)) == "invalid"


def test_a_key_with_dots_is_an_api_key_unless_tokens_are_configured() -> None:
    dotted = [ApiKeyConfig(name="dotted", role="admin", sha256=sha256("a.b.c"))]
    assert authenticator(keys=dotted).check(INFER, bearer("a.b.c"), None) == Principal(
        "dotted", "admin", "api_key")
    assert refused(authenticator(hs_jwt(), keys=dotted), bearer("a.b.c")) == "invalid"
    # X-API-Key always carries a key, never a token.
    assert authenticator(hs_jwt(), keys=dotted).check(INFER, None, "a.b.c") is not None


# --- tokens: HMAC ------------------------------------------------------------------------


def test_an_hs256_token_authenticates_as_its_subject_and_role() -> None:
    auth = authenticator(hs_jwt())
    assert auth.check(INFER, bearer(token()), None) == Principal("alice", "inference", "jwt")
    now = int(time.time())
    anonymous = token({"role": "admin", "exp": now + 60})
    assert auth.check(INFER, bearer(anonymous), None) == Principal("", "admin", "jwt")


def test_an_expired_token_is_expired_past_the_leeway_only() -> None:
    past = int(time.time()) - 10
    assert refused(authenticator(hs_jwt(leeway=0)), bearer(token(exp=past))) == "expired"
    assert authenticator(hs_jwt(leeway=30)).check(INFER, bearer(token(exp=past)), None) \
        is not None


def test_a_token_not_yet_valid_is_invalid() -> None:
    future = int(time.time()) + 3600
    auth = authenticator(hs_jwt())
    assert refused(auth, bearer(token(nbf=future))) == "invalid"
    assert refused(auth, bearer(token(iat=future))) == "invalid"


def test_a_token_without_exp_is_invalid() -> None:
    assert refused(authenticator(hs_jwt()), bearer(token({"sub": "a", "role": "admin"}))) == \
        "invalid"


def test_a_wrong_signature_or_a_changed_payload_is_invalid() -> None:
    auth = authenticator(hs_jwt())
    assert refused(auth, bearer(token(key="another-secret-of-at-least-32-bytes!!"))) == \
        "invalid"
    header, _, signature = token().split(".")
    now = int(time.time())
    forged = b64url(json.dumps({"sub": "alice", "role": "admin", "exp": now + 60}).encode())
    assert refused(auth, bearer(f"{header}.{forged}.{signature}")) == "invalid"


def test_issuer_and_audience_are_checked_when_configured() -> None:
    auth = authenticator(hs_jwt(issuer="https://issuer.example", audience="snooze"))
    good = token(iss="https://issuer.example", aud="snooze")
    assert auth.check(INFER, bearer(good), None) is not None
    assert refused(auth, bearer(token(iss="https://evil.example", aud="snooze"))) == "invalid"
    assert refused(auth, bearer(token(iss="https://issuer.example", aud="other"))) == "invalid"
    assert refused(auth, bearer(token(aud="snooze"))) == "invalid"  # no iss at all
    assert refused(auth, bearer(token(iss="https://issuer.example"))) == "invalid"  # no aud


def test_alg_none_is_refused() -> None:
    now = int(time.time())
    unsigned = hand_made({"alg": "none", "typ": "JWT"},
                         {"sub": "mallory", "role": "admin", "exp": now + 60})
    assert refused(authenticator(hs_jwt()), bearer(unsigned)) == "invalid"
    assert refused(authenticator(hs_jwt()), bearer(unsigned.replace("none", "None"))) == \
        "invalid"


@pytest.mark.parametrize("value", [
    "a.b.c", "...", "eyJhbGciOiJIUzI1NiJ9.e30.", hand_made({"alg": 256}, {}),
    hand_made({"alg": ["HS256"]}, {}), hand_made({"alg": "HS256", "kid": 7}, {}),
    b64url(b"[1]") + ".e30.c2ln",
])
def test_a_malformed_token_is_invalid(value: str) -> None:
    assert refused(authenticator(hs_jwt()), bearer(value)) == "invalid"


def test_a_token_of_an_algorithm_not_allowed_is_invalid() -> None:
    auth = authenticator(hs_jwt())
    assert refused(auth, bearer(token(algorithm="HS512"))) == "invalid"


# --- the role claim ----------------------------------------------------------------------


@pytest.mark.parametrize("claims", [{}, {"role": "superuser"}, {"role": ["root", 3]},
                                    {"role": 2}, {"role": None}],
                         ids=["missing", "unknown", "unknown list", "number", "null"])
def test_a_token_granting_no_known_role_is_denied(claims: dict[str, Any]) -> None:
    now = int(time.time())
    signed = token({"sub": "bob", "exp": now + 60, **claims})
    with pytest.raises(PermissionDenied) as info:
        authenticator(hs_jwt()).check(Operation.SERVER_METADATA, bearer(signed), None)
    assert info.value.message == "permission denied: the credential grants no known role"
    assert info.value.principal == "bob"


def test_the_highest_known_role_of_a_list_wins() -> None:
    auth = authenticator(hs_jwt(role_claim="roles"))
    signed = token(roles=["readonly", "superuser", "admin", "inference"])
    assert auth.check(Operation.REPOSITORY_LOAD, bearer(signed), None) == Principal(
        "alice", "admin", "jwt")
    assert auth.check(INFER, bearer(token(roles="inference")), None) is not None


def test_a_denial_names_the_principal_never_the_credential() -> None:
    auth = authenticator(hs_jwt())
    checks: list[Callable[[], object]] = [
        lambda: auth.check(INFER, bearer(KEYS["readonly"]), None),
        lambda: auth.check(INFER, bearer(token(role="readonly")), None),
    ]
    for check, principal in zip(checks, ("readonly-key", "alice"), strict=True):
        with pytest.raises(PermissionDenied) as info:
            check()
        assert info.value.principal == principal
        assert info.value.message == ("permission denied: infer needs role 'inference' (this "
                                      "credential has 'readonly')")


# --- tokens that verified are remembered until they expire ------------------------------------


def test_a_remembered_token_expires_on_time() -> None:
    now = [time.time()]
    auth = Authenticator.from_config(AuthConfig(jwt=hs_jwt(leeway=0)),
                                     {"SNOOZE_JWT_SECRET": SECRET}, clock=lambda: now[0])
    expires = int(now[0]) + 60
    value = token({"exp": expires, "role": "inference", "sub": "svc"})
    first = auth.check(Operation.INFER, bearer(value), None)
    assert first == Principal("svc", "inference", "jwt")
    # PyJWT would still take it (its clock is the real one): the memory of it must not.
    now[0] = expires + 1
    with pytest.raises(Unauthenticated) as late:
        auth.check(Operation.INFER, bearer(value), None)
    assert late.value.reason == "expired"
    now[0] = expires - 1  # forgotten once expired: verified again from scratch
    assert auth.check(Operation.INFER, bearer(value), None) == first


def test_a_remembered_token_keeps_its_role_checked_per_operation() -> None:
    auth = Authenticator.from_config(AuthConfig(jwt=hs_jwt()), {"SNOOZE_JWT_SECRET": SECRET})
    value = token(role="readonly")
    assert auth.check(Operation.SERVER_METADATA, bearer(value), None) is not None
    with pytest.raises(PermissionDenied):
        auth.check(Operation.INFER, bearer(value), None)
    with pytest.raises(PermissionDenied):  # the second time too, from memory
        auth.check(Operation.INFER, bearer(value), None)


# --- the table printed in docs/security.md is the code's --------------------------------------


def _docs_table() -> dict[str, tuple[str, str, str]]:
    text = (Path(__file__).parents[3] / "docs" / "security.md").read_text()
    table = text.split("<!-- roles:begin -->")[1].split("<!-- roles:end -->")[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = (cells[1], cells[2], cells[3])
    return rows


def _cell(items: list[str]) -> str:
    return ", ".join(f"`{item}`" for item in items) or "—"


def test_the_role_table_in_the_docs_is_the_codes() -> None:
    expected = {
        operation.value: (
            _cell([f"{method} {path}" for method, path in OPERATIONS[operation].http]),
            _cell(list(OPERATIONS[operation].grpc)),
            required_role(operation) or "public",
        )
        for operation in Operation
    }
    assert _docs_table() == expected


def test_the_default_role_claim_also_reads_a_roles_list() -> None:
    auth = Authenticator.from_config(AuthConfig(jwt=hs_jwt()), {"SNOOZE_JWT_SECRET": SECRET})
    now = int(time.time())
    value = token({"sub": "svc", "exp": now + 60, "roles": ["readonly", "admin", "nobody"]})
    assert auth.check(Operation.REPOSITORY_LOAD, bearer(value), None) == Principal(
        "svc", "admin", "jwt")
    named = Authenticator.from_config(AuthConfig(jwt=hs_jwt(role_claim="scope")),
                                      {"SNOOZE_JWT_SECRET": SECRET})
    with pytest.raises(PermissionDenied):  # a configured claim reads that claim only
        named.check(Operation.INFER, bearer(value), None)
