"""Typed settings from models.toml, with `SNOOZE_*` environment overrides.

`load_config` either returns a fully validated `Config` or raises `ConfigError` with one line per
problem, each naming the key and, where the file says, its line: `models.toml:12: models[1].
idle_timeout: invalid duration 'abc' (...)`.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from snoozeml.config.auth import AuthConfig, check_auth, resolve_paths
from snoozeml.config.checks import MODEL_NAME, check_models, check_ports
from snoozeml.config.env import apply_env
from snoozeml.config.image import ImageConfig
from snoozeml.config.lines import describe, dotted, index_lines, line_of, problem_line
from snoozeml.errors import ConfigError
from snoozeml.units import parse_duration, parse_size

Duration = Annotated[float, BeforeValidator(lambda v: parse_duration(v))]
# A load still running after it is cut (engine/deadline.py), so 0 would fail every load.
LoadDeadline = Annotated[Duration, Field(gt=0)]
DurationOrNever = Annotated[
    float | None, BeforeValidator(lambda v: parse_duration(v, allow_never=True))
]
KeepAlive = Literal["fixed", "adaptive"]
Size = Annotated[int, BeforeValidator(lambda v: parse_size(v)), Field(ge=1)]
Budget = Annotated[
    float | int, BeforeValidator(lambda v: parse_size(v, allow_percent=True)), Field(gt=0)
]


def _non_empty_path(value: object) -> object:
    if value == "":
        raise ValueError("must not be empty")
    return value


def _factory_target(value: object) -> object:
    if isinstance(value, str) and not re.fullmatch(r"[\w.]+:[\w.]+", value):
        raise ValueError(f"{value!r} must look like 'package.module:factory'")
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MemoryConfig(_Section):
    host_budget: Budget = 0.8
    gpu_budget: Budget = 0.9
    memory_wait: Duration = 10.0
    min_residency: Duration = 2.0
    memory_factor: StrictFloat = Field(default=1.1, gt=0)
    # Victims under memory pressure: "lru" least recently used, "cost" by expected cost
    # (engine/memory/budgets.py pick_victims_by_cost), "auto" cost when any model's keep-alive
    # is adaptive, else lru (what the daemon did before it had a choice).
    eviction: Literal["auto", "lru", "cost"] = "auto"


class MetricsConfig(_Section):
    """`[server.metrics]`: the Prometheus endpoint (docs/operations.md, docs/metrics.md)."""

    enabled: StrictBool = True  # false: nothing is recorded, and /metrics answers 404
    per_model: StrictBool = True  # false: the `model` label is "" on every series


Strategy = Literal["least-queue", "round-robin"]


class ReplicaDefaults(_Section):
    """The `[server.replicas]` keys: defaults for every model's `[models.replicas]`."""

    min: StrictInt = Field(default=0, ge=0, le=1024)
    max: StrictInt = Field(default=1, ge=1, le=1024)
    strategy: Strategy = "least-queue"
    target_queue: StrictFloat | StrictInt = Field(default=4, gt=0)
    scale_up_after: Duration = 1.0
    scale_down_after: Duration = 30.0


class ReplicasConfig(ReplicaDefaults):
    """`[models.replicas]`: how many instances of the model may run, and where."""

    devices: list[StrictStr] = []


# gRPC takes durations in milliseconds, as a C int: about 24.8 days at most.
GrpcDuration = Annotated[Duration, Field(gt=0, le=(2**31 - 1) / 1000)]


