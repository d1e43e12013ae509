"""A real, private, single-node Slurm cluster for the tests (recipe: shared/notes/slurm-facts.md).

- `ensure_installed()`: `slurm-wlm` and `munge` from Debian packages (`apt-get install`, as root),
  unless their commands are already there; returns None, or why they cannot be had (tests then
  skip with that reason). `.ci/run` calls it up front: `python tests/support/slurm_cluster.py install`.
- `Cluster(folder).start()`: its own munged (own key and socket), slurmctld and slurmd with their
  own slurm.conf, ports, spool, state and pid files under `folder`, so that test sessions running
  at the same time (or a cluster the machine already has) do not meet. Clients reach it through
  `cluster.env` (SLURM_CONF). `stop()` cancels what is left of its jobs and stops the three daemons
  by the pids in their pid files (SIGTERM, then SIGKILL), and nothing else.

Slurm 22.05 checks job time limits every 30 s, so a job over a 1-minute limit ends TIMEOUT
60-90 s after it started; accounting is off (`sacct` answers nothing), which runbook does not need.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "slurmctld", "slurmd", "munged")


def missing() -> list[str]:
    return [c for c in COMMANDS if shutil.which(c) is None and not Path("/usr/sbin", c).exists()]


def ensure_installed() -> str | None:
    """None when Slurm and munge are installed (installing them if we can); else why not."""
    if not missing():
        return None
    if os.geteuid() != 0:
        return f"Slurm is not installed ({', '.join(missing())} missing) and installing it needs root"
    if shutil.which("apt-get") is None:
        return f"Slurm is not installed ({', '.join(missing())} missing) and there is no apt-get to install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm", "munge"]
    said = ""
    for attempt in (install, ["apt-get", "update", "-q"], install):
        try:
            proc = subprocess.run(attempt, capture_output=True, text=True, env=env, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            said = str(exc)
            continue
        said = (proc.stderr or proc.stdout)[-500:]
        if attempt is install and proc.returncode == 0 and not missing():
            return None
    return f"could not install slurm-wlm and munge with apt-get: {said.strip()}"


def _sbin(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


class Cluster:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.conf = self.folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.host = socket.gethostname().split(".")[0]

    def pidfile(self, daemon: str) -> Path:
        return self.folder / f"{daemon}.pid"

    def start(self, timeout_s: float = 60.0) -> Cluster:
        f = self.folder
        for sub in ("munge", "spool", "state", "log"):
            (f / sub).mkdir(parents=True, exist_ok=True)
        key = f / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = f / "munge" / "munge.socket"
        self._run([_sbin("munged"), "--force", f"--socket={sock}", f"--key-file={key}",
                   f"--log-file={f / 'log' / 'munged.log'}", f"--pid-file={self.pidfile('munged')}",
                   f"--seed-file={f / 'munge' / 'seed'}"])
        ctld_port, d_port = _free_ports(2)
        self.conf.write_text("\n".join([
            "ClusterName=runbooktest",
            f"SlurmctldHost={self.host}",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={d_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={sock}",
            f"StateSaveLocation={f / 'state'}",
            f"SlurmdSpoolDir={f / 'spool'}",
            f"SlurmctldPidFile={self.pidfile('slurmctld')}",
            f"SlurmdPidFile={self.pidfile('slurmd')}",
            f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={f / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none",
            "KillWait=2",
            "MinJobAge=300",
            f"NodeName={self.host} CPUs={os.cpu_count() or 1} RealMemory=1000 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))
        self._run([_sbin("slurmctld")])
        self._run([_sbin("slurmd")])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=self.env)
            if out.returncode == 0 and out.stdout.split() and out.stdout.split()[0].startswith("idle"):
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the test Slurm cluster in {f} did not come up within {timeout_s:g}s; "
                           f"see {f / 'log'}")

    def _run(self, argv: list[str]) -> None:
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=60,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            self.stop()
            raise RuntimeError(f"{' '.join(argv)} failed: {(proc.stderr or proc.stdout)[-500:]}")

    def squeue(self) -> list[str]:
        """The ids of the jobs squeue lists."""
        out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=self.env)
        return out.stdout.split()

    def stop(self) -> None:
        if self.pidfile("slurmctld").exists():
            subprocess.run(["scancel", "--full", "-u", "root"], capture_output=True, env=self.env, timeout=30)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.squeue():
                time.sleep(0.2)
        for daemon in ("slurmd", "slurmctld", "munged"):
            self._stop_daemon(daemon)

    def _stop_daemon(self, daemon: str) -> None:
        path = self.pidfile(daemon)
        try:
            pid = int(path.read_text().strip())
        except (OSError, ValueError):
            return
        if daemon.encode() not in _cmdline(pid):
            return  # gone, or the pid now names another process: not ours to signal
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and daemon.encode() in _cmdline(pid):
            time.sleep(0.1)
        if daemon.encode() in _cmdline(pid):
            os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":  # python tests/support/slurm_cluster.py install
    if sys.argv[1:] == ["install"]:
        why = ensure_installed()
        print("slurm: installed" if why is None else f"slurm: not available ({why}); the Slurm tests will skip")
        sys.exit(0)
    print("usage: python tests/support/slurm_cluster.py install", file=sys.stderr)
    sys.exit(2)
