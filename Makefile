# skyfilter: every set-up step lives here; `make demo` and `make test` need nothing else.
# Versions are pinned once, in conf/versions.env.
include conf/versions.env

SHELL        := /bin/bash
PYTHON       ?= python$(PYTHON_VERSION)
ROOT         := $(abspath .)
VENV         := $(ROOT)/.venv
LOCAL        := $(ROOT)/.local
PY           := $(VENV)/bin/python
SPARK_HOME   := $(VENV)/lib/python$(PYTHON_VERSION)/site-packages/pyspark
# uv installs the pinned packages as pip would (same versions), in about half pip's time; its cache stays in .local.
UV_PIP       := UV_CACHE_DIR=$(LOCAL)/uv-cache $(PY) -m uv pip install -q --python $(PY)
MVN_FLAGS    := -q -B -Dmaven.repo.local=$(LOCAL)/m2 -Dkafka.version=$(KAFKA_VERSION) \
                -Dscala.binary.version=$(SCALA_BINARY_VERSION) -Dlog4j.version=$(LOG4J_VERSION) \
                -Dslf4j.version=$(SLF4J_VERSION)

.PHONY: setup setup-image demo test test-fast docs bench notebook lint clean kafka-stop help

help:
	@echo "make demo   set up everything, then run a small simulated night end to end"
	@echo "make test   set up everything, then run the test suite"
	@echo "make test-fast  the tests without the shared Kafka and SparkSession: under a minute"
	@echo "make docs   build the documentation site (MkDocs) into .local/site"
	@echo "make bench  set up everything, then run every benchmark at full size (hours; BENCH=name for one)"
	@echo "make notebook  open JupyterLab on notebooks/filter_authoring.ipynb"
	@echo "make lint   ruff check"
	@echo "make clean  stop local Kafka and remove .local/ (the venv stays)"

setup: $(VENV)/.installed $(LOCAL)/kafka/libs/.resolved $(LOCAL)/spark-conf/.installed $(LOCAL)/prometheus/.installed

# Python: a virtualenv with the project installed (editable) at pinned versions, by uv (pinned too).
$(VENV)/.installed: setup.py conf/versions.env
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python $(PYTHON_VERSION)"; exit 1; }
	@command -v javac >/dev/null || { echo "error: javac not found; install OpenJDK 17 (apt-get install openjdk-17-jdk-headless)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(UV_PIP) --upgrade pip setuptools wheel -e '.[test]'
	touch $@

# Kafka broker jars from Maven Central (KRaft mode needs no ZooKeeper).
$(LOCAL)/kafka/libs/.resolved: conf/kafka/pom.xml conf/versions.env
	@command -v mvn >/dev/null || { echo "error: mvn not found; install Maven (apt-get install maven)"; exit 1; }
	rm -rf $(LOCAL)/kafka/libs
	mvn $(MVN_FLAGS) -f conf/kafka/pom.xml dependency:copy-dependencies \
	    -DincludeScope=runtime -DoutputDirectory=$(LOCAL)/kafka/libs
	touch $@

# Spark: pyspark's own conf folder points to .local/spark-conf, which holds
# conf/spark-defaults.conf plus the connector jars (Kafka, Avro, Delta) that
# Spark's Ivy resolves once into .local/ivy; spark-submit and python agree.
# Then Spark's classes go into a class-data sharing archive (.local/jvm/spark-classes.jsa):
# the JVMs jobs start from Python (an archive lane's, the test session's) map them
# instead of loading them, and start about 4 s sooner (skyfilter/spark/class_archive.py).
$(LOCAL)/spark-conf/.installed: conf/spark-defaults.conf conf/spark-log4j2.properties conf/fairscheduler.xml \
                                conf/versions.env $(VENV)/.installed $(wildcard skyfilter/spark/jvm/*.java)
	mkdir -p $(LOCAL)/spark-conf
	rm -rf $(SPARK_HOME)/conf && ln -s $(LOCAL)/spark-conf $(SPARK_HOME)/conf
	$(PY) -m skyfilter.spark.session --install $(LOCAL)/spark-conf --class-archive
	touch $@

# Prometheus and promtool from Debian's package, unpacked into .local/prometheus (no root, no service):
# the tests scrape a running stream with a real Prometheus and unit-test the alert rules with promtool.
# The pinned version first; when Debian has replaced it (a security update), the version apt offers.
$(LOCAL)/prometheus/.installed: conf/versions.env
	@command -v apt-get >/dev/null || { echo "error: apt-get not found; Prometheus comes from Debian's package"; exit 1; }
	rm -rf $(LOCAL)/prometheus && mkdir -p $(LOCAL)/prometheus/deb
	cd $(LOCAL)/prometheus/deb && { apt-get download -q prometheus=$(PROMETHEUS_DEB_VERSION) 2>/dev/null \
	    || { echo "prometheus $(PROMETHEUS_DEB_VERSION) not offered by apt: taking its candidate version"; \
	         apt-get download -q prometheus 2>/dev/null || { apt-get update -qq && apt-get download -q prometheus; }; }; }
	dpkg-deb -x $(LOCAL)/prometheus/deb/prometheus_*.deb $(LOCAL)/prometheus/root
	ln -s root/usr/bin $(LOCAL)/prometheus/bin && rm -rf $(LOCAL)/prometheus/deb
	$(LOCAL)/prometheus/bin/promtool --version | head -1
	touch $@

demo: setup
	$(VENV)/bin/skyfilter demo

# Two pytest-xdist workers, each with its own Kafka broker and SparkSession (tests/conftest.py says why and how
# the files are grouped); `pytest tests` alone runs the same tests one by one.
test: setup
	$(PY) -m pytest tests -n 2 --dist loadgroup --no-loadscope-reorder --durations=15

test-fast: $(VENV)/.installed $(LOCAL)/spark-conf/.installed  # one test runs a Spark job of its own
	$(PY) -m pytest tests -m "not slow" -q

docs: $(VENV)/.installed
	$(PY) -m mkdocs build --strict --site-dir $(LOCAL)/site

# Benchmarks, not tests: results (JSON, CSV, Markdown, PNG) go to bench/results, runs to .local/bench/bench_runs.
BENCH ?= producer stages grid user-path broker-load visit-burst side-by-side filter-scaling trigger-sweep sustained catch-up cap-ledger
bench: setup
	set -e; for experiment in $(BENCH); do $(VENV)/bin/skyfilter bench $$experiment $(BENCH_ARGS); done
	$(PY) -m bench.report  # the tables and plots in docs/ come from bench/results, never by hand

# JupyterLab is only needed here, so it is installed on first use.
$(VENV)/.notebook: setup.py $(VENV)/.installed
	$(UV_PIP) -e '.[test,notebook]'
	touch $@

# What docker/Dockerfile runs: the developer set-up plus JupyterLab.
setup-image: setup $(VENV)/.notebook

notebook: setup $(VENV)/.notebook
	$(VENV)/bin/jupyter lab --notebook-dir=$(ROOT) --ip=127.0.0.1 notebooks/filter_authoring.ipynb

lint: setup
	$(VENV)/bin/ruff check .

kafka-stop:
	-test -x $(VENV)/bin/skyfilter && $(VENV)/bin/skyfilter kafka stop

clean: kafka-stop
	rm -rf $(LOCAL)