class ServerConfig(_Section):
    # Strict types: TOML has real booleans and integers, so `port = true` or `preload = "yes"`
    # is a mistake to report, not a value to coerce.
    host: StrictStr = Field(default="127.0.0.1", min_length=1)
    http_port: StrictInt = Field(default=8080, ge=0, le=65535)
    grpc_port: StrictInt = Field(default=8081, ge=0, le=65535)
    idle_timeout: DurationOrNever = 300.0
    # "adaptive": each model learns when to unload and pre-warm from its own idle gaps
    # (engine/keepalive/), falling back to idle_timeout; "fixed": idle_timeout alone.
    keep_alive: KeepAlive = "fixed"
    load_timeout: LoadDeadline = 300.0
    drain_timeout: Duration = 30.0
    max_request_size: Size = 64 * 1024 * 1024
    # gRPC takes the limit as a C int: 2 GiB - 1 at most, and 0 would refuse every message.
    grpc_max_message_size: Size = Field(default=64 * 1024 * 1024, ge=1, le=2**31 - 1)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # What one HTTP client may hold (api/http/protocol.py, docs/security.md#connection-limits).
    max_header_size: Size = 16 * 1024  # the header lines of one request; past it, 431
    max_request_line: Size = 8 * 1024  # the request target; past it, 414
    max_connections: StrictInt = Field(default=1024, ge=1)  # the next one gets 503
    keep_alive_timeout: Duration = Field(default=5.0, gt=0)  # an idle connection closes
    header_timeout: Duration = Field(default=10.0, gt=0)  # first byte to end of headers, or 408
    body_timeout: Duration = Field(default=60.0, gt=0)  # end of headers to end of body, or 408
    # The same for gRPC, as grpc core channel arguments (api/grpc/service.py), which are C ints.
    grpc_max_metadata_size: Size = Field(default=16 * 1024, le=2**31 - 1)
    grpc_max_concurrent_streams: StrictInt = Field(default=100, ge=1, le=2**31 - 1)
    grpc_keepalive_time: GrpcDuration = 60.0  # the server pings every connection this often
    grpc_keepalive_timeout: GrpcDuration = 20.0  # and drops it when a ping has no answer by then
    grpc_keepalive_min_time: GrpcDuration = 10.0  # pinged more often: GOAWAY (too_many_pings)
    # Load-ready copies of ONNX weights (runtime/onnx/cache.py); None: the user's cache folder.
    cache_dir: Annotated[Path, BeforeValidator(_non_empty_path)] | None = None
    # The most inputs one /v1/embeddings request may carry (OpenAI's own limit).
    max_embedding_inputs: StrictInt = Field(default=2048, ge=1)
    # The most documents one rerank request may carry (Cohere's advice; each is a row).
    max_rerank_documents: StrictInt = Field(default=1000, ge=1)
    # KServe ModelMesh's model-runtime SPI (api/grpc/modelmesh.py): off unless a port is set (0
    # picks a free one). ModelMesh runs in the same pod and expects 8085, so it listens on
    # loopback unless told otherwise.
    modelmesh_port: StrictInt | None = Field(default=None, ge=0, le=65535)
    modelmesh_host: StrictStr = Field(default="127.0.0.1", min_length=1)
    modelmesh_loading_concurrency: StrictInt = Field(default=2, ge=1, le=1024)
    modelmesh_default_model_size: Size = 128 * 1024 * 1024
    memory: MemoryConfig = MemoryConfig()
    replicas: ReplicaDefaults = ReplicaDefaults()
    metrics: MetricsConfig = MetricsConfig()


# A text model's batch is bounded by tokens per run (max_batch_tokens), so it may gather more
# rows to sort by length: 4 requests of 32 sentences, as infinity sorts 4 batches' worth.
TEXT_MAX_BATCH_SIZE = 128


class BatchingConfig(_Section):
    max_batch_size: StrictInt = Field(default=32, ge=0)  # TEXT_MAX_BATCH_SIZE with tokenize
    max_delay: Duration = 0.0
    max_queue: StrictInt = Field(default=1024, ge=1)
    # Text models: padded tokens per run of a batch's rows sorted by length (None: 512 on a
    # CPU, 16,384 on a GPU; runtime/text/by_length.py).
    max_batch_tokens: StrictInt | None = Field(default=None, ge=1)


class TensorConfig(_Section):
    """A declared input or output (plain state-dict torch models, which carry no metadata)."""

    name: StrictStr
    datatype: StrictStr
    shape: list[StrictInt]


