# JupyterHub configuration for Parallelism Lab: a class on one shared (GPU) box.
#
# `make hub` starts JupyterHub with this file. Read it top to bottom; every setting is here.
# As shipped it is a TRIAL that works on a fresh machine: bound to 127.0.0.1, learners log in
# with one shared password, every server runs as the Unix user who ran `make hub`. The blocks
# marked "THE REAL THING" (commented) switch to the system's users, a login from your learning
# platform and TLS; SPAWNER = "slurm" (4b) runs each learner's server as a Slurm job on a
# cluster's compute node instead of on this box. The settings at the top can also be given as
# environment variables (PARLAB_HUB_...), which is how `make hub VAR=...` and the tests set
# them.
#
# Files it keeps (git-ignored): autograder/hub/run/ - the hub's database and cookie secret,
# the proxy's pid file, the trial's passwords, the GPU allotment (gpus.json), the trial
# learners' workspaces (users/<name>/) and, under the system's users, nbgrader's exchange
# (exchange/). It writes nothing elsewhere in the repository.
# ruff: noqa: F821  (`get_config` is given by JupyterHub when it loads this file)

import os
import secrets
import shutil
import sys
from pathlib import Path

from parlab.hub import Allotment, HubSettings, Plan, make_hooks
from parlab.hub.exchange import (
    ExchangeProblem,
    cannot_reach,
    group_problem,
    instructor_gid,
    prepare_exchange,
)
from parlab.hub.lti import LtiProblem, configure_lti
from parlab.hub.private import keep_private
from parlab.hub.roster import LoginGate, Roster

c = get_config()  # noqa: F821


def setting(name, default):
    """PARLAB_HUB_<NAME> from the environment, else the default written here."""
    return os.environ.get(f"PARLAB_HUB_{name}", default)


def names(text):
    return [n.strip() for n in text.split(",") if n.strip()]


ROOT = Path(__file__).resolve().parents[2]        # the repository (course/, solutions/)
RUN = Path(setting("RUN", str(ROOT / "autograder" / "hub" / "run")))  # the hub's own files
RUN.mkdir(parents=True, exist_ok=True)
BIN = Path(sys.executable).parent                      # the venv `make hub` installed into

# --- 1. Who: the class --------------------------------------------------------------------
LEARNERS = names(setting("LEARNERS", "alice,bob,carol"))   # allowed to log in
INSTRUCTORS = names(setting("INSTRUCTORS", "instructor"))  # admins; formgrader on the course
# Under the system's users (3a), the instructors' Unix group: the hub gives it the exchange's
# folders and what the course root keeps (answers, submissions, gradebook), so that each
# instructor collects, grades and runs the formgrader as their own account, no root. Make it
# once: `groupadd parlab-instructors; usermod -aG parlab-instructors <instructor>` (learners
# are never in it). The hub refuses to start without it.
INSTRUCTOR_GROUP = setting("INSTRUCTOR_GROUP", "parlab-instructors")
# Where instructors grade (submitted/, autograded/, gradebook.db; their server opens on it):
# PARLAB_COURSE_ROOT as `make formgrader COURSE_ROOT=...` sets it, else the repository.
COURSE_ROOT = Path(os.environ.get("PARLAB_COURSE_ROOT") or ROOT).resolve()
# The class list from your learning platform, `make hub-roster ROSTER=class.csv` (roster.json in
# the course root; parlab.hub.roster): its students are the learners, read at every login (3),
# so a later run adds and retires students without a restart. With it, LEARNERS adds only
# those given as PARLAB_HUB_LEARNERS (no alice, bob, carol).
CLASS_LIST = Roster.load(COURSE_ROOT)
if CLASS_LIST.exists and "PARLAB_HUB_LEARNERS" not in os.environ:
    LEARNERS = []

