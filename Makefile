# make demo: the main job, vq against faiss on NSynth embeddings (creates .venv on first use)
# make test: lint + the whole test suite (one pytest worker per core; they share the kernel cache)
# make docs: the documentation site in site/ (warnings are errors), then its internal links
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# uv installs the wheels (torch's CUDA build among them, ~5 GB) in a quarter of pip's time; it
# leaves the bytecode to Python, which caches each module as it is first imported: a
# PYTHONDONTWRITEBYTECODE in the caller's environment would make every process parse torch again
unexport PYTHONDONTWRITEBYTECODE
INSTALL = $(PY) -m pip install --quiet uv && $(VENV)/bin/uv pip install --quiet --python $(PY)

.PHONY: demo test docs bench lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(INSTALL) -e ".[all]"
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
	$(INSTALL) -e ".[all,peers]"
	touch $@

bench: $(VENV)/.peers
	$(PY) -m bench

clean:
	rm -rf $(VENV) build site *.egg-info
