"""A SnoozeML client with plain httpx: server readiness, model metadata and inference on the
demo models, with the Open Inference Protocol's JSON tensors. No SDK, just the REST API.

Environment: SNOOZE_URL (default http://127.0.0.1:8080) and, when the daemon has an [auth]
table, SNOOZE_API_KEY (sent as the X-API-Key header).

    python httpx_client.py
"""

import os
import sys
from typing import Any

import httpx

URL = os.environ.get("SNOOZE_URL", "http://127.0.0.1:8080")
API_KEY = os.environ.get("SNOOZE_API_KEY")

# Two iris flowers: sepal length, sepal width, petal length, petal width (cm).
FLOWERS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]
# One row of 32 token features for the embedder.
TOKENS = [[i / 32 for i in range(32)]]


class DaemonError(Exception):
    """A non-2xx answer, with the daemon's {"error": ...} message."""


def call(client: httpx.Client, method: str, path: str, body: Any = None) -> Any:
    response = client.request(method, path, json=body)
    if response.is_error:
        raise DaemonError(f"{method} {path}: HTTP {response.status_code}: {response.text}")
    return response.json()


def print_metadata(client: httpx.Client, model: str) -> None:
    metadata = call(client, "GET", f"/v2/models/{model}")
    for kind in ("input", "output"):
        for tensor in metadata[f"{kind}s"]:
            print(f"{model} {kind}: {tensor['name']} {tensor['datatype']} {tensor['shape']}")


def infer(client: httpx.Client, model: str, input_name: str, rows: list[list[float]]) -> list:
    """One FP32 input in, the first output's rows out (`data` comes back flat)."""
    request = {"inputs": [{"name": input_name, "datatype": "FP32",
                           "shape": [len(rows), len(rows[0])], "data": rows}]}
    (output, *_) = call(client, "POST", f"/v2/models/{model}/infer", request)["outputs"]
    width = output["shape"][1]
    return [output["data"][i:i + width] for i in range(0, len(output["data"]), width)]


def row(values: list[float]) -> str:
    return " ".join(f"{value:.4f}" for value in values)


def main() -> None:
    headers = {"X-API-Key": API_KEY} if API_KEY else {}
    with httpx.Client(base_url=URL, headers=headers, timeout=60) as client:
        # Readiness is public: it answers without a key even when auth is on.
        print(f"server ready: {call(client, 'GET', '/v2/health/ready')['ready']}")

        print_metadata(client, "classifier")
        for probabilities in infer(client, "classifier", "features", FLOWERS):
            print(f"classifier probabilities: {row(probabilities)}")

        print_metadata(client, "embedder")
        (embedding,) = infer(client, "embedder", "tokens", TOKENS)
        print(f"embedder embedding[0:4]: {row(embedding[:4])}")


if __name__ == "__main__":
    try:
        main()
    except (DaemonError, httpx.HTTPError) as error:
        sys.exit(f"error: {error}")
