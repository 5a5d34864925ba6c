# Everything a newcomer needs: `make demo` and `make test` install what they use.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU wheel of torch (a local file on these machines). On a GPU machine,
# install the CUDA build first, e.g. `make install TORCH_SPEC="torch==2.13.0 --index-url ..."`.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install demo test clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_SPEC)
	$(PIP) install -q -e ".[dev]"
	touch $(STAMP)

demo: install
	$(PY) scripts/demo.py

test: install
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) demo-data .pytest_cache .hypothesis
