"""The `[auth]` and `[auth.jwt]` tables of models.toml, and the checks that need more than one
key or a look outside the file (an environment variable, a key file).

Secrets never sit in the file in plain text: an API key is stored as its SHA-256 hash, or named
by the environment variable or file that holds it; a JWT secret likewise. Every secret named
here must exist, be readable and parse when the daemon starts, or the daemon does not start.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr

from snoozeml.units import parse_duration

Role = Literal["readonly", "inference", "admin"]
ROLES: tuple[str, ...] = get_args(Role)  # each includes those before it
HMAC_ALGORITHMS = ("HS256", "HS384", "HS512")
KEY_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384",
                  "ES512", "EdDSA")
Algorithm = Literal["HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384",
                    "PS512", "ES256", "ES384", "ES512", "EdDSA"]
Duration = Annotated[float, BeforeValidator(lambda v: parse_duration(v))]
SHA256_HEX = re.compile(r"^[0-9a-fA-F]{64}$")  # an API key as the config stores it
MIN_KEY_LENGTH = 32  # characters of a key read from a variable or file
# RFC 7518 3.2: an HMAC key at least as long as the hash.
MIN_SECRET_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}

Problem = Callable[[tuple[str | int, ...], str], None]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ApiKeyConfig(_Section):
    """One API key: its name (logged, never the key), its role, and where the key is known
    from: its SHA-256 hash, or the variable or file holding the key itself."""

    name: StrictStr = Field(min_length=1)
    role: Role
    sha256: StrictStr | None = None
    key_env: StrictStr | None = None
    key_file: Path | None = None


class JwtConfig(_Section):
    algorithms: list[Algorithm] = Field(min_length=1)
    secret_env: StrictStr | None = None  # HS*: the shared secret
    secret_file: Path | None = None
    public_key_file: Path | None = None  # RS*/PS*/ES*/EdDSA: one PEM public key
    jwks_file: Path | None = None  # or a JWKS document, keys chosen by `kid`
    issuer: StrictStr | None = None
    audience: StrictStr | None = None
    leeway: Annotated[Duration, Field(ge=0, le=300)] = 30.0  # clock skew allowed, seconds
    role_claim: StrictStr = Field(default="role", min_length=1)  # a role, or a list of roles


class AuthConfig(_Section):
    enabled: StrictBool = True
    api_keys: list[ApiKeyConfig] = []
    metrics_public: StrictBool = False
    jwt: JwtConfig | None = None


def resolve_paths(auth: AuthConfig, base: Path) -> AuthConfig:
    """The auth config with its files resolved against the config file's folder."""

    def at(path: Path | None) -> Path | None:
        return None if path is None or path.is_absolute() else base / path

    keys = [key.model_copy(update={"key_file": at(key.key_file) or key.key_file})
            for key in auth.api_keys]
    jwt = auth.jwt
    if jwt is not None:
        jwt = jwt.model_copy(update={
            name: at(getattr(jwt, name)) or getattr(jwt, name)
            for name in ("secret_file", "public_key_file", "jwks_file")
        })
    return auth.model_copy(update={"api_keys": keys, "jwt": jwt})


# --- the checks on the raw table ---------------------------------------------------------


def check_auth(raw: object, environ: Mapping[str, str], base: Path, problem: Problem) -> None:
    """Report what the types alone cannot: one source per secret, secrets that exist and
    parse, unique key names, and an enabled auth that could authenticate someone."""
    if not isinstance(raw, dict) or raw.get("enabled", True) is False:
        return  # auth off: its secrets are not needed, nor read
    keys = raw.get("api_keys")
    names: dict[str, int] = {}
    hashes: dict[str, int] = {}
    for i, entry in enumerate(keys if isinstance(keys, list) else []):
        if not isinstance(entry, dict):
            continue
        loc = ("auth", "api_keys", i)
        name = entry.get("name")
        if isinstance(name, str):
            if name in names:
                problem((*loc, "name"), f"duplicate key name {name!r} (first in "
                        f"api_keys[{names[name]}])")
            names.setdefault(name, i)
        sources = [s for s in ("sha256", "key_env", "key_file") if s in entry]
        if len(sources) != 1:
            problem(loc, "give exactly one of sha256, key_env or key_file"
                    + (f" (got {', '.join(sources)})" if sources else ""))
            continue
        value = entry[sources[0]]
        if not isinstance(value, str):
            continue  # the type check reports it
        key: str | None = None
        if sources[0] == "sha256":
            if not SHA256_HEX.match(value):
                problem((*loc, "sha256"), "must be 64 hexadecimal digits (the SHA-256 of the "
                        "key, as `snooze keys new` prints it)")
            elif value.lower() in hashes:
                problem((*loc, "sha256"), "the same key as api_keys"
                        f"[{hashes[value.lower()]}] (one key, one name and role)")
            hashes.setdefault(value.lower(), i)
        elif sources[0] == "key_env":
            key = _secret_from_env(value, environ, (*loc, "key_env"), problem)
        else:
            key = _secret_from_file(value, base, (*loc, "key_file"), problem)
        if key is not None and len(key) < MIN_KEY_LENGTH:
            problem((*loc, sources[0]), f"the key is shorter than {MIN_KEY_LENGTH} characters "
                    "(make one with `snooze keys new`)")
    jwt = raw.get("jwt")
    if isinstance(jwt, dict):
        _check_jwt(jwt, environ, base, problem)
    if raw.get("enabled", True) is True and not keys and not isinstance(jwt, dict):
        problem(("auth", "enabled"), "auth is enabled but has no api_keys and no [auth.jwt]: "
                "no request could authenticate")


