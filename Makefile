# Everything a newcomer needs is one target away. `make demo` and `make test` do all set-up first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch. A GPU user sets TORCH_SPEC (see README, "GPU install").
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
PRESET ?= qwen2.5-coder-0.5b
STAMP  := $(VENV)/.installed
REMOTE_STAMP := $(VENV)/.installed-remote
LLAMACPP_STAMP := $(VENV)/.installed-llamacpp

.PHONY: setup setup-llamacpp models demo test test-fast test-editors test-reliability test-remote bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

setup: $(STAMP)

# The `gguf` weight format: llama.cpp's CPU kernels under the same verify loop (README, "Weights").
# llama-cpp-python builds llama.cpp from source the first time (~12 minutes on 2 cores); pip keeps
# the wheel in its cache outside the clone. `make test` then also runs tests/engine/test_gguf.py.
$(LLAMACPP_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench,llamacpp]'
	touch $(LLAMACPP_STAMP)

setup-llamacpp: $(LLAMACPP_STAMP)

models: setup
	$(BIN)/draftwise models pull $(PRESET)

demo: models
	$(BIN)/python examples/demo.py

test: models
	$(BIN)/python -m pytest -m "not slow and not remote"

test-fast: setup
	$(BIN)/python -m pytest -m "not slow and not real_model and not remote"

# The remote backend against a real engine (llama-cpp-python's server). The first install builds
# llama.cpp from source (~12 minutes on 2 cores); pip keeps the built wheel in its cache outside the
# clone (~/.cache/pip), so later installs take seconds.
$(REMOTE_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench,remote,remote-test]'
	touch $(REMOTE_STAMP)

test-remote: models $(REMOTE_STAMP)
	$(BIN)/python -m pytest -m remote tests/remote

test-editors: models
	bash tests/editors/run.sh

test-reliability: setup
	$(BIN)/python -m pytest tests/reliability -q -rxX -p no:cacheprovider

bench: models
	$(BIN)/draftwise bench --target $(PRESET)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
