# Two commands do everything on a fresh machine: `make run` and `make test`.
# Both create .venv and install the pinned requirements first when needed.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PRESET ?= auto
LESSONS ?=
# CI and batch runs: no progress bars, no GUI backend.
export TQDM_DISABLE ?= 1
export MPLBACKEND ?= Agg
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup sandbox-tool run test test-fast lint notebooks labs handout grade bench bench-grade tiny-model rehearse clean help
.DEFAULT_GOAL := help

help:
	@echo "make run        run the lessons (PRESET=auto|tiny|t4-16g|24g|80g, LESSONS='01 02') and print a summary"
	@echo "make test       unit tests + every lesson executed once (papermill), its records and nbval regression"
	@echo "make test-fast  the unit tests: no lesson execution, no grading of a class, no side venv (under 3 minutes)"
	@echo "make lint       ruff over utils/, tests/ and the lessons"
	@echo "make rehearse   execute the lessons on the GPU presets' code paths, on the CPU (REHEARSE='t4-16g 24g 80g')"
	@echo "make setup      create $(VENV) and install the pinned requirements (and bubblewrap, the grader's sandbox)"
	@echo "make notebooks  re-execute the lessons on tiny and write their outputs back (for commits)"
	@echo "make labs       rebuild labs/, the answers in utils/solutions/, the README's lesson table and docs/exercises.md"
	@echo "make handout OUT=../week4 WITHHOLD='04' LABS='01 02 03 04'  a student repository without lesson 04's answers"
	@echo "make grade LAB=04 SUBMISSIONS=week4-submissions [OUT=grades-04]  grade a class's executed labs (docs/instructors.md)"
	@echo "make bench-grade grade 30 generated lab-01 submissions and print the time"
	@echo "make bench      benchmark report (wall time, peak memory, metrics) in bench/"
	@echo "make tiny-model rebuild the embedded tiny model (about 8 minutes on 2 cores)"

$(STAMP): requirements.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing the pinned requirements into $(VENV) (log: $(VENV)/install.log) ..."
	@$(PY) -m pip install -r requirements.txt > $(VENV)/install.log 2>&1 || \
		{ tail -n 30 $(VENV)/install.log; echo "pip install failed; full log in $(VENV)/install.log"; exit 1; }
	@touch $@

setup: $(STAMP) sandbox-tool

# The grader's sandbox, bubblewrap (`bwrap`): installed on Linux where it is missing and apt-get can
# be used (as root, or with sudo that asks no password); its tests fail, never skip, without it.
sandbox-tool:
	@[ "$$(uname -s)" != Linux ] || command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi; \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$SUDO" != none ]; then \
	    echo "Installing bubblewrap (the grader's sandbox) ..."; \
	    $$SUDO apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
	      { $$SUDO apt-get update -qq >/dev/null 2>&1 && $$SUDO apt-get install -y -qq bubblewrap >/dev/null 2>&1; } || \
	      echo "apt-get could not install bubblewrap: the grader needs it (or --no-sandbox)"; \
	  else echo "bubblewrap (bwrap) is missing: install it to grade in a sandbox (e.g. sudo apt-get install bubblewrap)"; fi; }

run: $(STAMP)
	$(PY) -m utils run $(LESSONS) --preset $(PRESET)

# Each lesson runs once (tests/lesson_runs.py) for its record tests and the nbval comparison of notebooks/, two
# at a time beside the other tests: every process then waits for work passively (OpenMP's spinning threads
# would take the cores from each other; torch reads this when it is first imported).
test: $(STAMP) sandbox-tool
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest tests notebooks

# The unit tests, one pytest-xdist worker per usable core (tests/budget.py), each on one thread (tests/conftest.py);
# `make test` adds the lesson executions and the `slow` tests (classes graded, labs validated, the nbgrader and
# verl side venvs). tests/budget.py prints where the time went, part by part.
test-fast: $(STAMP) sandbox-tool
	$(PY) -m pytest tests -m "not lesson and not slow" -n auto

lint: $(STAMP)
	$(PY) -m ruff check .

# Each lesson on each GPU preset's code path (its real tokenizer and chat template, GSM8K's schema, a step or two)
# with a CPU-sized stand-in model: utils/course/rehearsal.py. `make test` rehearses t4-16g and 24g (07 and 09: 24g).
REHEARSE ?= t4-16g 24g 80g
rehearse: $(STAMP)
	OMP_WAIT_POLICY=PASSIVE $(PY) -m utils rehearse --preset $(REHEARSE) $(if $(LESSONS),--lessons $(LESSONS),)

notebooks: $(STAMP)
	$(PY) -m utils run $(LESSONS) --preset tiny --inplace

labs: $(STAMP)
	$(PY) -m utils labs build
	$(PY) -m utils readme

OUT ?=
WITHHOLD ?=
LABS ?=
# Grade a folder of executed labs in the sandbox: grades.csv, feedback/<student>.md, written.md (docs/instructors.md).
grade: $(STAMP) sandbox-tool
	@test -n "$(LAB)" -a -n "$(SUBMISSIONS)" || { echo "usage: make grade LAB=04 SUBMISSIONS=<folder of executed labs> [OUT=<grades folder>]"; exit 2; }
	$(PY) -m utils grade "$(SUBMISSIONS)" --lab $(LAB) $(if $(OUT),--out "$(OUT)",)

handout: $(STAMP)
	@test -n "$(OUT)" || { echo "usage: make handout OUT=<folder outside the repository> WITHHOLD='04 05' [LABS='01 02 03 04']"; exit 2; }
	$(PY) -m utils handout --out $(OUT) --withhold $(WITHHOLD) $(if $(LABS),--labs $(LABS),)

bench-grade: $(STAMP) sandbox-tool
	rm -rf bench/submissions-01 bench/grades-01
	$(PY) -m tests.grading_fixtures bench/submissions-01 --count 30
	$(PY) -m utils grade bench/submissions-01 --lab 01 --out bench/grades-01

bench: $(STAMP)
	$(PY) -m utils run $(LESSONS) --preset tiny --bench --out bench

tiny-model: $(STAMP)
	$(PY) -m utils tiny build

clean:
	rm -rf runs bench .pytest_cache
