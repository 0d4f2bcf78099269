# make demo: the main job, vq against faiss on NSynth embeddings (creates .venv on first use)
# make test: lint + the whole test suite (one pytest worker per core; they share the kernel cache)
# make docs: the documentation site in site/ (warnings are errors), then its internal links
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test docs bench lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[all]"
	touch $@

demo: $(VENV)/.installed
	$(PY) -m vq.apps.nsynth

test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n auto

docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet
	$(PY) docs/hooks/check_links.py site

$(VENV)/.peers: $(VENV)/.installed
	$(PY) -m pip install --quiet -e ".[all,peers]"
	touch $@

bench: $(VENV)/.peers
	$(PY) -m bench

clean:
	rm -rf $(VENV) build site *.egg-info
