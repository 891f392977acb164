#!/usr/bin/env bash
# SnoozeML over HTTP with curl: server readiness, model metadata, and inference on the demo
# models with JSON tensors (the Open Inference Protocol v2). Each step prints the request as a
# "# METHOD PATH" line, then the daemon's JSON answer as it came.
#
# Environment: SNOOZE_URL (default http://127.0.0.1:8080) and, when the daemon has an [auth]
# table, SNOOZE_API_KEY (sent as the X-API-Key header).
set -euo pipefail

url=${SNOOZE_URL:-http://127.0.0.1:8080}

# One request: the API key when there is one (the ${…:+…} form adds nothing without it);
# --fail-with-body makes an error answer (401, 404, …) exit non-zero after printing its
# {"error": …} body.
call() {
  local method=$1 path=$2
  shift 2
  echo "# $method $path"
  curl -sS --fail-with-body -X "$method" ${SNOOZE_API_KEY:+-H "X-API-Key: $SNOOZE_API_KEY"} \
    "$url$path" "$@"
  echo
}

# Readiness is public: it answers without a key even when auth is on.
call GET /v2/health/ready

# The classifier: features FP32 [-1, 4] -> probabilities FP32 [-1, 3]. Two iris flowers
# (sepal length, sepal width, petal length, petal width in cm), one row each.
call GET /v2/models/classifier
call POST /v2/models/classifier/infer -H 'Content-Type: application/json' --data-binary @- <<'JSON'
{"inputs": [{"name": "features", "shape": [2, 4], "datatype": "FP32",
             "data": [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]}]}
JSON

# The embedder: tokens FP32 [-1, 32] -> embedding FP32 [-1, 64]; one row of 0/32 … 31/32.
tokens=$(awk 'BEGIN { for (i = 0; i < 32; i++) printf "%s%g", (i ? ", " : ""), i / 32 }')
call GET /v2/models/embedder
call POST /v2/models/embedder/infer -H 'Content-Type: application/json' --data-binary @- <<JSON
{"inputs": [{"name": "tokens", "shape": [1, 32], "datatype": "FP32", "data": [$tokens]}]}
JSON