class ModelConfig(_Section):
    name: StrictStr
    path: Annotated[Path, BeforeValidator(_non_empty_path)]
    format: Literal["onnx", "torch"] | None = None
    device: str = "auto"
    # None in the file means "inherit from [server]"; `never` pins. Resolved by load_config.
    idle_timeout: DurationOrNever = None
    keep_alive: KeepAlive | None = None  # None: inherit from [server]
    load_timeout: LoadDeadline | None = None
    preload: StrictBool = False
    intra_op_threads: StrictInt = Field(default=1, ge=0, le=1024)
    tensorrt: StrictBool = False
    memory_factor: StrictFloat | None = Field(default=None, gt=0)
    # --- ONNX models on the CPU: how they load (docs/models.md) ---
    weights_cache: StrictBool = True
    prepack: Literal["auto", "on", "off"] = "auto"
    # --- torch (safetensors) models ---
    task: Literal["feature-extraction", "text-classification", "image-classification"] | None = (
        None
    )
    # --- text models (torch feature-extraction; ONNX with tokenize): runtime/text/settings.py.
    # None: from the folder's sentence-transformers files, else mean / true / 512.
    pooling: Literal["mean", "cls", "max", "last", "model"] | None = None
    normalize: StrictBool | None = None
    tokenize: StrictBool = False
    max_length: StrictInt | None = Field(default=None, ge=1)
    truncate: StrictBool = True  # false: a text longer than max_length is a 400
    # Text pairs (runtime/text/pairs.py): false cuts only the second text, never the query.
    truncate_query: StrictBool = True
    tokenizer: Annotated[Path, BeforeValidator(_non_empty_path)] | None = None  # ONNX
    matryoshka: StrictBool = False  # requests may ask for fewer embedding `dimensions`
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    module: Annotated[StrictStr, BeforeValidator(_factory_target)] | None = None
    # One class label per line, for the classification extension (runtime/labels.py).
    labels: Annotated[Path, BeforeValidator(_non_empty_path)] | None = None
    # Encoded images as an `image` input (config/image.py, runtime/image/).
    image: ImageConfig | None = None
    inputs: list[TensorConfig] = []
    outputs: list[TensorConfig] = []
    batching: BatchingConfig = BatchingConfig()
    # Resolved by load_config: each key the model's table leaves out comes from [server].
    replicas: ReplicasConfig = ReplicasConfig()

    @model_validator(mode="after")
    def _text_batches(self) -> ModelConfig:
        """A model that tokenizes text batches up to TEXT_MAX_BATCH_SIZE rows unless its entry
        says otherwise."""
        if self.tokenize and "max_batch_size" not in self.batching.model_fields_set:
            batching = self.batching.model_copy(update={"max_batch_size": TEXT_MAX_BATCH_SIZE})
            object.__setattr__(self, "batching", batching)
        return self


class Config(_Section):
    server: ServerConfig = ServerConfig()
    auth: AuthConfig | None = None  # absent: open (the daemon warns at start)
    models: list[ModelConfig] = []
    # Where the file lives; model paths are resolved against it.
    source: Path | None = None


def default_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where `[server] cache_dir` points when unset: `$XDG_CACHE_HOME/snoozeml`, or
    `~/.cache/snoozeml`."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "snoozeml"


# --- loading ---------------------------------------------------------------------------


