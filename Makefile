# Parallelism Lab. A new user needs two commands: `make lab` and `make test`.
# Everything is installed into .venv by this file; nothing is installed by hand.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
ARGS ?=
PYTEST_ARGS ?=
MODULES := $(notdir $(patsubst %/,%,$(wildcard solutions/*/)))
NBGRADER := cd autograder && ../$(VENV)/bin/nbgrader

.PHONY: lab hub hub-gpus test-hub test-cluster test test-fast test-corpus release lint bench gpu-check clean setup collect autograde export feedback check update \
	report formgrader

setup: platform $(VENV)/.installed

# The launcher's ranks come from multiprocessing's forkserver: Linux and macOS have it, native
# Windows does not (README.md, "Platforms"). There (make under MSYS2, Git Bash, Cygwin, or
# without uname) every target that needs .venv stops with one line saying so; WSL 2 is Linux.
UNAME := $(shell uname -s 2>/dev/null || echo Windows)
NATIVE_WINDOWS := MINGW% MSYS% CYGWIN% Windows%
ON_WINDOWS := Parallelism Lab runs on Linux and macOS; on Windows use WSL 2 (README.md, "Platforms"): native Windows ($(UNAME)) has no forkserver for the ranks
.PHONY: platform
platform:
	@$(if $(filter $(NATIVE_WINDOWS),$(UNAME)),$(error $(ON_WINDOWS)),true)

# torch first: a CPU build when no GPU is seen (the CPU wheel index, falling back to the
# default index, which is CPU-only where a local CPU wheel is served); a CUDA build otherwise.
# pip installs without compiling; one compileall on every core does it after (sandboxed
# kernels cannot write __pycache__, so everything is compiled before they run).
PIP := $(PY) -m pip install -q --no-compile
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if ! $(PY) -c "import torch" 2>/dev/null; then \
	  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	    echo "GPU seen: installing torch $(TORCH_VERSION) (CUDA build)"; \
	    $(PIP) "torch==$(TORCH_VERSION)"; \
	  else \
	    echo "no GPU seen: installing a CPU build of torch $(TORCH_VERSION)"; \
	    $(PIP) --timeout 10 --retries 0 --index-url $(TORCH_CPU_INDEX) \
	      "torch==$(TORCH_VERSION)" 2>/dev/null \
	    || $(PIP) "torch==$(TORCH_VERSION)"; \
	  fi; \
	fi
	$(PIP) -e ".[dev]"
	@$(PY) -m compileall -q -j 0 $(VENV)/lib lib >/dev/null 2>&1 || true  # a few test files do not parse
	@touch $@

ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
AS_ROOT := $(if $(filter 0,$(shell id -u)),,sudo -n)
CHROMIUM ?= /usr/bin/chromium

# tests/test_browser.py drives Debian's chromium (Playwright never downloads a browser here).
# Best effort: without apt-get, root or passwordless sudo it says so and the test skips.
.PHONY: browser
browser:
	@test -x $(CHROMIUM) || { echo "installing Debian's chromium for tests/test_browser.py"; \
	  { $(AS_ROOT) apt-get update -qq && \
	    $(AS_ROOT) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
	    >/dev/null 2>&1 || echo "could not install chromium: the browser test will skip"; }

# Grading runs every submission in a sandbox made by Debian's bubblewrap (autograder/README.md,
# "The threat model"). Best effort, as for chromium: without apt-get, root or passwordless sudo
# it says so, and `make autograde` then refuses to grade (UNSAFE=1 grades without it).
.PHONY: sandbox
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { echo "installing Debian's bubblewrap for the grader's sandbox"; \
	  { $(AS_ROOT) apt-get update -qq && \
	    $(AS_ROOT) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap; } \
	    >/dev/null 2>&1 || echo "could not install bubblewrap: make autograde will refuse to grade (see autograder/README.md)"; }

WORKSPACE ?= workspace

# JupyterLab opens on workspace/, the learner's own copy of course/: answers never dirty the
# generated release, and a module released later is copied in without touching earlier work.
# Its Jupyter configuration (autograder/jupyter/learner/, added to JUPYTER_CONFIG_PATH, never
# written into the user's own) enables nbgrader's Validate button and nothing an instructor
# uses (formgrader, Create Assignment, the Assignment and Course lists), and no news pop-up.
LEARNER_JUPYTER := $(CURDIR)/autograder/jupyter/learner
INSTRUCTOR_JUPYTER := $(CURDIR)/autograder/jupyter/instructor
WITH_JUPYTER = JUPYTER_CONFIG_PATH="$(1)$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}"

lab: setup
	@mkdir -p $(WORKSPACE)
	@for d in course/*/; do m=$$(basename $$d); \
	  [ -e $(WORKSPACE)/$$m ] || { cp -r $$d $(WORKSPACE)/$$m && echo "new in $(WORKSPACE)/: $$m"; }; \
	done
	@$(GRADING) stale --workspace $(WORKSPACE)
	$(call WITH_JUPYTER,$(LEARNER_JUPYTER)) \
	  $(VENV)/bin/jupyter lab --ServerApp.root_dir=$(WORKSPACE) $(ROOT_FLAG) $(ARGS)

# The instructor's JupyterLab: nbgrader's formgrader (gradebook, manual grading, Generate
# Feedback) on the course root, started here so that ./nbgrader_config.py, which loads
# autograder/nbgrader_config.py and its hidden-test filter, is the configuration it reads.
COURSE_ROOT ?= $(CURDIR)
formgrader: setup
	$(call WITH_JUPYTER,$(INSTRUCTOR_JUPYTER)) PARLAB_COURSE_ROOT=$(abspath $(COURSE_ROOT)) \
	  $(VENV)/bin/jupyter lab --ServerApp.root_dir=$(abspath $(COURSE_ROOT)) $(ROOT_FLAG) $(ARGS)

# A class on one (GPU) box through JupyterHub: autograder/hub/jupyterhub_config.py, read top to bottom,
# is the whole configuration (a trial on 127.0.0.1 as shipped; autograder/hub/README.md). Its packages
# come from pyproject's [hub] extra. `make hub-gpus`: who holds which GPUs.
HUB_CONFIG ?= autograder/hub/jupyterhub_config.py
$(VENV)/.hub-installed: $(VENV)/.installed pyproject.toml
	$(PIP) -e ".[hub]"
	@touch $@

hub: setup $(VENV)/.hub-installed
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/jupyterhub -f $(HUB_CONFIG) $(ARGS)

hub-gpus: setup
	$(PY) -m parlab.hub gpus --state "$${PARLAB_HUB_RUN:-autograder/hub/run}/gpus.json"

# nbgrader's exchange under the hub with the system's users (autograder/hub/README.md, "The
# exchange"), as an instructor in the instructors' group (PARLAB_HUB_INSTRUCTOR_GROUP; the hub,
# started as root, made the exchange and gave it to them) or as root, in this order:
# hub-release MODULE=.. (course/<module> to the learners'
# Assignments tab), hub-collect MODULE=.. (their submissions into submitted/<student>/<module>/,
# what `make autograde` reads), then `make autograde` and `make feedback` as always, and
# hub-return MODULE=.. (the feedback back to them). Each runs nbgrader with the course's
# configuration and autograder/hub/nbgrader/ (the exchange's root and course id).
# The venv's bin/ goes first on PATH, as `make hub` puts it: nbgrader starts `alembic` (a new
# gradebook) by name, and an instructor's own PATH (a login shell, ssh, `runuser -u`, `sudo -u`)
# may not hold it, or may hold root's (`Permission denied: 'alembic'`).
HUB_PATH = PATH="$(abspath $(VENV))/bin:$$PATH"
HUB_NBGRADER = cd autograder && $(HUB_PATH) $(call WITH_JUPYTER,$(CURDIR)/autograder/hub/nbgrader) $(abspath $(VENV))/bin/nbgrader
define HUB_EXCHANGE
@test -n "$(MODULE)" || { echo "make $@ needs MODULE=<module>, e.g. MODULE=00_collectives"; exit 2; }
@test -d course/$(MODULE) || { echo "make $@: no module course/$(MODULE) (ls course/)"; exit 2; }
@$(PY) -m parlab.hub exchange
endef
.PHONY: hub-release hub-collect hub-return
hub-release: setup
	$(HUB_EXCHANGE)
	$(HUB_NBGRADER) release_assignment $(MODULE) --force
hub-collect: setup
	$(HUB_EXCHANGE)
	$(HUB_NBGRADER) collect $(MODULE) --update
hub-return: setup
	$(HUB_EXCHANGE)
	$(HUB_NBGRADER) release_feedback $(MODULE)

# The class list from your learning platform (autograder/hub/README.md, "The class list"):
# hub-roster ROSTER=class.csv [ID_COLUMN=<column>] [DRY=1] puts its students into nbgrader's
# gradebook (nbgrader db student import), the hub's learners (roster.json, read at every login)
# and, with PARLAB_HUB_SYSTEM_USERS=1 (as root), the box's Unix accounts, each new one with a
# one-time password in a file only root reads; a later run adds and retires students (kept in
# the gradebook with their grades, account locked). It says what it changed.
ROSTER ?=
ID_COLUMN ?=
DRY ?=
.PHONY: hub-roster
hub-roster: setup
	@test -n "$(ROSTER)" || { echo "make hub-roster needs ROSTER=<the CSV of the class your learning platform exports>"; exit 2; }
	$(PY) -m parlab.hub.enrol "$(ROSTER)"$(if $(ID_COLUMN), --id-column "$(ID_COLUMN)")$(if $(DRY), --dry-run)

# Who has fetched, submitted (when, how late), been graded (score) and had feedback returned,
# for each student of the roster (the gradebook's students and PARLAB_HUB_LEARNERS): from the
# exchange's records when the hub has one, else from the course root alone (a class handing in
# through `make collect`). As the instructor's own account; MODULE=.. for one module.
.PHONY: status hub-teardown
status: setup
	@$(HUB_PATH) $(PY) -m parlab.grading.report.status$(if $(MODULE), --module "$(MODULE)")

# The end of a term (autograder/hub/README.md, "The end of a term"), as root: archives the
# gradebook, grades and feedback, then removes the learners' accounts (with
# PARLAB_HUB_SYSTEM_USERS=1), workspaces, the course's exchange folders and the learners' files in
# /tmp and /dev/shm; it prints all of it and asks first (YES=1: no question, for scripts).
YES ?=
hub-teardown: setup
	@$(HUB_PATH) $(PY) -m parlab.hub.teardown$(if $(YES), --yes)

# The hub for real on this machine (tests/test_hub_e2e.py: three learners and an instructor
# through its REST API, a browser login, idle culling; tests/test_hub_exchange.py: the same as
# the box's own Unix users, as root, through nbgrader's exchange; about 4 minutes on 2 cores,
# so not part of `make test`). Servers run as other users, who cannot run a venv made from a
# Python under /root: the test's venv, .venv-hub, is made from /usr/bin/python3.
HUB_TEST_VENV ?= .venv-hub
HUB_TEST_PYTHON ?= /usr/bin/python3
test-hub:
	@$(MAKE) --no-print-directory VENV=$(HUB_TEST_VENV) PYTHON=$(HUB_TEST_PYTHON) $(HUB_TEST_VENV)/.hub-installed
	PARLAB_TEST_HUB=1 $(HUB_TEST_VENV)/bin/python -m pytest -q tests/test_hub_e2e.py \
	  tests/test_hub_exchange.py tests/test_hub_allot.py tests/test_hub_roster.py \
	  tests/test_hub_lti.py tests/test_hub_term.py tests/test_hub_services.py $(PYTEST_ARGS)

# A real Slurm on this machine (tests/cluster.py): munged, slurmctld and two slurmd (node1,
# node2) from autograder/cluster/slurm.conf.in, in a temporary folder and a PID namespace of
# their own, one cluster for the whole session, stopped at its end with nothing left behind.
# tests/test_cluster*.py run on it: scripts/train.sbatch requeued at its time limit, a class
# graded by `make autograde ENGINE=slurm`, a job as an ordinary Unix user, the hub's servers
# as Slurm jobs (PARLAB_HUB_SPAWNER=slurm, two learners in Chromium; README.md, "Running on a
# Slurm cluster"). They run from .venv-hub, as make test-hub's: jobs run as other users, who
# cannot run a venv made from a Python under /root. As root; about 7 minutes on 2 cores, so
# not part of `make test`. Debian's slurm-wlm and munge are installed where apt-get, root or
# passwordless sudo allow (on a machine with systemd the packages also enable munge.service,
# which the tests do not use); otherwise it says so and the tests skip.
.PHONY: slurm
slurm:
	@command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 || { \
	  echo "installing Debian's slurm-wlm and munge for make test-cluster"; \
	  { $(AS_ROOT) apt-get update -qq && $(AS_ROOT) env DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends slurm-wlm munge; } >/dev/null 2>&1 \
	  || echo "could not install slurm-wlm and munge: the cluster tests will skip"; }

test-cluster: slurm
	@$(MAKE) --no-print-directory VENV=$(HUB_TEST_VENV) PYTHON=$(HUB_TEST_PYTHON) $(HUB_TEST_VENV)/.hub-installed
	PARLAB_TEST_CLUSTER=1 $(HUB_TEST_VENV)/bin/python -m pytest -q -rs tests/test_cluster*.py $(PYTEST_ARGS)

test: setup browser sandbox
	$(PY) -m pytest -q -m "not corpus" $(PYTEST_ARGS)

# The verifier's whole corpus of every module (tests/test_verifier.py; about 14 minutes):
# each answer of autograder/mistakes/ gets the notebook's verdicts from the verifier too.
test-corpus: setup sandbox
	$(PY) -m pytest -q -m corpus tests/test_verifier.py $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not slow and not corpus" $(PYTEST_ARGS)

# Regenerate course/ (the learners' release) from solutions/ (the source of truth).
release: setup
	@if [ -n "$(MODULES)" ]; then $(NBGRADER) generate_assignment "*" --force --no-db --log-level=ERROR; fi

# Instructor workflow (autograder/README.md): collect FROM=<folder> [TIMES=<csv>], autograde
# [MODULE=..] [STUDENT=..] [ALL=1] [WORKERS=3] [UNSAFE=1] (new and changed submissions only,
# unless ALL=1; UNSAFE=1: without the sandbox, recorded), export (grades.csv), feedback,
# report (report.html). ENGINE=slurm grades on a Slurm cluster instead of this machine: one job
# array of TASKS shares, WORKERS at once, and a dependent merge step (autograder/cluster/
# autograde.sbatch; SBATCH_ARGS="--partition=.. --account=.." for your site). Every nbgrader call runs with the venv's bin/ first on PATH
# (parlab.grading.run_nbgrader). Learners: `make check MODULE=..` runs the visible tests of
# their own notebook (workspace/, else course/).
FROM ?=
TIMES ?=
MODULE ?=
STUDENT ?=
ALL ?=
UNSAFE ?=
WORKERS ?= 3
ENGINE ?=
TASKS ?= 16
SBATCH_ARGS ?=
GRADING := $(PY) -m parlab.grading

collect: setup
	$(GRADING) collect "$(FROM)"$(if $(TIMES), --times "$(TIMES)")

autograde: setup sandbox
	$(GRADING) autograde --module "$(or $(MODULE),*)" --workers $(WORKERS)$(if $(ENGINE), --engine $(ENGINE))$(if $(filter slurm,$(ENGINE)), --tasks $(TASKS) --sbatch-args "$(SBATCH_ARGS)")$(if $(STUDENT), --student "$(STUDENT)")$(if $(ALL), --all)$(if $(UNSAFE), --unsafe)

# FORMAT=canvas or FORMAT=moodle: the CSV that platform's gradebook imports (grades-canvas.csv,
# grades-moodle.csv), written by nbgrader's own `nbgrader export` with the course's export plugin
# (parlab.grading.report.canvas, report.moodle: scores less the late penalty, retired students
# left out; autograder/README.md, "4. export"). Without FORMAT: grades.csv, as always.
EXPORTER_canvas := parlab.grading.report.canvas.CanvasExport
EXPORTER_moodle := parlab.grading.report.moodle.MoodleExport
FORMAT ?=
export: setup
	$(if $(FORMAT),@test -n "$(EXPORTER_$(FORMAT))" || { echo "make export FORMAT=$(FORMAT): \
	  FORMAT is canvas or moodle (or none: grades.csv)"; exit 2; })
	$(if $(FORMAT),cd autograder && PATH="$(abspath $(VENV))/bin:$$PATH" $(abspath $(VENV))/bin/nbgrader \
	  export --exporter=$(EXPORTER_$(FORMAT)) --to "$(CURDIR)/grades-$(FORMAT).csv",$(GRADING) export --to grades.csv)

feedback: setup
	$(GRADING) feedback --module "$(or $(MODULE),*)"

report: setup
	$(GRADING) report --to report.html

check: setup
	$(GRADING) check $(MODULE)

# A new release of a module you have started: carry your answers (by grade id) into it; your
# previous notebook is kept beside it as <module>.before-update-<time>.ipynb.
update: setup
	@test -n "$(MODULE)" || { echo "make update needs MODULE=<module>, e.g. MODULE=02_tensor_parallel"; exit 2; }
	$(GRADING) update $(MODULE) --workspace $(WORKSPACE)

lint: setup
	$(VENV)/bin/ruff check lib tests benchmarks autograder scripts nbgrader_config.py
	$(VENV)/bin/mypy lib/parlab

# Side-by-side timings, one markdown table each (also in artifacts/bench/); about 8 minutes.
bench: setup
	@for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

# On a CUDA machine: a roofline of the card, then every solution notebook on NCCL (>= 2 GPUs),
# one summary table, under 8 minutes. Without CUDA it says so and exits 0.
gpu-check: setup
	scripts/gpu_check.sh

clean:
	rm -rf $(VENV) .pytest_cache artifacts
