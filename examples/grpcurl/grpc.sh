#!/usr/bin/env bash
# SnoozeML over gRPC with grpcurl: ServerReady, ModelMetadata and ModelInfer on the demo models,
# through server reflection (no .proto file needed). Each step prints the RPC as a "# RPC" line,
# then grpcurl's JSON answer.
#
# Inputs go as typed values in contents.fp32_contents. Outputs come back as raw little-endian
# bytes in raw_output_contents, which grpcurl shows in base64: the script decodes them too.
#
# Environment: SNOOZE_GRPC (default 127.0.0.1:8081), GRPCURL (default: grpcurl on the PATH)
# and, when the daemon has an [auth] table, SNOOZE_API_KEY (sent as the x-api-key metadata).
set -euo pipefail
export LC_ALL=C  # od and awk print numbers with a "." whatever the locale

address=${SNOOZE_GRPC:-127.0.0.1:8081}
grpcurl=${GRPCURL:-grpcurl}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# rpc METHOD < JSON: one call of inference.GRPCInferenceService, its answer also kept in
# $work/answer.json. -H sends the key with the call and with the reflection requests that look
# the method up (reflection needs a key when auth is on, even for a public RPC).
rpc() {
  echo "# $1"
  "$grpcurl" -plaintext ${SNOOZE_API_KEY:+-H "x-api-key: $SNOOZE_API_KEY"} -d @ \
    "$address" "inference.GRPCInferenceService/$1" | tee "$work/answer.json"
}

# raw_output: the bytes of the first raw_output_contents entry of the last answer.
raw_output() {
  sed -n '/"raw_output_contents"/{n;p;}' "$work/answer.json" | tr -d ' ",' | base64 -d
}

# print_floats LABEL WIDTH < bytes: the float32 values, WIDTH a line, four decimals each
# (od reads the host's byte order: little-endian on x86 and ARM).
print_floats() {
  od -A n -v -t f4 | awk -v label="$1" -v width="$2" '{
    for (i = 1; i <= NF; i++) {
      if (n % width == 0) printf "%s:", label
      printf " %.4f", $i
      if (++n % width == 0) printf "\n"
    }
  }'
}

# ServerReady is public: the call itself needs no key.
rpc ServerReady <<< '{}'

# The classifier: features FP32 [-1, 4] -> probabilities FP32 [-1, 3]. Two iris flowers
# (sepal length, sepal width, petal length, petal width in cm), one row each.
rpc ModelMetadata <<< '{"name": "classifier"}'
rpc ModelInfer <<'JSON'
{"model_name": "classifier",
 "inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 4],
             "contents": {"fp32_contents": [5.1, 3.5, 1.4, 0.2, 6.7, 3.0, 5.2, 2.3]}}]}
JSON
raw_output | print_floats "classifier probabilities" 3

# The embedder: tokens FP32 [-1, 32] -> embedding FP32 [-1, 64]; one row of 0/32 … 31/32.
tokens=$(awk 'BEGIN { for (i = 0; i < 32; i++) printf "%s%g", (i ? ", " : ""), i / 32 }')
rpc ModelMetadata <<< '{"name": "embedder"}'
rpc ModelInfer <<JSON
{"model_name": "embedder",
 "inputs": [{"name": "tokens", "datatype": "FP32", "shape": [1, 32],
             "contents": {"fp32_contents": [$tokens]}}]}
JSON
raw_output | head -c 16 | print_floats "embedder embedding[0:4]" 4
