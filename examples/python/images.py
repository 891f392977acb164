"""A SnoozeML client for an image classifier (docs/images.md) with Triton's client library:
each image file given is sent as it is (its encoded bytes, one BYTES element a row, over the
binary tensor data extension); the daemon decodes and preprocesses it as the model's entry
says. Prints each image's three best classes ("score:index:label", the classification
extension), then the index of the best score from the raw scores, which come back in binary.

Environment: SNOOZE_URL (default http://127.0.0.1:8080), SNOOZE_MODEL (default "classifier"),
SNOOZE_OUTPUT (the scores output, default "logits") and, when the daemon has an [auth] table,
SNOOZE_API_KEY (sent as the X-API-Key header).

    python images.py cat.jpg dog.png
"""

import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

URL = urlsplit(os.environ.get("SNOOZE_URL", "http://127.0.0.1:8080"))
MODEL = os.environ.get("SNOOZE_MODEL", "classifier")
OUTPUT = os.environ.get("SNOOZE_OUTPUT", "logits")
API_KEY = os.environ.get("SNOOZE_API_KEY")


def main(paths: list[str]) -> int:
    if not paths:
        print("usage: images.py IMAGE...", file=sys.stderr)
        return 2
    images = np.array([Path(path).read_bytes() for path in paths], dtype=object)
    image = httpclient.InferInput("image", [len(paths)], "BYTES")
    image.set_data_from_numpy(images, binary_data=True)
    headers = {"x-api-key": API_KEY} if API_KEY else {}
    client = httpclient.InferenceServerClient(URL.netloc, ssl=URL.scheme == "https")
    try:
        best = client.infer(MODEL, [image], headers=headers, outputs=[
            httpclient.InferRequestedOutput(OUTPUT, binary_data=False, class_count=3)])
        scores = client.infer(MODEL, [image], headers=headers, outputs=[
            httpclient.InferRequestedOutput(OUTPUT, binary_data=True)])
    except InferenceServerException as exc:
        print(f"inference failed: {exc.message()}", file=sys.stderr)
        return 1
    finally:
        client.close()
    classes = best.as_numpy(OUTPUT).reshape(len(paths), -1)
    for path, row, raw in zip(paths, classes, scores.as_numpy(OUTPUT), strict=True):
        texts = [c.decode() if isinstance(c, bytes) else str(c) for c in row]
        print(f"{Path(path).name}: {' '.join(texts)} (best index {int(np.argmax(raw))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
