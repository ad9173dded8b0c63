"""Unix accounts and a group for the hub's tests as the box's own users (test_hub_exchange.py),
removed at the end with their homes, processes and what they left in /tmp, whatever happened."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def unix_users(names: list[str], password: str, group: str,
               members: list[str]) -> Iterator[None]:
    """Local accounts with homes and `password`, and `group` with `members`; at the end their
    processes ended (by pid), the accounts removed with their homes and the group removed,
    whatever happened."""
    for name in names:
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            raise RuntimeError(f"a user {name} exists already: remove it (userdel -r {name})")
    with contextlib.suppress(KeyError):
        grp.getgrnam(group)
        raise RuntimeError(f"a group {group} exists already: remove it (groupdel {group})")
    made_group = False
    try:
        for name in names:
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
        subprocess.run(["chpasswd"], input="".join(f"{n}:{password}\n" for n in names),
                       text=True, check=True)
        subprocess.run(["groupadd", group], check=True)
        made_group = True
        for name in members:
            subprocess.run(["usermod", "-aG", group, name], check=True)
        yield
    finally:
        uids = {pwd.getpwnam(n).pw_uid for n in names if _exists(n)}
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError, ValueError):
                if proc.name.isdigit() and proc.stat().st_uid in uids:
                    os.kill(int(proc.name), 9)
        for name in names:
            if _exists(name):
                subprocess.run(["userdel", "-r", name], capture_output=True)
        for left in Path(tempfile.gettempdir()).iterdir():  # their scratch (parlab.launch.scratch)
            with contextlib.suppress(OSError):
                if left.lstat().st_uid in uids and left.is_dir() and not left.is_symlink():
                    shutil.rmtree(left)
                elif left.lstat().st_uid in uids:
                    left.unlink()
        if made_group:
            subprocess.run(["groupdel", group], capture_output=True)


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
