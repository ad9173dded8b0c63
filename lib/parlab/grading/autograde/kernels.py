"""The grader's kernel manager: where a submission's kernel starts, and in what.

jupyter_client's AsyncKernelManager, with the two choices ResilientExecute makes
(`kernel_manager(warm=..., limits=...)`):

- warm: the kernel is forked from the grading process's template (parlab.grading.autograde.warm), or
  started the usual way (`python -m ipykernel_launcher`);
- limits: a `Limits` puts the kernel in a sandbox of its own (parlab.grading.sandbox), one
  per kernel start, closed with it: a kernel restarted after a crash gets a fresh one. The
  kernel then talks to the grader over Unix sockets in a small tmpfs of its sandbox (the
  `ipc` transport: its network namespace has no route to the grader's), which the grader
  reaches through /proc/<holder>/root; it runs with the
  sandbox's environment (`kernel_env`), and enters through parlab.grading.sandbox.jail, forked from
  the template or as a script before `ipykernel_launcher`. zmq drops any message from it
  over MAX_MESSAGE_BYTES: a kernel cannot fill the grader's memory with one message.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import zmq
from jupyter_client.manager import AsyncKernelManager

from parlab.grading.autograde.warm import Zygote
from parlab.grading.autograde.zygote import LAUNCHER
from parlab.grading.sandbox import IPC_DIR, Limits, Sandbox, kernel_env

JAIL = str(Path(__file__).parent.parent / "sandbox" / "jail.py")
MAX_MESSAGE_BYTES = 64 << 20  # one message from a sandboxed kernel


def _launcher_args(cmd: list[str]) -> list[str] | None:
    """The arguments after `python -m ipykernel_launcher`, when `cmd` is that with this
    Python; else None (another kernel: start it cold)."""
    if len(cmd) > 3 and cmd[1:3] == LAUNCHER and os.path.realpath(cmd[0]) == os.path.realpath(
            sys.executable):
        return cmd[3:]
    return None


class GradingKernelManager(AsyncKernelManager):
    """See the module doc; configured by subclassing (`kernel_manager`)."""

    warm: bool = False
    limits: Limits | None = None
    sandbox: Sandbox | None = None

    async def _async_pre_start_kernel(self, **kw: Any) -> Any:
        if self.limits is None:
            return await super()._async_pre_start_kernel(**kw)
        self.close_sandbox()
        self.sandbox = sandbox = Sandbox(Path(kw.get("cwd") or os.getcwd()), self.limits)
        # the grader reaches the kernel's socket folder through /proc/<holder>/root; the
        # kernel, inside, at IPC_DIR: the connection file says the kernel's side
        outside = sandbox.ipc_outside
        self.transport, self.ip = "ipc", str(outside / "kernel")
        self.connection_file = str(outside / "kernel.json")
        kernel_cmd, kw = await super()._async_pre_start_kernel(**kw)
        info = json.loads(Path(self.connection_file).read_text())
        Path(self.connection_file).write_text(json.dumps(dict(info, ip=f"{IPC_DIR}/kernel")))
        os.chown(self.connection_file, sandbox.uid, sandbox.gid)
        inside = f"{IPC_DIR}/kernel.json"
        return [inside if arg == self.connection_file else arg for arg in kernel_cmd], kw

    def _reconcile_connection_info(self, info: Any) -> None:
        if self.sandbox is None:  # else the file holds the kernel's side on purpose
            super()._reconcile_connection_info(info)

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        env = dict(kw.get("env") or os.environ)
        jail = None
        if self.sandbox is not None:
            jail = dict(self.sandbox.spec(), env=kernel_env(env))
        args = _launcher_args(kernel_cmd)
        zygote = Zygote.get() if self.warm and args is not None else None
        if zygote is None or args is None:
            if jail is not None:
                kernel_cmd = [sys.executable, JAIL, json.dumps(jail), "--", *kernel_cmd]
            await super()._async_launch_kernel(kernel_cmd, **kw)
            return
        cwd = jail["cwd"] if jail else str(kw.get("cwd") or os.getcwd())
        proc = zygote.spawn(args, jail["env"] if jail else env, cwd, jail=jail)
        provisioner: Any = self.provisioner
        provisioner.process, provisioner.pid, provisioner.pgid = proc, proc.pid, proc.pid
        provisioner.cwd = cwd
        self._reconcile_connection_info(provisioner.connection_info)

    def client(self, **kwargs: Any) -> Any:
        """The grader's client: from a sandboxed kernel, a message larger than
        MAX_MESSAGE_BYTES is dropped by zmq, never read into the grader's memory (the cell
        then times out, with its message)."""
        kc = super().client(**kwargs)
        if self.sandbox is not None:
            kc.context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        return kc

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart)
        self.close_sandbox()

    cleanup_resources = _async_cleanup_resources  # AsyncKernelManager's name for it

    def close_sandbox(self) -> None:
        """Kill everything the kernel left in its sandbox and remove the sandbox."""
        if self.sandbox is not None:
            self.sandbox.close()
            self.sandbox = None


def kernel_manager(*, warm: bool, limits: Limits | None) -> type[GradingKernelManager]:
    """The manager class nbclient should instantiate for these choices."""
    return type("GradingKernelManager", (GradingKernelManager,),
                {"warm": warm, "limits": limits})
