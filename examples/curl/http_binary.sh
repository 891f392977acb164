#!/usr/bin/env bash
# SnoozeML over HTTP with curl and the binary tensor data extension: the input tensor travels
# as raw little-endian FP32 bytes after the JSON header, and the output comes back the same way.
#
#   request body:  {"inputs": [{… "parameters": {"binary_data_size": N}}], …}  + N raw bytes
#                  header Inference-Header-Content-Length: <bytes of the JSON part>
#   response body: {"outputs": [{… "parameters": {"binary_data_size": M}}]}     + M raw bytes
#                  header Inference-Header-Content-Length: <bytes of the JSON part>
#
# Environment: SNOOZE_URL (default http://127.0.0.1:8080) and, when the daemon has an [auth]
# table, SNOOZE_API_KEY (sent as the X-API-Key header). perl writes the float32 bytes; od
# reads them back, in the host's byte order (little-endian on x86 and ARM).
set -euo pipefail
export LC_ALL=C  # od and awk print numbers with a "." whatever the locale

url=${SNOOZE_URL:-http://127.0.0.1:8080}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# infer MODEL INPUT ROWS VALUES…: sends VALUES as one FP32 input of shape [ROWS, n/ROWS] and
# asks for every output in binary; prints the answer's JSON part, and leaves the output's raw
# bytes in $work/output.bin.
infer() {
  local model=$1 input=$2 rows=$3
  shift 3
  # pack "f<*": every argument as a little-endian float32, back to back.
  perl -e 'print pack("f<*", @ARGV)' "$@" > "$work/input.bin"
  local size=$((4 * $#)) columns=$(($# / rows)) header
  header=$(cat <<JSON
{"inputs": [{"name": "$input", "shape": [$rows, $columns], "datatype": "FP32",
             "parameters": {"binary_data_size": $size}}],
 "parameters": {"binary_data_output": true}}
JSON
)
  { printf '%s' "$header"; cat "$work/input.bin"; } > "$work/body.bin"

  echo "# POST /v2/models/$model/infer ($size bytes of FP32 after the JSON header)"
  # ${#header} is the JSON's length in characters, which is its length in bytes here (ASCII).
  if ! curl -sS --fail-with-body -X POST ${SNOOZE_API_KEY:+-H "X-API-Key: $SNOOZE_API_KEY"} \
      -H "Inference-Header-Content-Length: ${#header}" --data-binary @"$work/body.bin" \
      -D "$work/headers.txt" -o "$work/response.bin" "$url/v2/models/$model/infer"; then
    cat "$work/response.bin" >&2  # the daemon's {"error": …}
    echo >&2
    exit 1
  fi
  # The answer's own Inference-Header-Content-Length splits the JSON from the raw outputs.
  local length
  length=$(grep -i '^inference-header-content-length:' "$work/headers.txt" | tr -dc '0-9')
  head -c "$length" "$work/response.bin"
  echo
  tail -c +"$((length + 1))" "$work/response.bin" > "$work/output.bin"
}

# print_floats LABEL WIDTH < bytes: the float32 values, WIDTH a line, four decimals each.
print_floats() {
  od -A n -v -t f4 | awk -v label="$1" -v width="$2" '{
    for (i = 1; i <= NF; i++) {
      if (n % width == 0) printf "%s:", label
      printf " %.4f", $i
      if (++n % width == 0) printf "\n"
    }
  }'
}

# The classifier: two iris flowers (sepal length, sepal width, petal length, petal width in cm);
# the probabilities come back as 2 rows of 3 float32 (setosa, versicolor, virginica).
infer classifier features 2 5.1 3.5 1.4 0.2 6.7 3.0 5.2 2.3
print_floats "classifier probabilities" 3 < "$work/output.bin"

# The embedder: one row of 32 token features (0/32 … 31/32) in, 64 float32 out; the first 4.
read -ra tokens <<< "$(awk 'BEGIN { for (i = 0; i < 32; i++) printf "%g ", i / 32 }')"
infer embedder tokens 1 "${tokens[@]}"
head -c 16 "$work/output.bin" | print_floats "embedder embedding[0:4]" 4
