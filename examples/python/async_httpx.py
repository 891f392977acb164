"""A SnoozeML client with httpx.AsyncClient: the same calls as httpx_client.py, with several
requests in flight at once (asyncio.gather).

Each flower goes in a request of its own, all sent together: the daemon may run them as one
batch (dynamic micro-batching), and each answer still holds exactly its own row.

Environment: SNOOZE_URL (default http://127.0.0.1:8080) and, when the daemon has an [auth]
table, SNOOZE_API_KEY (sent as the X-API-Key header).

    python async_httpx.py
"""

import asyncio
import os
import sys
from typing import Any

import httpx

URL = os.environ.get("SNOOZE_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("SNOOZE_API_KEY")

# Two iris flowers: sepal length, sepal width, petal length, petal width (cm).
FLOWERS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]
# One row of 32 token features for the embedder.
TOKENS = [i / 32 for i in range(32)]


class DaemonError(Exception):
    """A non-2xx answer, with the daemon's {"error": ...} message."""


async def call(client: httpx.AsyncClient, method: str, path: str, body: Any = None) -> Any:
    response = await client.request(method, path, json=body)
    if response.is_error:
        raise DaemonError(f"{method} {path}: HTTP {response.status_code}: {response.text}")
    return response.json()


async def infer_row(client: httpx.AsyncClient, model: str, input_name: str,
                    values: list[float]) -> list[float]:
    """One row of one FP32 input in, the first output's single row out."""
    request = {"inputs": [{"name": input_name, "datatype": "FP32",
                           "shape": [1, len(values)], "data": values}]}
    answer = await call(client, "POST", f"/v2/models/{model}/infer", request)
    return answer["outputs"][0]["data"]


def print_metadata(model: str, metadata: dict[str, Any]) -> None:
    for kind in ("input", "output"):
        for tensor in metadata[f"{kind}s"]:
            print(f"{model} {kind}: {tensor['name']} {tensor['datatype']} {tensor['shape']}")


def row(values: list[float]) -> str:
    return " ".join(f"{value:.4f}" for value in values)


async def main() -> None:
    headers = {"X-API-Key": API_KEY} if API_KEY else {}
    async with httpx.AsyncClient(base_url=URL, headers=headers, timeout=60) as client:
        # Readiness is public: it answers without a key even when auth is on.
        ready = await call(client, "GET", "/v2/health/ready")
        print(f"server ready: {ready['ready']}")

        # Both models' metadata at once (the first metadata request of a cold model loads it).
        classifier, embedder = await asyncio.gather(
            call(client, "GET", "/v2/models/classifier"),
            call(client, "GET", "/v2/models/embedder"),
        )
        # Every inference at once; gather returns the answers in the order of the calls.
        *probabilities, embedding = await asyncio.gather(
            *(infer_row(client, "classifier", "features", flower) for flower in FLOWERS),
            infer_row(client, "embedder", "tokens", TOKENS),
        )

    print_metadata("classifier", classifier)
    for answer in probabilities:
        print(f"classifier probabilities: {row(answer)}")
    print_metadata("embedder", embedder)
    print(f"embedder embedding[0:4]: {row(embedding[:4])}")


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except (DaemonError, httpx.HTTPError) as error:
        sys.exit(f"error: {error}")