# --- 2. Where: the address ----------------------------------------------------------------
# The trial listens on this machine only. From a laptop, tunnel to it:
#   ssh -L 8000:127.0.0.1:8000 you@the-box    then open http://127.0.0.1:8000
IP = setting("IP", "127.0.0.1")
PORT = int(setting("PORT", "8000"))
c.JupyterHub.bind_url = f"http://{IP}:{PORT}"
# The hub's API, where servers and services report: on this machine only, unless servers run
# elsewhere (Slurm, 4b): then HUB_IP is this machine's address on the compute nodes' network,
# where each node must reach it (and the hub each node, on any port: the server's is random).
HUB_IP = setting("HUB_IP", "127.0.0.1")
c.JupyterHub.hub_bind_url = f"http://{HUB_IP}:{PORT + 1}"  # its API, for servers, services
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PORT + 2}"  # the proxy's, for the hub
c.JupyterHub.db_url = f"sqlite:///{RUN / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(RUN / "jupyterhub_cookie_secret")
# After logging in, each goes straight to their own JupyterLab (the hub starts their server;
# JupyterHub's redirect_to_server), not to the hub's "Start My Server" page; with the exchange a
# learner's opens on nbgrader's Assignment List (autograder/hub/jupyter/labextensions/). The
# hub's own pages stay at /hub/home (File > Hub Control Panel in JupyterLab).
# Stopping the hub stops every learner's server (their GPUs go back). KEEP_SERVERS = "1" lets
# you restart the hub (to change this file) while learners keep working: their servers and
# GPUs stay, and the restarted hub finds them (and run/gpus.json) as they were.
c.JupyterHub.cleanup_servers = setting("KEEP_SERVERS", "0") != "1"

# The proxy: configurable-http-proxy, the Python port from PyPI installed by `make hub`
# (pyproject's [hub] extra), through parlab.hub.proxy, which passes responses on as they come
# (the port alone holds the spawn page's progress back, then cuts it after 20 s); without the
# port, npm's (`npm install -g configurable-http-proxy`), which streams.
PROXY = BIN / "configurable-http-proxy"
c.ConfigurableHTTPProxy.command = ([sys.executable, "-m", "parlab.hub.proxy"] if PROXY.exists()
                                   else ["configurable-http-proxy"])
# The hub writes the proxy's process id to a file while it runs (JupyterHub's default:
# jupyterhub-proxy.pid in the directory it was started in, the repository); here, in run/.
c.ConfigurableHTTPProxy.pid_file = str(RUN / "jupyterhub-proxy.pid")

# --- 3. How they log in: the trial ---------------------------------------------------------
# SharedPasswordAuthenticator: a learner of LEARNERS logs in with their name and the
# learners' password; an instructor with the instructors' password. Both are made once,
# kept in autograder/hub/run/passwords (readable by you alone) and printed when the hub starts.
c.JupyterHub.authenticator_class = "shared-password"
c.Authenticator.allowed_users = set(LEARNERS) | set(INSTRUCTORS)
c.Authenticator.admin_users = set(INSTRUCTORS)
PASSWORDS = RUN / "passwords"
if not PASSWORDS.exists():
    PASSWORDS.write_text(f"learners {secrets.token_urlsafe(12)}\n"
                         f"instructors {secrets.token_urlsafe(32)}\n")
    PASSWORDS.chmod(0o600)
_pw = dict(line.split(" ", 1) for line in PASSWORDS.read_text().split("\n") if line)
c.SharedPasswordAuthenticator.user_password = _pw["learners"]
c.SharedPasswordAuthenticator.admin_password = _pw["instructors"]
# Who may log in, decided at every login, whatever the login (parlab.hub.roster.LoginGate): an
# instructor, one of LEARNERS, or an active student of the class list as it is now; a student
# the class list retired, and anyone else, is refused with a page saying why. A name a
# learning platform sent (LTI, below) that is a student's platform id becomes their id.
c.Authenticator.post_auth_hook = LoginGate(COURSE_ROOT, LEARNERS, INSTRUCTORS)
c.Authenticator.allow_all = True           # the gate decides (allowed_users: made at start)

