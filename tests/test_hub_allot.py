"""The hub's GPU allotment, its spawn hooks and its configuration file (no JupyterHub needed).

A fake box of 8 GPUs, 2 per learner: four learners fill it, the fifth gets CPU ranks (or
waits), a stop frees the GPUs, a new hub finds the state, concurrent spawns never share one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT
from traitlets.config import Config

from parlab.hub import (
    Allotment,
    AllotmentFull,
    HubSettings,
    Plan,
    gpu_environment,
    make_hooks,
    notice,
)
from parlab.hub.__main__ import active_servers
from parlab.hub.__main__ import main as hub_command

LEARNERS = ["alice", "bob", "carol", "dave", "eve"]


def pool(tmp_path: Path, **kw) -> Allotment:
    return Allotment(tmp_path / "gpus.json", Plan(range(8), 2, **kw))


def test_four_learners_fill_eight_gpus_the_fifth_gets_cpu(tmp_path):
    gpus = pool(tmp_path)
    got = {who: gpus.take(who) for who in LEARNERS}
    held = [g for who in LEARNERS[:4] for g in got[who]]
    assert all(len(got[who]) == 2 for who in LEARNERS[:4])
    assert sorted(held) == list(range(8))          # disjoint, and every GPU used
    assert got["eve"] == []                        # CPU ranks over gloo
    assert gpus.take("alice") == got["alice"]      # asking again changes nothing


def test_a_stop_frees_the_gpus_for_the_next_server(tmp_path):
    gpus = pool(tmp_path)
    got = {who: gpus.take(who) for who in LEARNERS[:4]}
    assert gpus.give_back("bob") == got["bob"]
    assert gpus.give_back("bob") == []
    assert "bob" not in gpus.holders()
    assert gpus.take("eve") == got["bob"]


def test_a_restarted_hub_keeps_the_state(tmp_path):
    first = pool(tmp_path)
    got = {who: first.take(who) for who in LEARNERS[:3]}
    again = Allotment.from_file(tmp_path / "gpus.json")   # what a new hub (or the command) reads
    assert again.plan == first.plan
    assert again.holders() == got
    assert again.take("dave") == sorted(set(range(8)) - {g for v in got.values() for g in v})
    assert again.take("eve") == []


def test_wait_instead_of_cpu(tmp_path):
    gpus = pool(tmp_path, when_full="wait")
    for who in LEARNERS[:4]:
        gpus.take(who)
    with pytest.raises(AllotmentFull, match="all 8 GPUs are held"):
        gpus.take("eve", wait_s=0)
    threading.Timer(0.2, gpus.give_back, args=("carol",)).start()
    assert gpus.take("eve", wait_s=5, poll_s=0.05) == [4, 5]


def test_reconcile_returns_what_stopped_servers_hold(tmp_path):
    gpus = pool(tmp_path)
    for who in LEARNERS[:3]:
        gpus.take(who)
    users = [{"name": "alice", "servers": {"": {"ready": True}}},
             {"name": "carol", "servers": {"": {"pending": "spawn"}}}, {"name": "dave"}]
    assert active_servers(users) == ["alice", "carol"]
    assert gpus.reconcile(active_servers(users)) == {"bob": [2, 3]}
    assert set(gpus.holders()) == {"alice", "carol"}


TAKE = """
import sys, time
from parlab.hub import Allotment, Plan
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # all take at the same moment
print(Allotment(sys.argv[1], Plan(range(8), 1)).take(sys.argv[3]))
"""


def test_concurrent_spawns_never_share_a_gpu(tmp_path):
    """Twelve processes take at once from 8 GPUs, one each: 8 distinct GPUs, 4 CPU servers."""
    start = time.time() + 1.0
    procs = [subprocess.Popen([sys.executable, "-c", TAKE, str(tmp_path / "gpus.json"),
                               str(start), f"learner{i}"], stdout=subprocess.PIPE, text=True)
             for i in range(12)]
    got = [json.loads(p.communicate(timeout=30)[0]) for p in procs]
    held = [g for gs in got for g in gs]
    assert sorted(held) == list(range(8))
    assert sum(gs == [] for gs in got) == 4
    state = json.loads((tmp_path / "gpus.json").read_text())["held"]
    assert sorted(g for gs in state.values() for g in gs) == list(range(8))


def test_the_command_shows_who_holds_which_gpus(tmp_path, capsys):
    gpus = pool(tmp_path)
    gpus.take("alice")
    gpus.take("bob")
    assert hub_command(["gpus", "--state", str(tmp_path / "gpus.json")]) == 0
    out = capsys.readouterr().out
    assert "GPU 0: alice" in out and "GPU 3: bob" in out and "GPU 4: free" in out
    assert "2 servers hold GPUs" in out and "2 more can get some" in out
    hub_command(["free", "alice", "--state", str(tmp_path / "gpus.json")])
    assert set(gpus.holders()) == {"bob"}


def test_the_environment_a_server_gets():
    assert gpu_environment([2, 3], planned=8)["PARLAB_GPUS"] == "2,3"
    cpu = gpu_environment([], planned=8)
    assert cpu["PARLAB_GPUS"] == "" and cpu["CUDA_VISIBLE_DEVICES"] == ""
    assert cpu["PARLAB_BACKEND"] == "gloo" and "all 8 GPUs" in cpu["PARLAB_HUB_FALLBACK"]
    assert "PARLAB_HUB_FALLBACK" not in gpu_environment([], planned=0)  # a box without GPUs


def test_a_cpu_server_says_so_under_the_first_run(monkeypatch, capsys):
    from parlab.launch.devices import placement

    monkeypatch.setattr(notice, "_said", [False])
    for name, value in gpu_environment([], planned=8).items():
        monkeypatch.setenv(name, value)
    assert placement(2) == ("gloo", [])
    placement(2)
    err = capsys.readouterr().err
    assert err.count("your ranks run on the CPU over gloo") == 1 and "all 8 GPUs" in err
    monkeypatch.setenv("PARLAB_HUB_FALLBACK", "")
    assert notice.fallback_line() is None


def fake_spawner(user: str) -> SimpleNamespace:
    return SimpleNamespace(user=SimpleNamespace(name=user), name="", environment={"A": "1"},
                           notebook_dir="", log=logging.getLogger("test_hub"))


def test_hooks_make_the_workspace_and_pass_the_gpus(tmp_path):
    course = tmp_path / "repo" / "course"
    for module in ("00_a", "01_b"):
        (course / module).mkdir(parents=True)
        (course / module / f"{module}.ipynb").write_text("{}")
    gpus = pool(tmp_path)
    pre, post = make_hooks(HubSettings(course_root=tmp_path / "repo", allotment=gpus,
                                       workspaces=str(tmp_path / "users" / "{user}"),
                                       instructors=frozenset({"teacher"})))
    alice = fake_spawner("alice")
    assert pre(alice) is None
    home = tmp_path / "users" / "alice"
    assert alice.notebook_dir == str(home) and (home / "01_b" / "01_b.ipynb").exists()
    assert alice.environment["PARLAB_GPUS"] == "0,1" and alice.environment["A"] == "1"
    assert alice.environment["JUPYTER_CONFIG_PATH"].split(":") == [
        str(tmp_path / "repo" / "autograder" / "jupyter" / "learner"), str(tmp_path / "repo")]
    (home / "00_a" / "00_a.ipynb").write_text("my answers")
    pre(fake_spawner("alice"))                                  # a restart keeps the work
    assert (home / "00_a" / "00_a.ipynb").read_text() == "my answers"
    teacher = fake_spawner("teacher")
    pre(teacher)
    assert teacher.notebook_dir == str(tmp_path / "repo")
    assert teacher.environment["JUPYTER_CONFIG_PATH"].split(":")[0].endswith(
        "autograder/jupyter/instructor")
    assert teacher.environment["PARLAB_GPUS"] == "2,3"
    post(alice)
    assert set(gpus.holders()) == {"teacher"}
    grading = tmp_path / "grading"                    # PARLAB_COURSE_ROOT in the hub's config
    pre, _ = make_hooks(HubSettings(course_root=tmp_path / "repo", instructor_root=grading,
                                    workspaces=str(tmp_path / "users" / "{user}"),
                                    instructors=frozenset({"teacher"})))
    teacher = fake_spawner("teacher")
    pre(teacher)
    assert teacher.notebook_dir == teacher.environment["PARLAB_COURSE_ROOT"] == str(grading)


def test_under_slurm_a_server_gets_no_gpu_setting(tmp_path):
    """Slurm grants a job its GPUs (CUDA_VISIBLE_DEVICES, none on a CPU profile): the hooks
    set no PARLAB_GPUS, CUDA_VISIBLE_DEVICES or PARLAB_BACKEND, which would hide them."""
    (tmp_path / "course").mkdir()
    pre, post = make_hooks(HubSettings(course_root=tmp_path, scheduler_gpus=True,
                                       workspaces=str(tmp_path / "u" / "{user}")))
    alice = fake_spawner("alice")
    assert pre(alice) is None
    assert not {"PARLAB_GPUS", "CUDA_VISIBLE_DEVICES", "PARLAB_BACKEND"} & set(alice.environment)
    assert alice.notebook_dir == str(tmp_path / "u" / "alice")
    post(alice)


def test_the_wait_hook_is_awaited_by_the_hub(tmp_path):
    (tmp_path / "course").mkdir()
    gpus = Allotment(tmp_path / "gpus.json", Plan(range(2), 2, when_full="wait"))
    pre, post = make_hooks(HubSettings(course_root=tmp_path, allotment=gpus, wait_s=0,
                                       workspaces=str(tmp_path / "u" / "{user}")))
    alice, bob = fake_spawner("alice"), fake_spawner("bob")
    asyncio.run(pre(alice))
    assert alice.environment["PARLAB_GPUS"] == "0,1"
    with pytest.raises(AllotmentFull):
        asyncio.run(pre(bob))


def load_config(tmp_path: Path, monkeypatch, **env: str) -> Config:
    for name, value in {"RUN": str(tmp_path / "run"), "GPUS": "0,1,2,3,4,5,6,7", **env}.items():
        monkeypatch.setenv(f"PARLAB_HUB_{name}", value)
    path = ROOT / "autograder" / "hub" / "jupyterhub_config.py"
    c = Config()
    exec(compile(path.read_text(), str(path), "exec"),  # noqa: S102 - as JupyterHub loads it
         {"get_config": lambda: c, "__file__": str(path), "__name__": "jupyterhub_config"})
    return c


def test_the_configuration_loads_and_sets_what_the_readme_says(tmp_path, monkeypatch, capsys):
    c = load_config(tmp_path, monkeypatch)
    assert c.JupyterHub.bind_url == "http://127.0.0.1:8000"
    assert c.JupyterHub.authenticator_class == "shared-password"
    assert c.Authenticator.allowed_users == {"alice", "bob", "carol", "instructor"}
    assert c.Authenticator.admin_users == {"instructor"}
    assert len(c.SharedPasswordAuthenticator.admin_password) >= 32
    assert c.JupyterHub.spawner_class == "simple" and c.Spawner.default_url == "/lab"
    assert c.Spawner.cmd[1:3] == ["-m", "parlab.hub.limits"]
    assert c.Spawner.cmd[3].endswith("jupyterhub-singleuser")
    assert c.Spawner.mem_limit == "16G" and c.Spawner.cpu_limit == 4.0
    assert c.JupyterHub.cleanup_servers is True            # stopping the hub stops servers
    # every file the hub writes is in its run folder, none in the repository it starts in
    run = tmp_path / "run"
    assert c.ConfigurableHTTPProxy.pid_file == str(run / "jupyterhub-proxy.pid")
    assert c.JupyterHub.db_url == f"sqlite:///{run / 'jupyterhub.sqlite'}"
    assert Path(c.JupyterHub.cookie_secret_file).parent == run
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert "jupyterhub_idle_culler" in services["idle-culler"]["command"]
    assert "--timeout=3600" in services["idle-culler"]["command"]
    roles = {r["name"]: set(r["scopes"]) for r in c.JupyterHub.load_roles}
    assert {"delete:servers", "read:users:activity"} <= roles["idle-culler"]
    for name, service in services.items():   # each ends with its hub (parlab.hub.service)
        assert service["command"][1].endswith("lib/parlab/hub/service.py"), service
        assert service["command"][2:4] == [name, "--"], service
    assert services["gpu-pool"]["command"][5:8] == ["-m", "parlab.hub", "watch"]
    assert "default_url" not in c.JupyterHub   # logged in: to their JupyterLab, not /hub/home
    assert roles["gpu-pool"] == {"list:users", "read:servers"}
    assert "http://127.0.0.1:8000" in capsys.readouterr().err            # the printed URL
    spawners = [fake_spawner(who) for who in ["alice", "bob", "carol", "dave", "eve"]]
    for s in spawners:
        c.Spawner.pre_spawn_hook(s)
    assert [s.environment["PARLAB_GPUS"] for s in spawners] == ["0,1", "2,3", "4,5", "6,7", ""]
    workspace = tmp_path / "run" / "users" / "alice"
    assert sorted(p.name for p in workspace.iterdir()) == sorted(
        p.name for p in (ROOT / "course").iterdir() if p.is_dir())
    c.Spawner.post_stop_hook(spawners[0])
    assert "alice" not in Allotment.from_file(tmp_path / "run" / "gpus.json").holders()
    # every PARLAB_HUB_ setting the READMEs name is one the configuration reads
    hub = ROOT / "autograder" / "hub"
    said = (hub / "README.md").read_text() + (ROOT / "README.md").read_text()
    read = (hub / "jupyterhub_config.py").read_text()
    named = set(re.findall(r"PARLAB_HUB_([A-Z_]+)", said))
    assert named and all(f'setting("{n}"' in read for n in named), named


def test_settings_from_the_environment(tmp_path, monkeypatch, capsys):
    c = load_config(tmp_path, monkeypatch, PER_LEARNER="4", WHEN_FULL="wait", IP="0.0.0.0",
                    LEARNERS="ann,ben", MEM="4G", IDLE_S="600", KEEP_SERVERS="1")
    assert c.JupyterHub.bind_url == "http://0.0.0.0:8000"
    assert c.JupyterHub.cleanup_servers is False
    assert c.Authenticator.allowed_users == {"ann", "ben", "instructor"}
    assert "--timeout=600" in c.JupyterHub.services[0]["command"]
    if shutil.which("nvidia-smi") is None:                    # no GPU: no pool to watch
        no_gpus = load_config(tmp_path / "cpu", monkeypatch, GPUS="")
        assert [s["name"] for s in no_gpus.JupyterHub.services] == ["idle-culler"]
    s = fake_spawner("ann")
    asyncio.run(c.Spawner.pre_spawn_hook(s))
    assert s.environment["PARLAB_GPUS"] == "0,1,2,3"


@pytest.mark.skipif(os.geteuid() != 0, reason="the system's users: the hub runs as root")
def test_system_users_refuse_to_start_without_the_instructors_group(tmp_path, monkeypatch):
    import parlab.hub.exchange
    monkeypatch.setattr(parlab.hub.exchange, "cannot_reach", lambda *a, **k: None)  # .venv
    with pytest.raises(SystemExit, match="`groupadd plt-no-such-group`"):
        load_config(tmp_path, monkeypatch, SYSTEM_USERS="1", INSTRUCTOR_GROUP="plt-no-such-group")
    with pytest.raises(SystemExit, match="`usermod -aG root nobody`"):
        load_config(tmp_path, monkeypatch, SYSTEM_USERS="1", INSTRUCTOR_GROUP="root",
                    INSTRUCTORS="nobody")
    assert not (tmp_path / "run" / "exchange").exists(), "nothing made before the refusal"


def test_a_learner_past_the_memory_limit_gets_memory_error():
    """The trial's limits (parlab.hub.limits) on a CPU server: the allocation fails, in the
    process that made it, which lives on to say so."""
    grab = ("import resource\nprint(resource.getrlimit(resource.RLIMIT_AS)[0])\n"
            "try:\n    bytearray(3 * 2**30)\nexcept MemoryError:\n    print('MemoryError')\n")
    env = {**os.environ, "MEM_LIMIT": str(2 * 2**30), "CPU_LIMIT": "2.0", "PARLAB_GPUS": ""}
    out = subprocess.run([sys.executable, "-m", "parlab.hub.limits", sys.executable, "-c", grab],
                         env=env, capture_output=True, text=True, timeout=30)
    assert out.stdout.split() == [str(2 * 2**30), "MemoryError"], out.stderr
    assert "2 threads per process" in out.stderr
