"""The image's HEALTHCHECK: exit 0 when the daemon answers GET /health/live, 1 otherwise.

It asks 127.0.0.1 on $SNOOZE_HTTP_PORT (default 8080), so it follows the port set through the
environment, not one set with --http-port. Standard library only: the image has no curl.
"""

from __future__ import annotations

import http.client
import os
import sys
import urllib.request


def main() -> int:
    port = os.environ.get("SNOOZE_HTTP_PORT", "8080").strip()
    url = f"http://127.0.0.1:{port}/health/live"
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            return 0 if response.status == 200 else 1
    # Refused, timed out, an error status, a broken answer, a bad port: unhealthy, quietly.
    except (OSError, ValueError, http.client.HTTPException):
        return 1


if __name__ == "__main__":
    sys.exit(main())