def _check_jwt(jwt: dict[str, Any], environ: Mapping[str, str], base: Path,
               problem: Problem) -> None:
    loc = ("auth", "jwt")
    algorithms = jwt.get("algorithms")
    wanted = [a for a in algorithms if isinstance(a, str)] if isinstance(algorithms, list) \
        else []
    hmac = [a for a in wanted if a in HMAC_ALGORITHMS]
    keyed = [a for a in wanted if a in KEY_ALGORITHMS]
    secrets = [s for s in ("secret_env", "secret_file") if s in jwt]
    if hmac:
        if len(secrets) != 1:
            problem((*loc, "algorithms"), f"{', '.join(hmac)} need exactly one of secret_env "
                    "or secret_file")
        elif isinstance(jwt[secrets[0]], str):
            where = (*loc, secrets[0])
            if secrets[0] == "secret_env":
                secret = _secret_from_env(jwt["secret_env"], environ, where, problem)
            else:
                secret = _secret_from_file(jwt["secret_file"], base, where, problem)
            least = max(MIN_SECRET_BYTES[a] for a in hmac)
            if secret is not None and len(secret.encode("utf-8")) < least:
                problem((*loc, secrets[0]), f"the secret is shorter than {least} bytes, what "
                        f"{max(hmac, key=MIN_SECRET_BYTES.__getitem__)} needs (use a random "
                        "secret at least as long as its hash)")
    elif secrets:
        problem((*loc, secrets[0]), "a secret is only used by HS256, HS384 or HS512, which "
                "algorithms does not list")
    public = [s for s in ("public_key_file", "jwks_file") if s in jwt]
    if keyed:
        if len(public) != 1:
            problem((*loc, "algorithms"), f"{', '.join(keyed)} need exactly one of "
                    "public_key_file or jwks_file")
        elif isinstance(jwt[public[0]], str):
            text = _secret_from_file(jwt[public[0]], base, (*loc, public[0]), problem)
            if text is not None:
                _check_public_keys(public[0], text, (*loc, public[0]), problem)
    elif public:
        problem((*loc, public[0]), "a public key is only used by RS*, PS*, ES* or EdDSA, which "
                "algorithms does not list")


def _check_public_keys(kind: str, text: str, loc: tuple[str | int, ...],
                       problem: Problem) -> None:
    import jwt

    try:
        if kind == "jwks_file":
            keys = jwt.PyJWKSet.from_dict(json.loads(text)).keys
            if not keys:
                raise ValueError("no usable key")
        else:
            from cryptography.hazmat.primitives.serialization import load_pem_public_key

            load_pem_public_key(text.encode())
    except Exception as exc:  # any parse failure is a config problem, worded by its kind
        what = "a JWKS document" if kind == "jwks_file" else "a PEM public key"
        problem(loc, f"not {what}: {type(exc).__name__}: {exc}")


def _secret_from_env(name: str, environ: Mapping[str, str], loc: tuple[str | int, ...],
                     problem: Problem) -> str | None:
    value = environ.get(name)
    value = value.strip() if value is not None else None
    if not value:
        problem(loc, f"environment variable {name} is not set" if value is None
                else f"environment variable {name} is empty")
        return None
    return value


def _secret_from_file(name: str, base: Path, loc: tuple[str | int, ...],
                      problem: Problem) -> str | None:
    path = Path(name) if Path(name).is_absolute() else base / name
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        problem(loc, f"cannot read {path}: {reason}")
        return None
    if not text:
        problem(loc, f"{path} is empty")
        return None
    return text


def read_secret(env: str | None, file: Path | None, environ: Mapping[str, str]) -> str:
    """A secret from its variable or file (both checked at start), without the surrounding
    whitespace a mounted secret often ends with."""
    if env is not None:
        return environ.get(env, "").strip()
    if file is None:
        raise OSError("no variable or file holds this secret")
    return file.read_text(encoding="utf-8").strip()
