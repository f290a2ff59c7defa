# phi-api: the two commands a newcomer types are `make serve` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODEL_STAMP := $(VENV)/.installed-model
DEV_STAMP := $(VENV)/.installed-dev
INSTRUCTOR_VENV := .venv-instructor
INSTRUCTOR_STAMP := $(INSTRUCTOR_VENV)/.installed
OPENWEBUI_VENV := .venv-openwebui
OPENWEBUI_STAMP := $(OPENWEBUI_VENV)/.installed

.PHONY: install install-model install-dev model pull serve chat test bench bench-spec bench-disk bench-quality clean \
	system-packages

# What serving needs, and nothing more (no torch): the runtime, every package pinned (requirements.lock, as the
# Dockerfile installs it).
# Then phi-api's own 4-bit kernel is built (where the CPU has AVX-512 VNNI; elsewhere it says why in one line and
# ONNX Runtime's kernel serves): a second run returns at once.
install: $(STAMP)
	$(PY) -m phi_api build-kernel

$(STAMP): requirements.txt requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-deps -r requirements.lock
	touch $@

# The conversion tools on top: preparing the default model or a random-weight one.
install-model: $(MODEL_STAMP)

$(MODEL_STAMP): $(STAMP) requirements-model.txt requirements-model-nodeps.txt
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-model.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-model-nodeps.txt
	touch $@

# The test and benchmark tools on top (make test only).
install-dev: $(DEV_STAMP)

$(DEV_STAMP): $(MODEL_STAMP) requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-model.txt -r requirements-dev.txt
	touch $@

# Prints the prepared model folder as its last line; a second run returns at once.
model: install-model
	$(PY) -m phi_api prepare-model

# Download a model by name and print its folder (MODEL=phi-3.5-mini; without MODEL: the catalog).
pull: install
	$(PY) -m phi_api pull $(MODEL)

# phi-api serve in this checkout's environment. With MODEL_PATH, MODEL or MODELS_FILE it serves those and prepares
# nothing (the runtime only is installed); otherwise it prepares the default model (the conversion tools are
# installed for it first) and serves it as smollm2-135m-instruct (unless MODEL_ID is set). MODEL=NAME serves a model
# by name (an alias such as phi-3.5-mini, or REPO[/SUBFOLDER][@REVISION] on the Hub), pulled first unless cached.
# EMBEDDING=1 also prepares and serves the default embedding model (all-minilm-l6-v2) beside the chat model.
serve: install
	@if [ -n "$(EMBEDDING)" ] || [ -z "$${MODEL_PATH:-}$(MODEL)$${MODELS_FILE:-}" ]; then \
		$(MAKE) --no-print-directory install-model; fi
	MODEL="$(MODEL)" exec $(PY) -m phi_api serve $(if $(EMBEDDING),--embedding)

# A terminal chat, answers streamed, with the server make serve runs (its SERVER_PORT; CHAT_ARGS="--help" for more).
chat: install
	$(PY) -m phi_api chat $(CHAT_ARGS)

# The Debian packages the tests need first: installed as root, otherwise a stop within a second that names
# the command to run (before the minutes of set-up).
system-packages:
	tests/system_packages.sh

# instructor's own environment (see requirements-instructor.txt): only the tests use it.
# Open WebUI's own environment (see requirements-openwebui.txt): only the tests use it.
$(OPENWEBUI_STAMP): requirements-openwebui.txt
	test -x $(OPENWEBUI_VENV)/bin/python || $(PYTHON) -m venv $(OPENWEBUI_VENV)
	$(OPENWEBUI_VENV)/bin/python -m pip install --quiet -r requirements-openwebui.txt
	touch $@

$(INSTRUCTOR_STAMP): requirements-instructor.txt
	test -x $(INSTRUCTOR_VENV)/bin/python || $(PYTHON) -m venv $(INSTRUCTOR_VENV)
	$(INSTRUCTOR_VENV)/bin/python -m pip install --quiet -r requirements-instructor.txt
	touch $@

test: system-packages install-dev install $(INSTRUCTOR_STAMP) $(OPENWEBUI_STAMP)
	$(VENV)/bin/ruff check phi_api tests wsgi.py gunicorn.conf.py setup.py
	$(VENV)/bin/mypy
	model_path="$$($(PY) -m phi_api prepare-model | tail -n 1)"; \
	embedding_path="$$($(PY) -m phi_api prepare-model --embedding | tail -n 1)"; \
	PHI_API_TEST_MODEL_PATH="$$model_path" PHI_API_TEST_EMBEDDING_PATH="$$embedding_path" $(PY) -m pytest $(PYTEST_ARGS)

# SHAPE=phi-3.5-mini benchmarks a random-weight model of Phi-3.5-mini's shape instead (built once: minutes, ~23 GB).
bench: install-dev install
	model_path="$$($(PY) -m phi_api prepare-model $(if $(SHAPE),--shape $(SHAPE)) | tail -n 1)"; \
	$(PY) -m phi_api bench serving --model-path "$$model_path" $(BENCH_ARGS)

# Speculative decoding on against off (docs/benchmarks.md); SHAPE=phi-3.5-mini adds that model's step costs.
bench-spec: install-dev
	model_path="$$($(PY) -m phi_api prepare-model | tail -n 1)"; \
	shape_args=(); \
	if [ -n "$(SHAPE)" ]; then \
		shape_args=(--shape-model-path "$$($(PY) -m phi_api prepare-model --shape $(SHAPE) | tail -n 1)"); \
	fi; \
	$(PY) -m phi_api bench spec --model-path "$$model_path" "$${shape_args[@]}" $(BENCH_ARGS)

# Prompts read from disk against computed (docs/benchmarks.md); SHAPE=phi-3.5-mini on that model's shape.
bench-disk: install-dev
	model_path="$$($(PY) -m phi_api prepare-model $(if $(SHAPE),--shape $(SHAPE)) | tail -n 1)"; \
	$(PY) -m phi_api bench disk --model-path "$$model_path" $(BENCH_ARGS)

# The served default model's perplexity and top-1 agreement against a float32 build of the same GGUF (built once).
bench-quality: install-dev
	model_path="$$($(PY) -m phi_api prepare-model | tail -n 1)"; \
	reference_path="$$($(PY) -m phi_api prepare-model --reference | tail -n 1)"; \
	$(PY) -m phi_api bench quality --model-path "$$model_path" --reference-path "$$reference_path" $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(INSTRUCTOR_VENV) $(OPENWEBUI_VENV) .pytest_cache .mypy_cache .ruff_cache
