# The two commands a user needs: `make up` and `make test`. Both install what
# is missing first (Debian packages, kernel headers, tracefs, the venv).
VENV      ?= .venv
PY        := $(VENV)/bin/python
PYTHON    ?= python3
STAMP     := $(VENV)/.installed
ARGS      ?=

.PHONY: setup host venv up test test-deps test-unit bench clean

setup: host venv

host:
	@bash deploy/host-setup.sh

# BCC comes from Debian; link just its `bcc` package into the venv so no other
# system package leaks in.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  if [ -d /usr/lib/python3/dist-packages/bcc ]; then ln -sfn /usr/lib/python3/dist-packages/bcc $$site/bcc; fi
	@touch $@

venv: $(STAMP)

up: setup
	$(VENV)/bin/jitterscope up $(ARGS)

# Headless Chromium renders the HTML report in the tests.
test-deps:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

test: setup test-deps
	$(PY) -m pytest $(ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit $(ARGS)

bench: setup
	$(PY) bench/run.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
