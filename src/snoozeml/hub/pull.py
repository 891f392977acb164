"""`snooze pull`: download what serving needs from a Hugging Face repository, scan it, and add
its entries to models.toml.

huggingface_hub does all the talking, so its environment works as Hugging Face users expect:
`HF_ENDPOINT` (a mirror or a private Hub), `HF_TOKEN` (or the token `hf auth login` saved),
`HF_HUB_OFFLINE` (no network: use what an earlier pull left on disk), `HF_HOME`/`HF_HUB_CACHE`,
`HF_HUB_DISABLE_PROGRESS_BARS`, `HF_HUB_ETAG_TIMEOUT`, `HF_HUB_DOWNLOAD_TIMEOUT`. It reads most
of them once, when it is imported, so this module imports it only inside its functions (the
command's process has its environment by then) and never passes an endpoint or a token that
would override them.

A pull is idempotent: files already downloaded at the same commit are not fetched again (the
folder keeps huggingface_hub's download metadata under `.cache/huggingface/`), and entries
already in models.toml are left alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from snoozeml import __version__
from snoozeml.hub.config_writer import MergeResult, check_mergeable, merge_into
from snoozeml.hub.errors import (
    AccessDenied,
    DownloadFailed,
    HubUnreachable,
    InvalidReference,
    NothingServable,
    RepoNotFound,
    RevisionNotFound,
)
from snoozeml.hub.scan import ScannedModel, external_data_files, scan
from snoozeml.hub.select import (
    Preference,
    has_weights,
    literal_pattern,
    select_files,
    unservable_hint,
)

DEFAULT_REVISION = "main"


@dataclass(frozen=True)
class PullResult:
    repo_id: str
    revision: str
    commit: str | None  # None when the file list came from the local copy (offline)
    folder: Path
    files: list[str]  # the repository paths downloaded (or already there)
    models: list[ScannedModel]
    merge: MergeResult


@dataclass(frozen=True)
class _Listing:
    files: list[str]
    commit: str | None


def parse_reference(text: str, revision: str | None = None) -> tuple[str, str | None]:
    """`ORG/NAME[@REVISION]` plus an optional `--revision`: (repo_id, revision or None)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils._validators import validate_repo_id

    repo_id, at, ref = text.partition("@")
    if at and not ref:
        raise InvalidReference(f"{text!r}: nothing after '@' (expected ORG/NAME@REVISION)")
    if revision is not None and not revision.strip():
        raise InvalidReference("--revision is empty (give a branch, tag or commit)")
    if at and revision is not None and revision != ref:
        raise InvalidReference(f"two revisions given: @{ref} and --revision {revision}")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise InvalidReference(f"{repo_id!r} is not a repository id (expected ORG/NAME): "
                               f"{_first_line(exc)}") from exc
    return repo_id, (ref if at else revision)


def folder_for(repo_id: str, models_dir: Path) -> Path:
    """Where a repository is downloaded: `models_dir/ORG--NAME`."""
    return models_dir / repo_id.replace("/", "--")


def pull(
    repo_id: str,
    revision: str | None = None,
    models_dir: Path = Path("models"),
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    prefer: Preference | None = None,
    config: Path = Path("models.toml"),
    name: str | None = None,
) -> PullResult:
    """Download `repo_id` at `revision` into `models_dir/ORG--NAME`, then merge its models into
    `config`. Raises a HubError subclass (or ConfigError for models.toml, checked before
    anything is downloaded) on failure."""
    folder = folder_for(repo_id, models_dir).absolute()
    shown_revision = revision or DEFAULT_REVISION
    check_mergeable(config)
    with _translated_errors(repo_id, shown_revision, folder):
        listing = _list_files(repo_id, revision, folder)
        files = select_files(listing.files, prefer, include, exclude)
        if not has_weights(files):
            raise NothingServable(_nothing_servable(repo_id, shown_revision, listing.files, files))
        _download(repo_id, revision, folder, files)
        # External data that the exporters' naming conventions did not predict: read the models.
        extra = _missing_external_data(folder, files, listing.files)
        if extra:
            _download(repo_id, revision, folder, extra)
            files = sorted({*files, *extra})

    found = scan(folder, base_name=name or repo_id.rsplit("/", 1)[-1])
    if not found.models:
        reasons = "".join(f"; {s.path.name}: {s.reason}" for s in found.skipped)
        raise NothingServable(f"{repo_id} (revision {shown_revision}) downloaded to {folder}, "
                              f"but no model there can be served{reasons}")
    commit = f", commit {listing.commit[:12]}" if listing.commit else ""
    merge = merge_into(config, found.models,
                       header=f"pulled from {repo_id} (revision {shown_revision}{commit})")
    return PullResult(repo_id, shown_revision, listing.commit, folder, files, found.models, merge)