def load_config(
    path: Path, environ: Mapping[str, str] | None = None, gpus: Sequence[str] | None = None
) -> Config:
    """Read, validate and resolve a models.toml. Raises ConfigError listing every problem.
    `gpus` (the machine's, e.g. ["cuda:0"]), when given, is what `replicas.devices` may name."""
    environ = os.environ if environ is None else environ
    label = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{label}: cannot read config: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError([
            f"{label}: cannot read config: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ]) from exc
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{label}: invalid TOML: {exc}"]) from exc
    return parse_config(raw, text=text, source=path.resolve(), environ=environ, label=label,
                        gpus=gpus)


def parse_config(
    raw: dict[str, Any],
    *,
    text: str = "",
    source: Path | None = None,
    environ: Mapping[str, str] | None = None,
    label: str = "config",
    gpus: Sequence[str] | None = None,
) -> Config:
    """Validate an already-parsed TOML document (see load_config)."""
    environ = os.environ if environ is None else environ
    index = index_lines(text)
    problems: list[str] = []

    def problem(loc: tuple[str | int, ...], message: str, origin: str | None = None) -> None:
        where = f"{label}:{line}" if (line := line_of(index, loc)) and not origin else label
        via = f" (from ${origin})" if origin else ""
        problems.append(f"{where}: {dotted(loc)}{via}: {message}")

    raw, origins = _with_env(raw, environ)
    config: Config | None = None
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        for error in exc.errors():
            loc = tuple(error["loc"])
            problem(loc, describe(error), origins.get(dotted(loc)))

    # The checks that need more than one field run on the raw tables, so that every problem
    # is reported in one go, whatever else is wrong.
    base = source.parent if source else Path.cwd()
    formats = check_models(raw, base, gpus, problem)
    check_auth(raw.get("auth"), environ, base, problem)
    if config is not None:
        server = config.server
        check_ports(server.modelmesh_port, server.http_port, server.grpc_port,
                    origins.get("server.modelmesh_port"), problem)
    if problems or config is None:
        problems.sort(key=problem_line)
        raise ConfigError(problems)
    return _resolved(config, base, formats, source)


def _with_env(raw: dict[str, Any], environ: Mapping[str, str]) -> tuple[dict[str, Any],
                                                                        dict[str, str]]:
    """`raw` with the `SNOOZE_*` overrides applied to copies of its `[server]` tables, and
    where each overridden key came from (`server.http_port` -> `SNOOZE_HTTP_PORT`)."""
    server_raw = raw.get("server", {})
    if not isinstance(server_raw, dict):
        return raw, {}
    server_raw = dict(server_raw)
    if isinstance(server_raw.get("memory"), dict):
        server_raw["memory"] = dict(server_raw["memory"])
    origins = apply_env(server_raw, environ)
    return {**raw, "server": server_raw}, origins


def _resolved(config: Config, base: Path, formats: list[str | None],
              source: Path | None) -> Config:
    """The valid config as the engine takes it: paths absolute, models filled in."""
    models = [resolve_model(model, config.server, base, formats[i])
              for i, model in enumerate(config.models)]
    auth = resolve_paths(config.auth, base) if config.auth is not None else None
    server = config.server
    if server.cache_dir is not None and not server.cache_dir.is_absolute():
        server = server.model_copy(update={"cache_dir": base / server.cache_dir})
    return config.model_copy(update={"models": models, "source": source, "auth": auth,
                                     "server": server})


def resolve_model(
    model: ModelConfig, server: ServerConfig, base: Path, found_format: str | None = None
) -> ModelConfig:
    """A model entry as the engine takes it: paths made absolute against `base`, the format
    filled in (`found_format`, from the path's layout), and what the entry leaves out inherited
    from `[server]`."""
    fields = model.model_fields_set
    return model.model_copy(update={
        "path": model.path if model.path.is_absolute() else base / model.path,
        "format": model.format or found_format,
        "tokenizer": model.tokenizer if model.tokenizer is None
        or model.tokenizer.is_absolute() else base / model.tokenizer,
        "labels": model.labels if model.labels is None
        or model.labels.is_absolute() else base / model.labels,
        "idle_timeout": model.idle_timeout if "idle_timeout" in fields else server.idle_timeout,
        "keep_alive": model.keep_alive or server.keep_alive,
        "load_timeout": model.load_timeout if model.load_timeout is not None
        else server.load_timeout,
        "replicas": ReplicasConfig(**{
            **server.replicas.model_dump(),
            **model.replicas.model_dump(include=model.replicas.model_fields_set),
        }),
    })


def valid_model_name(name: str) -> bool:
    return bool(MODEL_NAME.fullmatch(name))
