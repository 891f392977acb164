"""The [auth] tables of models.toml (config/auth.py): read, their files resolved against the
config, and every problem (a key, a secret, a public key, a credential missing) named with
its key and line."""

from __future__ import annotations

from pathlib import Path

from config_files import problems_of, write

from snoozeml.config.settings import load_config

KEY_HASH = "a" * 64


def test_auth_tables_are_read_and_their_files_resolved_against_the_config(
    tmp_path: Path,
) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "ops.key").write_text("snz_opskey-opskey-opskey-opskey-opskey\n")
    (tmp_path / "jwt.secret").write_text("s" * 40)
    path = write(tmp_path, f"""
        [auth]
        api_keys = [
            {{ name = "ci", role = "inference", sha256 = "{KEY_HASH}" }},
            {{ name = "ops", role = "admin", key_file = "keys/ops.key" }},
            {{ name = "bot", role = "readonly", key_env = "BOT_KEY" }},
        ]
        [auth.jwt]
        algorithms = ["HS256"]
        secret_file = "jwt.secret"
        issuer = "https://issuer.example"
        leeway = "5s"
    """)
    auth = load_config(path, {"BOT_KEY": " snz_bot-bot-bot-bot-bot-bot-bot-bot-bot\n"}).auth
    assert auth is not None
    assert auth.enabled
    assert [(k.name, k.role) for k in auth.api_keys] == [
        ("ci", "inference"), ("ops", "admin"), ("bot", "readonly")]
    assert auth.api_keys[1].key_file == tmp_path / "keys" / "ops.key"
    assert auth.jwt is not None
    assert auth.jwt.secret_file == tmp_path / "jwt.secret"
    assert (auth.jwt.issuer, auth.jwt.leeway, auth.jwt.role_claim) == (
        "https://issuer.example", 5.0, "role")


def test_no_auth_table_means_none(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "[server]\n"), {}).auth is None


def test_auth_problems_name_the_key_and_the_line(tmp_path: Path) -> None:
    (tmp_path / "short.secret").write_text("too short")
    path = write(tmp_path, f"""
        [auth]
        api_keys = [
            {{ name = "ci", role = "superuser", sha256 = "{KEY_HASH}" }},
            {{ name = "ci", role = "admin", sha256 = "not-a-hash" }},
            {{ name = "env", role = "admin", key_env = "NOT_SET" }},
            {{ name = "file", role = "admin", key_file = "missing.key" }},
            {{ name = "both", role = "admin", sha256 = "{KEY_HASH}", key_env = "X" }},
        ]
        [auth.jwt]
        algorithms = ["HS256", "HS999"]
        secret_env = "SNOOZE_JWT_SECRET"
    """)
    assert problems_of(path) == [
        f"{path}:2: auth.api_keys[0].role: Input should be 'readonly', 'inference' or 'admin'",
        f"{path}:2: auth.api_keys[1].name: duplicate key name 'ci' (first in api_keys[0])",
        f"{path}:2: auth.api_keys[1].sha256: must be 64 hexadecimal digits (the SHA-256 of the "
        "key, as `snooze keys new` prints it)",
        f"{path}:2: auth.api_keys[2].key_env: environment variable NOT_SET is not set",
        f"{path}:2: auth.api_keys[3].key_file: cannot read {tmp_path / 'missing.key'}: No such "
        "file or directory",
        f"{path}:2: auth.api_keys[4]: give exactly one of sha256, key_env or key_file (got "
        "sha256, key_env)",
        f"{path}:10: auth.jwt.algorithms[1]: Input should be 'HS256', 'HS384', 'HS512', "
        "'RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'ES256', 'ES384', 'ES512' or "
        "'EdDSA'",
        f"{path}:11: auth.jwt.secret_env: environment variable SNOOZE_JWT_SECRET is not set",
    ]


def test_jwt_keys_must_exist_and_parse(tmp_path: Path) -> None:
    (tmp_path / "short.secret").write_text("too short")
    (tmp_path / "not.pem").write_text("hello")
    path = write(tmp_path, """
        [auth.jwt]
        algorithms = ["HS256", "RS256"]
        secret_file = "short.secret"
        public_key_file = "not.pem"
    """)
    problems = problems_of(path)
    assert problems[0] == (f"{path}:3: auth.jwt.secret_file: the secret is shorter than 32 "
                           "bytes, what HS256 needs (use a random secret at least as long as "
                           "its hash)")
    assert problems[1].startswith(f"{path}:4: auth.jwt.public_key_file: not a PEM public key: ")
    assert len(problems) == 2
    missing = write(tmp_path, """
        [auth.jwt]
        algorithms = ["ES256"]
    """)
    assert problems_of(missing) == [
        f"{missing}:2: auth.jwt.algorithms: ES256 need exactly one of public_key_file or "
        "jwks_file"]


def test_enabled_auth_without_any_credential_is_a_problem_and_disabled_is_not(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, """
        [auth]
        metrics_public = true
    """)
    assert problems_of(path) == [
        f"{path}:1: auth.enabled: auth is enabled but has no api_keys and no [auth.jwt]: no "
        "request could authenticate"]
    off = write(tmp_path, """
        [auth]
        enabled = false
    """)
    auth = load_config(off, {}).auth
    assert auth is not None
    assert auth.enabled is False


def test_weak_or_repeated_secrets_are_problems(tmp_path: Path) -> None:
    path = write(tmp_path, f"""
        [auth]
        api_keys = [
            {{ name = "a", role = "admin", sha256 = "{KEY_HASH}" }},
            {{ name = "b", role = "readonly", sha256 = "{KEY_HASH.upper()}" }},
            {{ name = "c", role = "admin", key_env = "SHORT_KEY" }},
        ]
        [auth.jwt]
        algorithms = ["HS256", "HS512"]
        secret_env = "SECRET"
        leeway = "10m"
    """)
    assert problems_of(path, {"SHORT_KEY": "snz_short", "SECRET": "s" * 40}) == [
        f"{path}:2: auth.api_keys[1].sha256: the same key as api_keys[0] (one key, one name "
        "and role)",
        f"{path}:2: auth.api_keys[2].key_env: the key is shorter than 32 characters (make one "
        "with `snooze keys new`)",
        f"{path}:9: auth.jwt.secret_env: the secret is shorter than 64 bytes, what HS512 needs "
        "(use a random secret at least as long as its hash)",
        f"{path}:10: auth.jwt.leeway: Input should be less than or equal to 300",
    ]


def test_disabled_auth_needs_none_of_its_secrets(tmp_path: Path) -> None:
    path = write(tmp_path, """
        [auth]
        enabled = false
        api_keys = [{ name = "c", role = "admin", key_env = "NOT_SET" }]
        [auth.jwt]
        algorithms = ["HS256"]
        secret_env = "NOT_SET_EITHER"
    """)
    auth = load_config(path, {}).auth
    assert auth is not None
    assert auth.enabled is False
