"""A SnoozeML client with tritonclient.grpc: server readiness, model metadata and inference on
the demo models over gRPC (tensors travel as raw_input_contents / raw_output_contents).

Environment: SNOOZE_GRPC (default 127.0.0.1:8081) and, when the daemon has an [auth] table,
SNOOZE_API_KEY (sent as the x-api-key metadata).

    python tritonclient_grpc.py
"""

import os
import sys

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

ADDRESS = os.environ.get("SNOOZE_GRPC", "127.0.0.1:8081")
API_KEY = os.environ.get("SNOOZE_API_KEY")

# Two iris flowers: sepal length, sepal width, petal length, petal width (cm).
FLOWERS = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]], dtype=np.float32)
# One row of 32 token features for the embedder.
TOKENS = np.array([[i / 32 for i in range(32)]], dtype=np.float32)


def headers() -> dict[str, str]:
    # gRPC metadata; a fresh dict for every call, as with tritonclient.http.
    return {"x-api-key": API_KEY} if API_KEY else {}


def print_metadata(client: grpcclient.InferenceServerClient, model: str) -> None:
    metadata = client.get_model_metadata(model, headers=headers())  # a protobuf message
    for kind, tensors in (("input", metadata.inputs), ("output", metadata.outputs)):
        for tensor in tensors:
            print(f"{model} {kind}: {tensor.name} {tensor.datatype} {list(tensor.shape)}")


def infer(client: grpcclient.InferenceServerClient, model: str, input_name: str,
          output_name: str, data: np.ndarray) -> np.ndarray:
    tensor = grpcclient.InferInput(input_name, list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor], headers=headers())
    return result.as_numpy(output_name)


def row(values: np.ndarray) -> str:
    return " ".join(f"{value:.4f}" for value in values)


def main() -> None:
    with grpcclient.InferenceServerClient(ADDRESS) as client:
        # ServerReady is public: it answers without a key even when auth is on.
        print(f"server ready: {client.is_server_ready(headers=headers())}")

        print_metadata(client, "classifier")
        for probabilities in infer(client, "classifier", "features", "probabilities", FLOWERS):
            print(f"classifier probabilities: {row(probabilities)}")

        print_metadata(client, "embedder")
        embedding = infer(client, "embedder", "tokens", "embedding", TOKENS)
        print(f"embedder embedding[0:4]: {row(embedding[0, :4])}")


if __name__ == "__main__":
    try:
        main()
    except InferenceServerException as error:  # "[StatusCode.UNAUTHENTICATED] missing …"
        sys.exit(f"error: {error}")
