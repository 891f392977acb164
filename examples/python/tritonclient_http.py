"""A SnoozeML client with tritonclient.http: server readiness, model metadata and inference on
the demo models. tritonclient sends the input tensors as raw bytes (the binary tensor extension).

Environment: SNOOZE_URL (default http://127.0.0.1:8080) and, when the daemon has an [auth]
table, SNOOZE_API_KEY (sent as the X-API-Key header).

    python tritonclient_http.py
"""

import os
import sys
from urllib.parse import urlsplit

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

URL = urlsplit(os.environ.get("SNOOZE_URL", "http://127.0.0.1:8080"))
API_KEY = os.environ.get("SNOOZE_API_KEY")

# Two iris flowers: sepal length, sepal width, petal length, petal width (cm).
FLOWERS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]], dtype=np.float32)
# One row of 32 token features for the embedder.
TOKENS = np.array([[i / 32 for i in range(32)]], dtype=np.float32)


def headers() -> dict[str, str]:
    # A fresh dict for every call: tritonclient.http adds its own headers to the one it gets.
    return {"x-api-key": API_KEY} if API_KEY else {}


def print_metadata(client: httpclient.InferenceServerClient, model: str) -> None:
    metadata = client.get_model_metadata(model, headers=headers())
    for kind in ("input", "output"):
        for tensor in metadata[f"{kind}s"]:
            print(f"{model} {kind}: {tensor['name']} {tensor['datatype']} {tensor['shape']}")


def infer(client: httpclient.InferenceServerClient, model: str, input_name: str,
          output_name: str, data: np.ndarray) -> np.ndarray:
    tensor = httpclient.InferInput(input_name, list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor], headers=headers())
    return result.as_numpy(output_name)


def row(values: np.ndarray) -> str:
    return " ".join(f"{value:.4f}" for value in values)


def main() -> None:
    # The client takes host:port; https would need ssl=True.
    client = httpclient.InferenceServerClient(URL.netloc, ssl=URL.scheme == "https")
    # Readiness is public: it answers without a key even when auth is on.
    print(f"server ready: {client.is_server_ready(headers=headers())}")

    print_metadata(client, "classifier")
    for probabilities in infer(client, "classifier", "features", "probabilities", FLOWERS):
        print(f"classifier probabilities: {row(probabilities)}")

    print_metadata(client, "embedder")
    embedding = infer(client, "embedder", "tokens", "embedding", TOKENS)
    print(f"embedder embedding[0:4]: {row(embedding[0, :4])}")
    client.close()


if __name__ == "__main__":
    try:
        main()
    except (InferenceServerException, OSError) as error:  # "[401] missing credentials"
        sys.exit(f"error: {error}")
