#!/usr/bin/env bash
# SnoozeML's standard gRPC health service with grpcurl: grpc.health.v1.Health/Check on the
# server (service "") and on each demo model. SERVING, or NOT_SERVING for a model that failed
# to load (or for the server while it drains); a cold model is SERVING, it loads on demand.
#
# Environment: SNOOZE_GRPC (default 127.0.0.1:8081), GRPCURL (default: grpcurl on the PATH)
# and, when the daemon has an [auth] table, SNOOZE_API_KEY.
set -euo pipefail

address=${SNOOZE_GRPC:-127.0.0.1:8081}
grpcurl=${GRPCURL:-grpcurl}

for service in "" classifier embedder; do
  echo "# Check \"$service\""
  # Check is public, so that orchestrators can probe without credentials; only the reflection
  # requests that look the method up need a key: -reflect-header sends it to them alone.
  "$grpcurl" -plaintext ${SNOOZE_API_KEY:+-reflect-header "x-api-key: $SNOOZE_API_KEY"} \
    -d "{\"service\": \"$service\"}" "$address" grpc.health.v1.Health/Check
done
