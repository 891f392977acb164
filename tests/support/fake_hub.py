"""A small Hugging Face Hub on 127.0.0.1, for `snooze pull` tests that never touch the internet.

It answers the routes huggingface_hub 2.x calls for `model_info` and `snapshot_download`:

    GET  /api/models/{org}/{name}[/revision/{revision}]   repository info: sha, siblings, gated
    GET  /api/models/{org}/{name}/tree/{revision}[/path]  file listing (one page)
    HEAD /{org}/{name}/resolve/{revision}/{path}          X-Repo-Commit, ETag, Content-Length
    GET  /{org}/{name}/resolve/{revision}/{path}          the bytes

and `/api/agent-harnesses` (huggingface_hub's user-agent registry) with an empty registry.
Errors carry the headers huggingface_hub turns into its exceptions (`X-Error-Code:
RepoNotFound | RevisionNotFound | GatedRepo`, see its `utils/_http.py`). No Xet headers are
ever sent, so clients always download over plain HTTP. Every request is logged, so tests can
tell what was fetched.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    gated: bool = False
    tags: tuple[str, ...] = ()
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1()
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + git_blob_id(self.files[path]).encode())
        self.sha = digest.hexdigest()

    def resolves(self, revision: str) -> bool:
        return revision in ("main", self.sha, *self.tags)


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    authorization: str | None


class FakeHub:
    """A threaded HTTP server holding repositories; use as a context manager."""

    def __init__(self, token: str = "hf_fake_token_for_gated_repos") -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.token = token
        self._requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, repo_id: str, files: dict[str, bytes], gated: bool = False,
            tags: tuple[str, ...] = ()) -> FakeRepo:
        repo = FakeRepo(repo_id, dict(files), gated, tags)
        self.repos[repo_id] = repo
        return repo

    def __enter__(self) -> FakeHub:
        # The socket is already listening: connections queue until serve_forever accepts them.
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    # --- the request log ------------------------------------------------------------------

    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def mark(self) -> int:
        with self._lock:
            return len(self._requests)

    def downloads(self, since: int = 0, method: str = "GET") -> list[str]:
        """The paths of `/resolve/` requests (file fetches) made since `since`."""
        return [r.path for r in self.requests()[since:]
                if r.method == method and "/resolve/" in r.path]

    def _log(self, request: Request) -> None:
        with self._lock:
            self._requests.append(request)


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(_HubHandler):
        pass

    Handler.hub = hub
    return Handler


class _HubHandler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"  # keep-alive, as the real Hub; every answer has a length

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log is FakeHub.requests()

    def do_GET(self) -> None:
        self._route(body=True)

    def do_HEAD(self) -> None:
        self._route(body=False)

    # --- routing --------------------------------------------------------------------------

    def _route(self, body: bool) -> None:
        path = urlsplit(self.path).path
        self.hub._log(Request(self.command, path, self.headers.get("Authorization")))
        parts = path.strip("/").split("/")
        if parts == ["api", "agent-harnesses"]:
            self._send(200, {"standardEnvVars": [], "harnesses": {}}, body)
        elif len(parts) == 4 and parts[:2] == ["api", "models"]:
            self._revision_info(f"{parts[2]}/{parts[3]}", "main", body)
        elif len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "revision":
            self._revision_info(f"{parts[2]}/{parts[3]}", unquote(parts[5]), body)
        elif len(parts) >= 6 and parts[:2] == ["api", "models"] and parts[4] == "tree":
            self._tree(f"{parts[2]}/{parts[3]}", unquote(parts[5]),
                       unquote("/".join(parts[6:])), body)
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._resolve(f"{parts[0]}/{parts[1]}", unquote(parts[3]),
                          unquote("/".join(parts[4:])), body)
        else:
            self._send(404, {"error": "Not Found"}, body)

    def _repo(self, repo_id: str, revision: str, body: bool) -> FakeRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._send(404, {"error": "Repository not found"}, body,
                       {"X-Error-Code": "RepoNotFound",
                        "X-Error-Message": "Repository not found"})
            return None
        if not repo.resolves(revision):
            self._send(404, {"error": f"Invalid rev id: {revision}"}, body,
                       {"X-Error-Code": "RevisionNotFound",
                        "X-Error-Message": f"Invalid rev id: {revision}"})
            return None
        return repo

    def _revision_info(self, repo_id: str, revision: str, body: bool) -> None:
        repo = self._repo(repo_id, revision, body)
        if repo is None:
            return
        self._send(200, {
            "_id": repo.sha[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": repo.sha,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "tags": [],
            "siblings": [{"rfilename": name} for name in sorted(repo.files)],
        }, body)

    def _tree(self, repo_id: str, revision: str, folder: str, body: bool) -> None:
        repo = self._repo(repo_id, revision, body)
        if repo is None:
            return
        prefix = f"{folder}/" if folder else ""
        listing = [
            {"type": "file", "path": name, "size": len(data), "oid": git_blob_id(data)}
            for name, data in sorted(repo.files.items()) if name.startswith(prefix)
        ]
        self._send(200, listing, body)

    def _resolve(self, repo_id: str, revision: str, filename: str, body: bool) -> None:
        repo = self._repo(repo_id, revision, body)
        if repo is None:
            return
        if repo.gated and self.headers.get("Authorization") != f"Bearer {self.hub.token}":
            message = (f"Access to model {repo_id} is restricted. You must have access to it "
                       "and be authenticated to access it. Please log in.")
            self._send(401, {"error": message}, body,
                       {"X-Error-Code": "GatedRepo", "X-Error-Message": message})
            return
        data = repo.files.get(filename)
        if data is None:
            self._send(404, {"error": "Entry not found"}, body,
                       {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"})
            return
        self._send_bytes(200, data, body, {
            "Content-Type": "application/octet-stream",
            "ETag": f'"{git_blob_id(data)}"',
            "X-Repo-Commit": repo.sha,
        })

    # --- answers --------------------------------------------------------------------------

    def _send(self, status: int, payload: Any, body: bool,
              headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self._send_bytes(status, data, body,
                         {"Content-Type": "application/json", **(headers or {})})

    def _send_bytes(self, status: int, data: bytes, body: bool, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