# THE REAL THING (a): the system's users. Each learner is a Unix account on the box
# (`adduser alice`); the hub runs as root and starts each server as its learner, whose
# workspace ~alice/parlab is theirs alone (chmod 700). Set SYSTEM_USERS = True and:
#   c.JupyterHub.bind_url = "https://0.0.0.0:443"            # with (c) below
# and learners log in with their Unix password (PAM, set below); nbgrader's exchange is on (6).
# THE REAL THING (b): a login from your learning platform, instead of PAM:
#   LTI 1.3 or 1.1 (Canvas, Moodle, Blackboard, ...): the settings PARLAB_HUB_LOGIN=lti13 and
#   the platform's PARLAB_HUB_LTI_..., read below, after (a).
#   OAuth / OpenID Connect (Google, GitHub, Keycloak): pip install oauthenticator
#     c.JupyterHub.authenticator_class = "generic-oauth"
#     c.GenericOAuthenticator.oauth_callback_url = "https://lab.example.edu/hub/oauth_callback"
#     c.GenericOAuthenticator.client_id = "..."; c.GenericOAuthenticator.client_secret = "..."
#     c.GenericOAuthenticator.authorize_url/token_url/userdata_url = "https://idp.example.edu/..."
#   With either, the class list (make hub-roster) says who may log in (the gate above);
#   learners then need a Unix account only with SYSTEM_USERS (the spawner in 4 runs as them),
#   which make hub-roster makes.
# THE REAL THING (c): TLS, always when the hub is reachable from another machine:
#   c.JupyterHub.ssl_cert = "/etc/letsencrypt/live/lab.example.edu/fullchain.pem"
#   c.JupyterHub.ssl_key = "/etc/letsencrypt/live/lab.example.edu/privkey.pem"
# Where learners' servers run: "local", on this box (4), or "slurm", each a job on a compute
# node of a Slurm cluster (4b), which needs the system's users (a job runs as its learner).
SPAWNER = setting("SPAWNER", "local")
if SPAWNER not in ("local", "slurm"):
    sys.exit(f"PARLAB_HUB_SPAWNER={SPAWNER!r}: write local (this box) or slurm (a cluster)")
SYSTEM_USERS = setting("SYSTEM_USERS", "0") == "1" or SPAWNER == "slurm"
if SYSTEM_USERS:
    c.JupyterHub.authenticator_class = "pam"
    # Every learner's server runs this venv's Python as the learner: a venv made from a
    # Python under /root (pyenv) cannot be run by anyone else. Refuse it now, not at spawn.
    why = (("the hub starts servers as other users only as root: sudo make hub ..."
            if os.getuid() != 0 else None)
           or cannot_reach(sys.executable, execute=True)
           or cannot_reach(ROOT / "lib" / "parlab" / "__init__.py"))
    if why:
        sys.exit(f"PARLAB_HUB_SYSTEM_USERS=1: learners cannot use this hub's files: {why}. "
                 "Make a venv every user can run, from a system Python, in a folder they "
                 "can read: `sudo make hub VENV=.venv-hub PYTHON=/usr/bin/python3 "
                 "PARLAB_HUB_SYSTEM_USERS=1` in a checkout outside /root "
                 "(autograder/hub/README.md)")
    why = group_problem(INSTRUCTOR_GROUP, INSTRUCTORS)
    if why:
        sys.exit(f"PARLAB_HUB_SYSTEM_USERS=1: {why} (then start the hub again; another group: "
                 "PARLAB_HUB_INSTRUCTOR_GROUP=<group>)")
    _db = RUN / "jupyterhub.sqlite"                  # readable by the hub (root) alone
    _db.touch(mode=0o600)
    _db.chmod(0o600)
# (b), for real: PARLAB_HUB_LOGIN=lti13 or lti11, the login from your learning platform
# (parlab.hub.lti: the settings it needs, what to register on the platform, which launch field
# names the learner and why). Learners are the class list's students (make hub-roster), named
# by their id there; under SYSTEM_USERS each needs a Unix account, which make hub-roster makes.
LOGIN = setting("LOGIN", "")
LTI = {"issuer": setting("LTI_ISSUER", ""),                 # LTI 1.3: what the platform
       "client_id": setting("LTI_CLIENT_ID", ""),           # gives you when you register
       "authorize_url": setting("LTI_AUTHORIZE_URL", ""),   # the hub as a tool
       "jwks_url": setting("LTI_JWKS_URL", ""),
       "key": setting("LTI_KEY", "parlab"),                 # LTI 1.1: consumer key, and the
       "secret": setting("LTI_SECRET", ""),                 # secret (unset: made, in RUN)
       "username": setting("LTI_USERNAME", "custom_username")}  # the field naming the learner
