# gpuops.gpu: the two README commands are `make demo` and `make test`.
# Everything they need is set up here from a fresh clone: .venv, the simulator's C library,
# the ansible_collections/ layout for ansible-test, ansible-test's offline pip bootstrap.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

TOP := $(CURDIR)
# The caller's HOME is read once (the Pythons under ~/.pyenv, pip's cache); every tool that make
# starts gets a HOME inside build/, so that ansible-test (~/.ansible/test), Ansible, molecule and
# the rest write nothing into the caller's HOME. pip's cache stays where the caller keeps it.
USER_HOME := $(HOME)
export PYENV_ROOT := $(or $(PYENV_ROOT),$(USER_HOME)/.pyenv)
export PIP_CACHE_DIR := $(or $(PIP_CACHE_DIR),$(USER_HOME)/.cache/pip)
export HOME := $(TOP)/build/home
# The controller Python: ansible-core 2.21 needs 3.12 or later.
CONTROLLER_PYTHON ?= $(firstword $(wildcard $(PYENV_ROOT)/versions/3.12*/bin/python3.12) $(shell command -v python3.12 2>/dev/null) $(wildcard $(PYENV_ROOT)/versions/3.13*/bin/python3.13) $(shell command -v python3.13 2>/dev/null))
# Target Pythons for the modules' unit tests: every one of 3.9..3.15 (ansible-core 2.22's targets) this machine has.
TARGET_PYTHON_VERSIONS := 3.9 3.10 3.11 3.12 3.13 3.14 3.15
TARGET_PYTHON_DIRS := $(foreach v,$(TARGET_PYTHON_VERSIONS),$(firstword $(wildcard $(PYENV_ROOT)/versions/$(v).*/bin)))
HAVE_TARGET_PYTHONS := $(foreach v,$(TARGET_PYTHON_VERSIONS),$(if $(wildcard $(PYENV_ROOT)/versions/$(v).*/bin/python$(v)),$(v),$(if $(shell command -v python$(v) 2>/dev/null),$(v))))

VENV := $(TOP)/.venv
VPY := $(VENV)/bin/python
COLL := $(TOP)/build/ansible_collections/gpuops/gpu
PYTEST := $(TOP)/.ci/pytest.sh $(VPY) -m pytest
# ansible-test finds target Pythons as python3.X on PATH.
export PATH := $(VENV)/bin:$(subst $(eval) ,:,$(strip $(TARGET_PYTHON_DIRS))):$(PATH)
export ANSIBLE_COLLECTIONS_PATH := $(TOP)/build
# Ansible's own files (tmp, galaxy cache) stay in the build directory, not in ~/.ansible.
export ANSIBLE_HOME := $(TOP)/build/ansible-home
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help venv sim layout test demo sanity lint units integration simtests sshd-prereqs packaging molecule bench-smoke bench docs gpu-smoke pve-smoke clean

help:
	@echo "make demo   - start a simulated 8 x H200 host with a workload, show nvidia-smi and pct, clean up"
	@echo "make test   - every gate: sanity, ansible-lint, units (Python $(HAVE_TARGET_PYTHONS)), simulator and functional tests,"
	@echo "              packaging (build/install/ansible-doc, EE context, changelog, docs, support matrix), integration,"
	@echo "              molecule, a benchmark smoke run"
	@echo "make bench  - the full benchmarks (benchmarks/README.md) and the fault matrix: docs/performance.md, scale.md, reliability.md"
	@echo "make fuzz   - the generated release scenarios (tests/functional/test_scenarios.py), FUZZ_EXAMPLES=150 of them"
	@echo "make docs   - HTML docs in build/docs (docs/README.md)"
	@echo "make gpu-smoke - the modules on this host's NVIDIA GPU: compare with nvidia-smi, time a release (GPU_SMOKE_ARGS=\"--mib 102400 --gpu 1\")"
	@echo "make pve-smoke - on a Proxmox VE node (read-only): time pct, compare the fence's reading of /etc/pve with pct's"

