"""A SnoozeML client for a scikit-learn pipeline exported by skl2onnx with its defaults
(docs/tabular.md): one input per column, [rows, 1] each (`age` FP32, `visits` INT64, `city`
BYTES), answering each row's class (`output_label`) and its probabilities per class
(`output_probability`, FP32 [rows, classes]); then the classification extension's two best
classes of each row, named by the model's own labels.

Environment: SNOOZE_URL (default http://127.0.0.1:8080), SNOOZE_MODEL (default "tiers") and,
when the daemon has an [auth] table, SNOOZE_API_KEY (sent as the X-API-Key header).

    python tabular.py
"""

import os
import sys
from urllib.parse import urlsplit

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

URL = urlsplit(os.environ.get("SNOOZE_URL", "http://127.0.0.1:8080"))
MODEL = os.environ.get("SNOOZE_MODEL", "tiers")
API_KEY = os.environ.get("SNOOZE_API_KEY")

# Two customers, one value per column.
COLUMNS = {
    "age": np.array([[34.0], [61.0]], dtype=np.float32),
    "visits": np.array([[2], [15]], dtype=np.int64),
    "city": np.array([["oslo"], ["lima"]], dtype=object),
}
DATATYPES = {"age": "FP32", "visits": "INT64", "city": "BYTES"}


def headers() -> dict[str, str]:
    return {"x-api-key": API_KEY} if API_KEY else {}


def columns() -> list[httpclient.InferInput]:
    made = []
    for name, values in COLUMNS.items():
        tensor = httpclient.InferInput(name, list(values.shape), DATATYPES[name])
        tensor.set_data_from_numpy(values)
        made.append(tensor)
    return made


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def main() -> int:
    client = httpclient.InferenceServerClient(URL.netloc, ssl=URL.scheme == "https")
    try:
        answer = client.infer(MODEL, columns(), headers=headers(), outputs=[
            httpclient.InferRequestedOutput("output_label"),
            httpclient.InferRequestedOutput("output_probability")])
        labels = answer.as_numpy("output_label").ravel()
        probabilities = answer.as_numpy("output_probability")
        for row, (label, scores) in enumerate(zip(labels, probabilities, strict=True)):
            print(f"row {row}: {text(label)} "
                  + " ".join(f"{score:.4f}" for score in scores))
        # The classification extension: each row's 2 best classes as "score:index:label".
        best = client.infer(MODEL, columns(), headers=headers(), outputs=[
            httpclient.InferRequestedOutput("output_probability", class_count=2)])
        for row, classes in enumerate(best.as_numpy("output_probability")):
            print(f"row {row} best: " + " ".join(text(entry) for entry in classes))
    except InferenceServerException as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