def _list_files(repo_id: str, revision: str | None, folder: Path) -> _Listing:
    """The repository's files at `revision`: from the Hub, or, when the Hub cannot be reached
    (offline mode, no network, a server error), from the listing an earlier pull cached."""
    import httpx2
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:
        api = HfApi(library_name="snoozeml", library_version=__version__)
        info = api.model_info(repo_id, revision=revision, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    except (OfflineModeIsEnabled, httpx2.ConnectError, httpx2.TimeoutException,
            httpx2.NetworkError):
        cached = _cached_listing(repo_id, revision, folder)
        if cached is None:
            raise
        return cached
    except HfHubHTTPError as exc:
        if exc.response.status_code < 500:  # not found, gated, bad token: the Hub has spoken
            raise
        cached = _cached_listing(repo_id, revision, folder)
        if cached is None:
            raise
        return cached
    return _Listing(sorted(s.rfilename for s in info.siblings or []), info.sha)


def _cached_listing(repo_id: str, revision: str | None, folder: Path) -> _Listing | None:
    from huggingface_hub import get_cached_repo_tree
    from huggingface_hub.errors import CachedRepoTreeNotFoundError

    if not folder.is_dir():
        return None
    try:
        tree = get_cached_repo_tree(repo_id, revision=revision, local_dir=folder)
    except CachedRepoTreeNotFoundError:
        return None
    return _Listing(sorted(f.path for f in tree), None)


def _download(repo_id: str, revision: str | None, folder: Path, files: Sequence[str]) -> None:
    """Fetch exactly `files` into `folder`, with huggingface_hub's progress bars."""
    from huggingface_hub import snapshot_download

    snapshot_download(repo_id, revision=revision, local_dir=folder,
                      allow_patterns=[literal_pattern(f) for f in files],
                      library_name="snoozeml", library_version=__version__)


def _missing_external_data(folder: Path, files: Sequence[str], listing: Sequence[str]) -> list[str]:
    in_repo = set(listing)
    root = folder.resolve()
    wanted: set[str] = set()
    for file in files:
        if file.endswith(".onnx") and (folder / file).is_file():
            for data in external_data_files(folder / file):
                if data.is_relative_to(root):
                    relative = data.relative_to(root).as_posix()
                    if relative in in_repo and relative not in files:
                        wanted.add(relative)
    return sorted(wanted)


# --- messages --------------------------------------------------------------------------


def _nothing_servable(repo_id: str, revision: str, listing: Sequence[str],
                      selected: Sequence[str]) -> str:
    where = f"{repo_id} (revision {revision})"
    if has_weights(listing):
        weights = [f for f in listing if f.endswith((".onnx", ".safetensors"))]
        return (f"{where}: no weights left to download after --format/--exclude; "
                f"it has {_some(weights)}")
    message = f"{where} has nothing SnoozeML can serve: no ONNX or safetensors weights"
    hint = unservable_hint(listing)
    if hint:
        return f"{message}; {hint}"
    return f"{message} (files: {_some(listing) if listing else 'none'})"


def _some(items: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _transport_reason(exc: BaseException) -> str:
    """The network failure at the root of `exc` (connection refused, a timeout...)."""
    import httpx2

    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, httpx2.TransportError):
            return _first_line(current)
        current = current.__cause__ or current.__context__
    return _first_line(exc)


@contextmanager
def _translated_errors(repo_id: str, revision: str, folder: Path) -> Iterator[None]:
    """huggingface_hub's exceptions as the HubError tree, each with a message saying what to do."""
    import httpx2
    from huggingface_hub import constants, get_token
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    hub = constants.ENDPOINT
    try:
        yield
    except GatedRepoError as exc:
        if get_token() is None:
            raise AccessDenied(
                f"{repo_id} is a gated repository and no token is set: accept its conditions "
                f"at {hub}/{repo_id}, then set HF_TOKEN (or run `hf auth login`)") from exc
        raise AccessDenied(f"{repo_id} is a gated repository and the token in use has no access "
                           f"to it: request access at {hub}/{repo_id}") from exc
    except RepositoryNotFoundError as exc:
        raise RepoNotFound(f"repository {repo_id} not found on {hub} (if it is private, set "
                           "HF_TOKEN to a token that can read it)") from exc
    except RevisionNotFoundError as exc:
        raise RevisionNotFound(f"revision {revision!r} not found in {repo_id} on {hub} "
                               "(a branch, tag or commit hash)") from exc
    except IncompleteSnapshotError as exc:
        raise HubUnreachable(f"cannot reach {hub} and the earlier download of {repo_id} in "
                             f"{folder} is incomplete; pull again with network access") from exc
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, httpx2.TransportError) as exc:
        if constants.is_offline_mode():
            raise HubUnreachable(f"HF_HUB_OFFLINE is set and {repo_id} (revision {revision}) "
                                 f"has not been pulled into {folder} yet; pull it once with "
                                 "network access") from exc
        raise HubUnreachable(f"cannot reach the Hub at {hub} ({_transport_reason(exc)}); check "
                             "the network, the proxy settings or HF_ENDPOINT") from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code
        detail = exc.server_message or _first_line(exc)
        if status in (401, 403):
            raise AccessDenied(f"{hub} refused access to {repo_id} ({status}: {detail}); check "
                               "HF_TOKEN or the token saved by `hf auth login`") from exc
        raise DownloadFailed(f"{hub} answered {status} for {repo_id}: {detail}") from exc
    except OSError as exc:
        raise DownloadFailed(f"cannot download {repo_id} into {folder}: "
                             f"{exc.strerror or _first_line(exc)}") from exc
