# visenv — every target installs what it needs first (see scripts/setup.sh).
VENV   ?= .venv
BIN    := $(VENV)/bin
EXTRAS ?= server,dev,svg,navigation,ai2thor,primitive_skill,trainer,ray
comma  := ,
STAMP  := $(VENV)/.visenv-setup-$(subst $(comma),-,$(EXTRAS))
PYTEST_ARGS ?=
PYTHON ?= python3
# the peers' own clients (OpenEnv) live in a venv of their own: they would downgrade Pillow
# in the main one; tests_compat/ drives a server started from the main venv with them
COMPAT_VENV  ?= .venv-compat
COMPAT_STAMP := $(COMPAT_VENV)/.visenv-compat-setup
COMPAT_PYTEST_ARGS ?=
# verl 0.9 pins transformers < 5.11 (the main venv has newer): tests_verl/ in a venv of its own
VERL_VENV  ?= .venv-verl
VERL_STAMP := $(VERL_VENV)/.visenv-verl-setup
VERL_PYTEST_ARGS ?=
TORCH_SPEC ?= torch==2.13.0
# lint needs only ruff: its own small venv, no apt, torch or simulators (pinned: the formatter's
# output must not change under anyone's feet; keep it equal to the dev extra's pin)
RUFF_SPEC  ?= ruff==0.17.6
LINT_VENV  ?= .venv-lint
IMAGE_FAMILIES ?= light navigation primitive_skill

.PHONY: setup serve test compat-setup compat-test verl-setup verl-test images image-test bench lint format proto clean help

help:  ## list the targets
	@grep -E '^[a-z][a-z-]*:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

setup: $(STAMP)  ## install system packages, the venv, torch (CPU) and visenv with its extras

$(STAMP): pyproject.toml scripts/setup.sh
	VENV=$(VENV) EXTRAS=$(EXTRAS) bash scripts/setup.sh
	@touch $@

serve: setup  ## start the server (HTTP :8000, gRPC :50051) with every environment that runs here
	$(BIN)/visenv serve

test: setup  ## run the test suite (offline, 2 cores), then the compat tests
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	$(MAKE) compat-test
	$(MAKE) verl-test

compat-setup: $(COMPAT_STAMP)  ## the compat test venv (.venv-compat: openenv, trl, CPU torch)

$(COMPAT_STAMP): tests_compat/requirements.txt
	[ -x $(COMPAT_VENV)/bin/python ] || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"  # CPU build first (TRL needs torch)
	$(COMPAT_VENV)/bin/python -m pip install -q -r tests_compat/requirements.txt
	@touch $@

compat-test: setup compat-setup  ## peers' own clients (OpenEnv, TRL) against a real visenv serve
	cd tests_compat && VISENV_PYTHON=$(abspath $(BIN))/python \
		$(abspath $(COMPAT_VENV))/bin/python -m pytest -p no:cacheprovider $(COMPAT_PYTEST_ARGS)

verl-setup: $(VERL_STAMP)  ## the verl test venv (.venv-verl: verl 0.9 from PyPI, CPU torch, visenv)

$(VERL_STAMP): tests_verl/requirements.txt pyproject.toml
	[ -x $(VERL_VENV)/bin/python ] || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"  # CPU build first (verl needs torch)
	$(VERL_VENV)/bin/python -m pip install -q -r tests_verl/requirements.txt
	$(VERL_VENV)/bin/python -m pip install -q -e ".[trainer,verl]" -r tests_verl/requirements.txt
	@touch $@

verl-test: setup verl-setup  ## verl's own AgentLoopWorker plays the visenv agent loop against a real visenv serve
	cd tests_verl && VISENV_PYTHON=$(abspath $(BIN))/python \
		$(abspath $(VERL_VENV))/bin/python -m pytest $(VERL_PYTEST_ARGS)

images: setup  ## build the family images (docker, else podman; see docker/README.md)
	TORCH_SPEC="$(TORCH_SPEC)" $(BIN)/python scripts/images.py build $(IMAGE_FAMILIES)

image-test: images  ## run each image and `envs` from compose.yaml on loopback, play every env
	$(BIN)/python scripts/images.py test $(IMAGE_FAMILIES)

bench: setup  ## run the benchmarks in bench/ (numbers, not pass/fail)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

$(LINT_VENV)/bin/ruff:
	[ -x $(LINT_VENV)/bin/python ] || $(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/python -m pip install -q "$(RUFF_SPEC)"

lint: $(LINT_VENV)/bin/ruff  ## ruff check and ruff format --check (needs only ruff, not the setup)
	$(LINT_VENV)/bin/ruff check .
	$(LINT_VENV)/bin/ruff format --check .

format: $(LINT_VENV)/bin/ruff  ## apply ruff's formatter and its import sorting
	$(LINT_VENV)/bin/ruff check --select I --fix .
	$(LINT_VENV)/bin/ruff format .

proto: setup  ## regenerate visenv/v1 from proto/visenv/v1/*.proto
	bash scripts/gen_proto.sh

clean:  ## remove the venvs and caches
	rm -rf $(VENV) $(COMPAT_VENV) $(VERL_VENV) $(LINT_VENV) .pytest_cache .ruff_cache
