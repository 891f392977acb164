"""Models that take encoded images: decoding (decode.py), preprocessing (preprocess.py) and the
wrapper that adds an `image` input to a loaded model (instance.py)."""