LTI_LINES = []
if LOGIN:
    try:
        LTI_LINES = configure_lti(c, LOGIN, LTI, RUN, f"http://{IP}:{PORT}")
    except LtiProblem as exc:
        sys.exit(f"login from the learning platform: {exc}")

# --- 4. Their servers: a workspace, the learner's JupyterLab, the course's kernel ----------
# Each learner's JupyterLab opens on their own workspace, made as `make lab` makes it (a copy
# of course/; a module released later is copied in, earlier work never touched), with the
# learner's Jupyter configuration (autograder/jupyter/learner/: Validate, no formgrader, no
# Create Assignment). The kernel is this venv's Python 3 (torch, parlab). An instructor's
# server opens on the repository with the instructor's configuration, as `make formgrader`:
# nbgrader's formgrader reads ./nbgrader_config.py there. JupyterHub >= 4.1 forbids frames
# between servers (Content-Security-Policy frame-ancestors 'none'), which leaves the
# formgrader's tab in JupyterLab blank: open it in a browser tab of its own instead, at
# /user/<instructor>/formgrader (nbgrader's documentation for JupyterHub >= 4.1 says the same).
if SYSTEM_USERS:
    c.JupyterHub.spawner_class = "localprocess"      # each server as its learner (hub as root)
    WORKSPACES = "~{user}/parlab"
else:
    c.JupyterHub.spawner_class = "simple"            # the trial: every server as you
    WORKSPACES = str(RUN / "users" / "{user}")
    c.SimpleLocalProcessSpawner.home_dir_template = str(RUN / "users" / "{username}")