# --- set-up ---------------------------------------------------------------------------------
$(VENV)/.stamp: requirements.txt constraints.txt
	@test -n "$(CONTROLLER_PYTHON)" || { echo "no Python 3.12 or 3.13 found (looked in $(PYENV_ROOT)/versions and PATH)"; exit 1; }
	$(CONTROLLER_PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --disable-pip-version-check -r requirements.txt -c constraints.txt
	touch $@

# ansible-test's offline pip bootstrap, in the HOME that make gives its tools (build/home).
$(HOME)/.ansible/test/cache/.stamp: $(VENV)/.stamp
	mkdir -p $(HOME)
	$(VPY) .ci/ansible_test_offline.py
	touch $@

venv: $(VENV)/.stamp $(HOME)/.ansible/test/cache/.stamp

# The simulator's containers are real LXC containers: lxc, debootstrap and busybox-static are installed
# when missing (apt-get, as root) and the Debian rootfs with systemd is built once into
# tests/gpusim/build/rootfs (tests/gpusim/setup-lxc.sh; idempotent).
.PHONY: lxc
lxc:
	tests/gpusim/setup-lxc.sh

sim: lxc
	$(MAKE) -C tests/gpusim

layout: venv
	.ci/layout.sh

# --- the two README commands ------------------------------------------------------------------
demo: venv sim layout
	$(VPY) tests/gpusim/demo.py

# `make test` writes nothing into HOME but pip's cache: it compares a listing of HOME
# (.ci/home_listing.sh) before and after the gates.
# The gates (.ci/gates.sh): first two tracks side by side, sanity then packaging beside lint then units (each mostly
# one core but units' pytest: ansible-test, pip, pylint, ansible-galaxy); then simtests and integration alone (they
# time real processes); then molecule beside bench-smoke (neither asserts a time: a smoke run's figures are never
# used, tools/performance_doc.py; their containers differ: CT 150-151, CT 129-130 and 7300+).
test: venv sim layout
	@start=$$(date +%s); \
	mkdir -p $(HOME); before=$$(.ci/home_listing.sh $(USER_HOME)); \
	MAKE="$(MAKE)" .ci/gates.sh "sanity packaging" "lint units" || exit 1; \
	for gate in simtests integration; do MAKE="$(MAKE)" .ci/gates.sh $$gate || exit 1; done; \
	MAKE="$(MAKE)" .ci/gates.sh molecule bench-smoke || exit 1; \
	after=$$(.ci/home_listing.sh $(USER_HOME)); \
	if [ "$$before" != "$$after" ]; then echo "=== make test changed HOME ($(USER_HOME)); it may write only pip's cache there:"; \
	  diff <(echo "$$before") <(echo "$$after") || true; exit 1; fi; \
	echo "=== HOME unchanged by make test (but pip's cache)"; \
	echo "=== make test: all gates passed in $$(( $$(date +%s) - start )) s"

# --- gates -------------------------------------------------------------------------------------
sanity: layout
	cd $(COLL) && ansible-test sanity --local --python 3.12 --color no

lint: layout
	cd $(COLL) && ansible-lint --offline --profile production

units: layout
	@test -n "$(HAVE_TARGET_PYTHONS)" || { echo "no target Python 3.9..3.15 found"; exit 1; }
	cd $(COLL) && for v in $(HAVE_TARGET_PYTHONS); do \
	  echo "--- units on Python $$v"; \
	  ansible-test units --venv --python $$v --color no --requirements || exit 1; \
	done

# The real-SSH tests (tests/functional/test_ssh_become.py) need sshd and sudo: installed when missing.
sshd-prereqs:
	.ci/sshd_prereqs.sh

# Three pytest workers (pytest-xdist), a file each at a time: most of these tests wait on real processes,
# containers and timeouts, so several run side by side on CI's 2 cores (16 -> 8 min there with two workers; with
# three, on 2 loaded cores: 1,036 s where two took about 1,480, the three using 0.93 cores on average). Every test
# reserves its vmids machine-wide (gpusimkit.vmids) and builds its own simulator, so none collide.
# The files go out longest first (tests/functional/conftest.py, LONGEST_FIRST; --no-loadscope-reorder keeps that
# order, where pytest-xdist would start the files with the most tests first and the few long ones last).
# SIMTESTS_WORKERS=0 runs them one after the other.
SIMTESTS_WORKERS ?= 3
simtests: venv sim sshd-prereqs
	$(PYTEST) -q -p no:cacheprovider -n $(SIMTESTS_WORKERS) --dist loadfile --no-loadscope-reorder tests/gpusim/tests tests/functional

# The generated scenarios of tests/functional/test_scenarios.py, longer than in make test (which runs
# GPUOPS_SCENARIOS=16 of them): FUZZ_EXAMPLES examples, FUZZ_SEED to draw others.
FUZZ_EXAMPLES ?= 150
FUZZ_SEED ?= 18
.PHONY: fuzz
fuzz: venv sim
	GPUOPS_SCENARIOS=$(FUZZ_EXAMPLES) GPUOPS_SCENARIOS_SEED=$(FUZZ_SEED) GPUOPS_SCENARIOS_BUDGET_S=0 \
	  $(PYTEST) -q -p no:cacheprovider -rxX tests/functional/test_scenarios.py

integration: layout sim
	cd $(COLL) && ansible-test integration --local --python 3.12 --color no

molecule: layout sim
	@if ls extensions/molecule/*/molecule.yml >/dev/null 2>&1; then \
	  cd $(COLL) && GPUSIM_CLI=$(TOP)/tests/gpusim/gpusim GPUSIM_PYTHON=$(VPY) molecule test --all; \
	else echo "molecule: no scenarios yet (extensions/molecule/*/molecule.yml)"; fi

packaging: venv sim
	$(PYTEST) -q -p no:cacheprovider tests/packaging

docs: venv
	docs/build.sh

bench-smoke: venv sim
	$(VPY) benchmarks/run.py --smoke

# The full benchmarks write docs/performance.md and docs/scale.md (benchmarks/run.py, then
# tools/performance_doc.py); the fault matrix writes docs/reliability.md.
bench: venv sim
	$(VPY) benchmarks/run.py
	GPUOPS_WRITE_DOCS=1 $(PYTEST) -q -p no:cacheprovider tests/functional/test_fault_matrix.py

# --- real hardware (not in make test: needs an NVIDIA GPU; make test runs it on the simulator) ---
GPU_SMOKE_ARGS ?=
gpu-smoke: venv sim
	mkdir -p build
	$(VPY) tools/gpu_smoke.py --json build/gpu-smoke.json $(GPU_SMOKE_ARGS)

# --- a real Proxmox VE node (not in make test: needs one; read-only) ---
# What pct costs there and whether the fence's reading of /etc/pve agrees with pct (tests/gpusim/README.md "What pct costs").
pve-smoke: venv
	mkdir -p build
	$(VPY) tools/pve_smoke.py --json build/pve-smoke.json $(PVE_SMOKE_ARGS)

clean:
	rm -rf build tests/output
	$(MAKE) -C tests/gpusim clean
