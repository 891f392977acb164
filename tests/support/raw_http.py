"""HTTP/1.1 read straight off a socket: one whole response, and whether the server closed the
connection. The daemon tests of connection limits and of the inference exchange use them."""

from __future__ import annotations

import socket


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One whole response: status, headers (lower-case names) and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole response: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip()
               for name, value in (line.split(":", 1) for line in lines)}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "closed inside a body"
        body += chunk
    return int(status_line.split()[1]), headers, body


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server ends the connection (end of file) before the socket's timeout runs
    out."""
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True