c.Spawner.cmd = [sys.executable, "-m", "parlab.hub.limits", str(BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.args = ["--allow-root"] if os.getuid() == 0 and not SYSTEM_USERS else []
c.Spawner.environment = {"PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 60

# --- 4b. Or: each learner's server a Slurm job (SPAWNER = "slurm") -------------------------
# The hub stays on this machine (the login node, say) and each server is a batch job on a
# compute node (batchspawner's SlurmSpawner, as parlab.hub.slurm.SlurmJobSpawner): `sbatch`
# as the learner when they start it, `scancel` when they stop it, the idle culler stops it
# (8) or the hub stops. The learner picks a profile on the spawn page (wrapspawner's
# ProfilesSpawner); SLURM_PROFILES lists those offered, in order:
#   cpu    CPU only: ranks over gloo, no GPU;
#   shard  a share of a GPU, --gres=shard:1 (Slurm >= 22.05: the GPU's shards in gres.conf;
#          the learners on one GPU share its memory and time, nothing divides them);
#   gpu    a whole GPU, --gres=gpu:1.
# A job's ranks use the GPUs Slurm grants it (CUDA_VISIBLE_DEVICES; with one GPU, every rank
# on it over gloo, PARLAB_ONE_GPU=0): no PARLAB_GPUS and no allotment (5) here. Each profile
# asks for SLURM_CPUS cores, SLURM_MEM of memory and SLURM_TIME, in SLURM_PARTITION (and
# SLURM_RESERVATION: a reservation for the class's hours), empty = Slurm's default; one
# profile's own: PARLAB_HUB_SLURM_<PROFILE>_<NAME>, e.g. PARLAB_HUB_SLURM_GPU_PARTITION=gpu.
# What the administrator sets up (sudo for sbatch as each learner, the shared filesystem,
# gres.conf): README.md, "Running on a Slurm cluster". The pitfalls batchspawner's users hit,
# handled here: `import batchspawner` (each job posts its server's port to the hub's
# /hub/api/batchspawner, which the import registers: without it, 404 and a spinner); HUB_IP
# (2) where the nodes reach the hub; START_S long enough for the queue, the wait and Slurm's
# reason shown on the spawn page; the environment reaching the job (sbatch --export of every
# variable the spawner sets, with SLURM_CONF kept for sbatch itself); a job that dies, or
# can never start, reported with Slurm's reason instead of a spinner.
SLURM_PROFILES = names(setting("SLURM_PROFILES", "cpu,shard,gpu"))
SLURM = {"partition": setting("SLURM_PARTITION", ""),
         "reservation": setting("SLURM_RESERVATION", ""),
         "time": setting("SLURM_TIME", "4:00:00"),       # a server ends with its job's time
         "mem": setting("SLURM_MEM", "16G"),
         "cpus": setting("SLURM_CPUS", "4")}
PROFILES = {"cpu": ("CPU only (ranks over gloo)", ""),     # key: what the learner reads, GRES
            "shard": ("A share of a GPU (shared with other learners)", "shard:1"),
            "gpu": ("A whole GPU", "gpu:1")}
START_S = int(setting("START_S", "600"))                 # the queue's wait included
if SPAWNER == "slurm":
    # batchspawner's API (each job posts its server's port there) exists only once batchspawner
    # is imported before the hub starts: here, and by parlab.hub.slurm. A spawner class named
    # only as a string in a profile is imported at its first spawn, too late: 404, a spinner.
    import batchspawner  # noqa: F401

    from parlab.hub.slurm import SlurmJobSpawner

    if set(SLURM_PROFILES) - set(PROFILES) or not SLURM_PROFILES:
        sys.exit(f"PARLAB_HUB_SLURM_PROFILES={','.join(SLURM_PROFILES)!r}: list some of "
                 f"{', '.join(PROFILES)}")

    def profile(key):
        mine = {n: setting(f"SLURM_{key.upper()}_{n.upper()}", v) for n, v in SLURM.items()}
        display, gres = PROFILES[key]
        return (display, key, SlurmJobSpawner, {
            "req_partition": mine["partition"], "req_reservation": mine["reservation"],
            "req_runtime": mine["time"], "req_memory": mine["mem"], "req_nprocs": mine["cpus"],
            "req_gres": gres,
            "req_prologue": "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}"
                            + ("; export PARLAB_ONE_GPU=0" if gres else "")})

    c.JupyterHub.spawner_class = "wrapspawner.ProfilesSpawner"
    c.ProfilesSpawner.profiles = [profile(key) for key in SLURM_PROFILES]
    # In the job: batchspawner's wrapper (it picks the port on the node and posts it), then
    # the server of this venv, which every node reads at the same path (the shared
    # filesystem); sbatch, squeue and scancel run as the learner (sudo -E -u <learner>).
    c.Spawner.cmd = [str(BIN / "jupyterhub-singleuser")]
    c.SlurmJobSpawner.batchspawner_singleuser_cmd = str(BIN / "batchspawner-singleuser")
    c.SlurmJobSpawner.exec_prefix = "sudo -E -u {username}"
    c.Spawner.env_keep = ["PATH", "LANG", "LC_ALL", "SLURM_CONF"]
    c.Spawner.start_timeout = START_S
    c.Spawner.http_timeout = 120
    if HUB_IP.startswith("127."):
        print(f"parlab: PARLAB_HUB_HUB_IP={HUB_IP}: only jobs on this machine reach the hub; "
              "on a cluster give this machine's address on the nodes' network",
              file=sys.stderr)

# --- 5. GPUs: a disjoint set per server ----------------------------------------------------
# The plan: the box's GPUs (nvidia-smi's numbers; empty = every GPU nvidia-smi lists), so many
# per learner. A server gets the next free set as PARLAB_GPUS (its ranks go on them, NCCL
# between them); when every set is held WHEN_FULL says what a new server gets: "cpu" (CPU
# ranks over gloo, and a line under the learner's first run saying so) or "wait" (its start
# waits, up to WAIT_S seconds, for a server to stop). A server's GPUs go back when it stops
# or is culled idle. Who holds which: `make hub-gpus` (python -m parlab.hub gpus).
def box_gpus():
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    listing = os.popen(f"{smi} -L 2>/dev/null").read()
    return list(range(sum(line.startswith("GPU ") for line in listing.splitlines())))


GPUS = [] if SPAWNER == "slurm" else [int(g) for g in names(setting("GPUS", ""))] or box_gpus()
PER_LEARNER = int(setting("PER_LEARNER", "2"))
WHEN_FULL = setting("WHEN_FULL", "cpu")
WAIT_S = float(setting("WAIT_S", "600"))
ALLOTMENT = Allotment(RUN / "gpus.json", Plan(GPUS, PER_LEARNER, when_full=WHEN_FULL))

# --- 6. nbgrader's exchange: release, fetch, submit, collect, feedback ----------------------
# Under the system's users only: nbgrader names a student by their Unix account, and the
# trial runs every learner as one, so there it is off (modules come from course/ into each
# workspace, submissions through `make collect FROM=<folder>`). With it, each learner's
# workspace starts empty, the learner's JupyterLab shows nbgrader's Assignments tab
# (autograder/hub/jupyter/learner/), and every server reads
# autograder/hub/nbgrader/nbgrader_config.py: the exchange root EXCHANGE, the course COURSE_ID,
# and a submit that makes each submission readable by its learner and INSTRUCTOR_GROUP only
# (parlab.hub.exchange). Root makes the exchange's folders here: root 1777, inbound 3773 group
# INSTRUCTOR_GROUP (setgid: each submission takes the group; learners cannot list it or rename
# another's submission), outbound 2775 and feedback 2771 (the group writes them). The
# instructor, as their own account (in INSTRUCTOR_GROUP; root works too), from a terminal of
# their server or a shell: `make hub-release MODULE=00_collectives`, `hub-collect`,
# `autograde`, `feedback`, `hub-return` (autograder/hub/README.md, "The exchange").
EXCHANGE = Path(setting("EXCHANGE", str(RUN / "exchange"))).resolve()
COURSE_ID = setting("COURSE_ID", "parlab")
if SYSTEM_USERS:
    try:
        prepare_exchange(EXCHANGE, COURSE_ID, INSTRUCTOR_GROUP)
    except ExchangeProblem as exc:
        sys.exit(f"nbgrader's exchange: {exc}")
    os.environ["PARLAB_HUB_EXCHANGE"], os.environ["PARLAB_HUB_COURSE_ID"] = str(EXCHANGE), COURSE_ID
    os.environ["PARLAB_HUB_INSTRUCTOR_GROUP"] = INSTRUCTOR_GROUP
    # What the course root keeps (answers, hidden tests, their git history, every learner's
    # submission and grade): out of learners' reach, INSTRUCTOR_GROUP's to read and write
    # (parlab.hub.private). A repository that is not the course root is only hidden.
    for _root, _gid in {ROOT: None, COURSE_ROOT: instructor_gid(INSTRUCTOR_GROUP)}.items():
        for _line in keep_private(_root, group=_gid):
            print(f"parlab: made private: {_line}", file=sys.stderr)

c.Spawner.pre_spawn_hook, c.Spawner.post_stop_hook = make_hooks(HubSettings(
    course_root=ROOT, instructor_root=COURSE_ROOT, workspaces=WORKSPACES,
    instructors=frozenset(INSTRUCTORS),
    allotment=ALLOTMENT if GPUS else None, wait_s=WAIT_S, system_users=SYSTEM_USERS,
    exchange=EXCHANGE if SYSTEM_USERS else None, course_id=COURSE_ID,
    extra_env={"PARLAB_HUB_LEARNERS": ",".join(LEARNERS),      # the roster, for the status page
               **({"PARLAB_HUB_INSTRUCTOR_GROUP": INSTRUCTOR_GROUP} if SYSTEM_USERS else {})},
    scheduler_gpus=SPAWNER == "slurm"))

# --- 7. Limits per learner's server --------------------------------------------------------
# JupyterHub hands mem_limit and cpu_limit to the server (MEM_LIMIT, CPU_LIMIT); the local
# spawners above do not enforce them, so the server starts through `parlab.hub.limits`, which
# sets a memory limit per process (RLIMIT_AS; not on GPU servers: CUDA reserves more address
# space than it uses) and caps torch's threads: a learner past the memory sees MemoryError or
# "can't allocate memory" in the cell, their kernel lives on; past the CPU nothing fails.
# THE REAL THING (d): a wall per server (a cgroup) with SystemdSpawner, which enforces both:
#   pip install jupyterhub-systemdspawner    (the hub as root, SYSTEM_USERS = True)
#   c.JupyterHub.spawner_class = "systemdspawner.SystemdSpawner"
#   c.SystemdSpawner.unit_name_template = "parlab-{USERNAME}"
#   A server past its memory is OOM-killed inside its own cgroup (its kernel dies and
#   restarts, a rank shows "killed by signal 9"); past its CPU it is throttled, never killed.
c.Spawner.mem_limit = setting("MEM", "16G")
c.Spawner.cpu_limit = float(setting("CPUS", "4"))

# --- 8. Services: idle culling and the GPU pool --------------------------------------------
# jupyterhub-idle-culler stops a server idle for IDLE_S seconds (its GPUs go back); the
# gpu-pool service returns the GPUs of servers that ended while the hub was not looking. Each
# runs under parlab.hub.service, which ends it within a second when the hub stops (saying so in
# the hub's log; JupyterHub alone waits up to 30 s for a service that ignores SIGINT) and when the
# hub dies without stopping (SIGKILL, a crash): the service's parent-death signal.
IDLE_S = int(setting("IDLE_S", "3600"))


def service(name, *command):
    # run as a file, not `-m parlab.hub.service`: no package to import before its signal handlers
    wrapper = ROOT / "lib" / "parlab" / "hub" / "service.py"
    return {"name": name, "command": [sys.executable, str(wrapper), name, "--", *command],
            "environment": {"PARLAB_HUB_RUN": str(RUN)}}   # names its hub (for `ps e`, tests)


c.JupyterHub.services = [
    service("idle-culler", sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={IDLE_S}"),
]
c.JupyterHub.load_roles = [
    {"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]},
]
if GPUS:
    c.JupyterHub.services.append(
        service("gpu-pool", sys.executable, "-m", "parlab.hub", "watch",
                "--state", str(RUN / "gpus.json"), "--every", "60"))
    c.JupyterHub.load_roles.append(
        {"name": "gpu-pool", "services": ["gpu-pool"], "scopes": ["list:users", "read:servers"]})

# --- 9. What the hub prints when it starts -------------------------------------------------
LOGINS = (f"  learners ({', '.join(LEARNERS)}) and instructors ({', '.join(INSTRUCTORS)}) log "
          f"in with their Unix passwords; instructors grade as members of {INSTRUCTOR_GROUP}\n"
          f"nbgrader's exchange: {EXCHANGE}, course {COURSE_ID}\n" if SYSTEM_USERS else
          f"  learners ({', '.join(LEARNERS)}): password {_pw['learners']}\n"
          f"  instructors ({', '.join(INSTRUCTORS)}): password {_pw['instructors']}\n"
          f"  (kept in {PASSWORDS}; add learners with PARLAB_HUB_LEARNERS=a,b,c)\n"
          "nbgrader's exchange: off in the trial (every learner is one Unix user here, and "
          "nbgrader names a student by theirs): PARLAB_HUB_SYSTEM_USERS=1 turns it on\n")
if CLASS_LIST.exists:
    LOGINS += (f"  the class list: {len(CLASS_LIST.active())} students of {CLASS_LIST.path} "
               "(make hub-roster), read at every login\n")
LOGINS += "".join(f"  {line}\n" for line in LTI_LINES)
SERVERS = (f"servers: Slurm jobs, profiles {', '.join(SLURM_PROFILES)} (GPUs: what Slurm "
           "grants each job)" if SPAWNER == "slurm" else
           f"GPUs: {f'{GPUS}, {PER_LEARNER} per server, then {WHEN_FULL}' if GPUS else 'none'}")
STATUS_OF = INSTRUCTORS[0] if INSTRUCTORS else "<instructor>"
print(f"\nParallelism Lab's hub: open http://{IP}:{PORT}\n{LOGINS}"
      f"who has fetched, submitted, been graded: http://{IP}:{PORT}/user/{STATUS_OF}/parlab/status"
      f" (an instructor's server), or `make status`\n{SERVERS}. "
      "Stop it with Ctrl-C.\n", file=sys.stderr, flush=True)
