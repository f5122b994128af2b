# Two entry points that do all set-up on a fresh machine (see README):
#   make report   - the main job: capacity report on the built-in default scenario
#   make test     - the whole test suite
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: report test venv bench notebooks clean timing-doc check-answers

# setup.py builds the compiled replay cores (replay/engine/v*/_core.c) into the source tree.
$(STAMP): pyproject.toml setup.py replay/engine/kvcore.h replay/engine/v1/_core.c \
		replay/engine/v1/_offload.h replay/engine/v1/_connector.h replay/engine/v0/_core.c
	@test -x $(PY) || python3 -m venv $(VENV)
	@# torch first, pinned to the local CPU build (see ../shared/STACK.md), then the project in one call.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,ray]'
	@$(PY) -c "import replay.engine.v1._core, replay.engine.v0._core" 2>/dev/null || echo "WARNING: kvcap's compiled replay cores were not built (no C compiler or Python headers?): replays will run on the Python reference implementation, tens of times slower." >&2
	@touch $(STAMP)

venv: $(STAMP)

report: $(STAMP)
	$(VENV)/bin/kvcap report -o report

# One pytest worker per core, each taking whole test files (their module fixtures run once);
# `make test PYTEST_WORKERS=0` runs them in this process, one after another.
PYTEST_WORKERS ?= auto
test: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile

# The invariant corpus (issue 31): every command on every scenario, table -> docs/answers.md.
check-answers: $(STAMP)
	$(PY) tools/check_answers.py

bench: $(STAMP)
	$(PY) bench/run_all.py

# The shipped step-time profiles (replay/timing/profiles/) and docs/timing.md, from NVIDIA
# AIConfigurator's kernel database: a development download only, never a kvcap dependency.
AIC_VERSION := 0.12.0
timing-doc: $(STAMP)
	$(PY) -m pip download -q --no-deps aiconfigurator-core==$(AIC_VERSION) -d .aic
	$(PY) tools/aic_profiles.py --wheel .aic/aiconfigurator_core-$(AIC_VERSION)-*.whl

# JupyterLab on notebooks/, bound to localhost only (open the URL with the token it prints).
notebooks: $(STAMP)
	cd notebooks && ../$(VENV)/bin/jupyter lab --no-browser --ServerApp.ip=127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf $(VENV) report
