"""Reading an HTTP request body: the one reader for the fast path and the Starlette routes.

The declared Content-Length is refused (413) before anything is read when it is over the
limit; a body sent in chunks is refused as soon as it passes it; a `Content-Encoding: gzip` or
`deflate` body (tritonclient's request compression) is inflated under the same limit, so a
small bomb is a 413 too.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from snoozeml.errors import InvalidInput, RequestTooLarge

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]


class ClientGone(Exception):
    """The client disconnected before we answered."""


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of header `name` (lower case), as sent."""
    for key, value in headers:
        if key == name:
            return value
    return None


def too_large(limit: int) -> RequestTooLarge:
    """The 413 for a body that grew past `limit` as it was read."""
    return RequestTooLarge(f"request body exceeds the limit of {limit} bytes")


def scope_credentials(scope: Scope) -> tuple[str | None, str | None]:
    """The request's `Authorization` and `X-API-Key` values (the first of each), as text."""
    return credentials(scope["headers"])


def credentials(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    """The `Authorization` and `X-API-Key` values of `headers` (the first of each), as text."""
    authorization = api_key = None
    for key, value in headers:
        if key == b"authorization" and authorization is None:
            authorization = value.decode("latin-1")
        elif key == b"x-api-key" and api_key is None:
            api_key = value.decode("latin-1")
    return authorization, api_key


def check_declared(headers: Iterable[tuple[bytes, bytes]], limit: int) -> bytes | None:
    """Refuse a declared Content-Length over `limit` (413) before anything is read; returns
    the request's Content-Encoding, if any."""
    declared = encoding = None
    for key, value in headers:  # one pass: this runs for every request
        if key == b"content-length":
            declared = value if declared is None else declared  # the first one counts
        elif key == b"content-encoding":
            encoding = value if encoding is None else encoding
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise InvalidInput("invalid Content-Length header") from None
        if size > limit:
            raise RequestTooLarge(f"request body of {size} bytes exceeds the limit of {limit}")
    return encoding


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole body, inflated, at most `limit` bytes before and after inflating."""
    encoding = check_declared(scope["headers"], limit)
    chunks: list[bytes] = []
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        if chunk:
            received += len(chunk)
            if received > limit:
                raise too_large(limit)
            chunks.append(chunk)
        if not message.get("more_body", False):
            body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            return body if encoding is None else inflate(encoding, body, limit)


_WBITS = {b"gzip": 31, b"deflate": 15}  # zlib's window bits for a gzip / zlib stream


def inflate(value: bytes, body: bytes, limit: int) -> bytes:
    """`body` as sent with Content-Encoding `value`, inflated, at most `limit` bytes."""
    encoding = value.strip().lower()
    if encoding in (b"", b"identity"):
        return body
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise InvalidInput(
            f"unsupported Content-Encoding {encoding.decode('latin-1')!r}; "
            "use gzip, deflate or none"
        )
    inflater = zlib.decompressobj(wbits)
    try:
        plain = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidInput(f"request body is not valid {encoding.decode()} data: {exc}") from None
    if len(plain) > limit:
        raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes once inflated")
    if not inflater.eof:
        raise InvalidInput(f"request body is truncated {encoding.decode()} data")
    return plain
