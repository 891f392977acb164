#!/usr/bin/env bash
# An image classifier over HTTP with curl (docs/images.md): one JPEG (or PNG, WebP, BMP, GIF)
# sent as it is, twice: raw bytes with the binary tensor data extension, then base64 in plain
# JSON. Each answer asks for the classification extension's three best classes
# ("score:index:label") and is printed as the daemon sends it, one JSON line each.
#
#   binary body: {"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
#                             "parameters": {"binary_data_size": 4 + N}}], …}
#                + the image's length as 4 little-endian bytes + its N bytes
#                header Inference-Header-Content-Length: <bytes of the JSON part>
#   JSON body:   {"inputs": [{… "parameters": {"content_type": "base64"}, "data": ["<base64>"]}]}
#
# Environment: SNOOZE_URL (default http://127.0.0.1:8080), SNOOZE_MODEL (default "classifier"),
# SNOOZE_OUTPUT (the scores output, default "logits") and, when the daemon has an [auth] table,
# SNOOZE_API_KEY (sent as the X-API-Key header). perl writes the 4-byte length.
#
#   ./image.sh photo.jpg
set -euo pipefail

image=${1:?usage: image.sh IMAGE}
url=${SNOOZE_URL:-http://127.0.0.1:8080}
model=${SNOOZE_MODEL:-classifier}
output=${SNOOZE_OUTPUT:-logits}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

post() {  # post EXTRA_CURL_ARGS…: POST $work/body to the model; print the JSON answer
  if ! curl -sS --fail-with-body -X POST ${SNOOZE_API_KEY:+-H "X-API-Key: $SNOOZE_API_KEY"} \
      "$@" --data-binary @"$work/body" -o "$work/answer" "$url/v2/models/$model/infer"; then
    cat "$work/answer" >&2  # the daemon's {"error": …}
    echo >&2
    exit 1
  fi
  cat "$work/answer"
  echo
}

outputs='"outputs": [{"name": "'"$output"'", "parameters": {"classification": 3}}]'

# 1. Raw bytes: one BYTES element is its length (uint32, little-endian), then its bytes.
size=$(wc -c < "$image" | tr -d ' ')
header='{"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": '$((size + 4))'}}], '"$outputs"'}'
{ printf '%s' "$header"; perl -e 'print pack("V", shift)' "$size"; cat "$image"; } > "$work/body"
post -H "Content-Type: application/octet-stream" -H "Inference-Header-Content-Length: ${#header}"

# 2. base64 in JSON, as MLServer's clients send it.
{ printf '{"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES", '
  printf '"parameters": {"content_type": "base64"}, "data": ["'
  base64 < "$image" | tr -d '\n'
  printf '"]}], %s}' "$outputs"; } > "$work/body"
post -H "Content-Type: application/json"
