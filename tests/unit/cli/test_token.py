"""`snooze token`, run as the real command: the token it mints, used with the models.toml it
was minted from, authenticates with the role asked for until it expires, carries the claims
the config wants, and no secret reaches stderr."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from snooze_command import authenticator, snooze, write

from snoozeml.auth.authenticator import PermissionDenied, Principal
from snoozeml.cli import exit_codes
from snoozeml.cli.main import main
from snoozeml.operations import Operation

SECRET = "a-jwt-secret-for-the-cli-tests-that-is-long-enough-for-hs512-too!"


def write_public_pem(path: Path) -> None:
    public = ec.generate_private_key(ec.SECP256R1()).public_key()
    path.write_bytes(public.public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo))


def test_a_minted_token_authenticates_with_its_role_until_it_expires(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [auth.jwt]
        algorithms = ["HS256"]
        secret_env = "SNOOZE_JWT_SECRET"
    """)
    env = {"SNOOZE_JWT_SECRET": SECRET}
    before = int(time.time())

    done = snooze("token", "--role", "readonly", "--ttl", "1h", "-c", str(path), cwd=tmp_path,
                  env=env)

    assert (done.returncode, done.stderr) == (0, "")
    token = done.stdout.strip()
    assert done.stdout == token + "\n"  # only the token
    assert SECRET not in done.stdout
    auth = authenticator(path, env)
    assert auth.check(Operation.MODEL_METADATA, f"Bearer {token}", None) == Principal(
        "snooze-cli", "readonly", "jwt")
    with pytest.raises(PermissionDenied):
        auth.check(Operation.INFER, f"Bearer {token}", None)
    claims = jwt.decode(token, SECRET, algorithms=["HS256"])
    assert claims["exp"] - claims["iat"] == 3600
    assert before <= claims["iat"] <= claims["nbf"] <= int(time.time())


def test_a_token_carries_the_roles_list_issuer_audience_and_subject_the_config_wants(
    tmp_path: Path,
) -> None:
    (tmp_path / "jwt.secret").write_text(SECRET + "\n")
    path = write(tmp_path, """
        [auth.jwt]
        algorithms = ["ES256", "HS512", "HS256"]
        secret_file = "jwt.secret"
        public_key_file = "public.pem"
        issuer = "https://snooze.example"
        audience = "snooze"
        role_claim = "roles"
    """)
    write_public_pem(tmp_path / "public.pem")

    done = snooze("token", "--role", "admin", "--ttl", "90s", "--subject", "deploy-bot",
                  "-c", "models.toml", cwd=tmp_path)

    assert (done.returncode, done.stderr) == (0, "")
    token = done.stdout.strip()
    assert jwt.get_unverified_header(token)["alg"] == "HS512"  # the first HS algorithm
    claims = jwt.decode(token, SECRET, algorithms=["HS512"], audience="snooze")
    assert (claims["roles"], claims["iss"], claims["exp"] - claims["iat"]) == (
        ["admin"], "https://snooze.example", 90)
    assert authenticator(path, {}).check(Operation.REPOSITORY_UNLOAD, f"Bearer {token}",
                                         None) == Principal("deploy-bot", "admin", "jwt")


@pytest.mark.parametrize("auth", [
    "",
    f'[auth]\napi_keys = [{{ name = "ci", role = "admin", sha256 = "{"a" * 64}" }}]',
    '[auth.jwt]\nalgorithms = ["ES256"]\npublic_key_file = "public.pem"',
], ids=["no auth", "keys only", "no hs algorithm"])
def test_token_needs_an_hs_secret_in_the_config(
    auth: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_public_pem(tmp_path / "public.pem")
    write(tmp_path, auth)
    monkeypatch.chdir(tmp_path)

    code = main(["token", "--role", "admin", "--ttl", "1h"])

    out, err = capsys.readouterr()
    assert (code, out) == (exit_codes.USAGE, "")
    assert err.startswith("snooze: snooze token mints HS256/384/512 tokens; this config has "
                          "no JWT secret")


def test_token_reports_an_invalid_config_like_serve(tmp_path: Path) -> None:
    write(tmp_path, """
        [auth.jwt]
        algorithms = ["HS256"]
        secret_env = "SNOOZE_JWT_SECRET"
    """)

    done = snooze("token", "--role", "admin", "--ttl", "1h", cwd=tmp_path,
                  env={"SNOOZE_JWT_SECRET": ""})

    assert done.returncode == exit_codes.USAGE
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "snooze: models.toml:3: auth.jwt.secret_env: environment variable SNOOZE_JWT_SECRET "
        "is empty",
        "snooze: invalid configuration (1 problem(s)); no token minted",
    ]


@pytest.mark.parametrize("ttl", ["0", "0s", "soon", "-1h"])
def test_token_refuses_a_ttl_that_is_not_a_positive_duration(
    ttl: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["token", "--role", "admin", f"--ttl={ttl}"])
    assert info.value.code == exit_codes.USAGE
    assert "--ttl" in capsys.readouterr().err
