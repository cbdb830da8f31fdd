"""A one-machine SLURM cluster for the tests: munged, slurmctld and slurmd on localhost.

    python tests/slurm/local_cluster.py        # start one by hand; prints its SLURM_CONF, stops on Enter

Everything lives under one directory (slurm.conf, the munge key and socket, state, spool,
logs); the clients find it through ``SLURM_CONF``, so nothing under /etc is touched and a
real cluster's configuration on the same machine is left alone. The three daemons run in
the foreground as children of this process (on free ports), so stopping them means
stopping those process ids; they also die with this process. The node is this machine
with its real CPU count (``slurmd -C``), consumable CPUs (``select/cons_tres``, ``CR_CPU``),
processes tracked by process group (no cgroups, no systemd).

Needs root (slurmd starts the jobs) and Debian's ``slurm-wlm`` and ``munge``, installed with
apt-get when missing only if ``ALIGN_INSTALL_SLURM=1`` (else the SLURM tests skip, saying so).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Self

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")


class ClusterUnavailable(RuntimeError):
    """This machine cannot run the cluster (not root, no packages, a daemon that will not start)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _with_parent(command: list[str]) -> list[str]:
    """The command, made to get SIGTERM when the process that started it dies (setpriv's pdeathsig)."""
    return ["setpriv", "--pdeathsig", "TERM", *command] if shutil.which("setpriv") else command


INSTALL_ENV = "ALIGN_INSTALL_SLURM"


def ensure_packages(timeout_s: float = 600) -> None:
    """Install slurm-wlm and munge with apt-get where a daemon is missing: only when asked
    (ALIGN_INSTALL_SLURM=1) and as root; a test run never changes the machine unasked."""
    if all(shutil.which(d) for d in DAEMONS):
        return
    if os.environ.get(INSTALL_ENV) != "1":
        raise ClusterUnavailable(f"slurm-wlm and munge are not installed; set {INSTALL_ENV}=1 to let the tests "
                                 "install them with apt-get (as root), or install them yourself")
    if os.geteuid() != 0:
        raise ClusterUnavailable("slurm-wlm and munge are not installed, and installing them needs root")
    if shutil.which("apt-get") is None:
        raise ClusterUnavailable("slurm-wlm and munge are not installed, and there is no apt-get here")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES]):
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
        if done.returncode != 0:
            raise ClusterUnavailable(f"{' '.join(command)} failed: {done.stderr.strip()[-500:]}")
    missing = [d for d in DAEMONS if not shutil.which(d)]
    if missing:
        raise ClusterUnavailable(f"{missing} still missing after installing {PACKAGES}")


def node_line() -> str:
    """This machine as a slurm.conf node (``slurmd -C``: CPUs, sockets, cores, memory), named localhost."""
    done = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=60, check=False)
    line = next((l for l in done.stdout.splitlines() if l.startswith("NodeName=")), None)
    if done.returncode != 0 or line is None:
        raise ClusterUnavailable(f"slurmd -C failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return re.sub(r"^NodeName=\S+", "NodeName=localhost NodeHostname=localhost", line) + " State=UNKNOWN"


class LocalCluster:
    """The cluster under ``root``: ``start()``, then the clients with ``env``; ``stop()`` always."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge" / "munge.socket"
        self.processes: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict[str, str]:
        """What the SLURM clients (and the jobs, through --export=ALL) need to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        r = self.root
        self.conf.write_text("\n".join([
            "ClusterName=align-tests",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "SchedulerParameters=batch_sched_delay=0",  # a dependent job starts ~1 s after, not ~3 s
            "ReturnToService=2",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MailProg=/bin/true",
            "KillWait=5",
            "MinJobAge=3600",  # finished jobs stay visible to scontrol (there is no accounting)
            node_line(),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            # a partition whose jobs may ask for a day at most (align submit compares each job's time with it)
            "PartitionName=short Nodes=ALL Default=NO MaxTime=1-00:00:00 State=UP",
        ]) + "\n")

    def _spawn(self, name: str, command: list[str]) -> None:
        log = (self.root / "log" / f"{name}.out").open("w")
        self.processes[name] = subprocess.Popen(_with_parent(command), stdout=log, stderr=subprocess.STDOUT,
                                                env={**os.environ, **self.env})
        log.close()

    def _wait(self, what: str, ready, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise ClusterUnavailable(f"{name} exited {proc.returncode} while waiting for {what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise ClusterUnavailable(f"no {what} after {timeout_s:.0f} s:\n{self.logs()}")

    def node_state(self) -> str:
        done = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True,
                              env={**os.environ, **self.env}, timeout=30, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    def start(self, timeout_s: float = 60) -> None:
        """Install what is missing, write the config, start the daemons, wait for the node to be idle."""
        if os.geteuid() != 0:
            raise ClusterUnavailable("a local SLURM cluster needs root (slurmd starts the jobs)")
        ensure_packages()
        self.write_config()
        m = self.root / "munge"
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.socket}",
                               f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                               f"--seed-file={m / 'munged.seed'}", f"--log-file={self.root / 'log' / 'munged.log'}"])
        self._wait("munge socket", self.socket.exists, timeout_s)
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        self._wait("idle node", lambda: self.node_state() == "idle", timeout_s)

    def stop(self, timeout_s: float = 30) -> None:
        """Cancel every job of this cluster, then stop the daemons by their process ids."""
        env = {**os.environ, **self.env}
        if "slurmctld" in self.processes and self.processes["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--user=root"], env=env, capture_output=True, timeout=30, check=False)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                done = subprocess.run(["squeue", "--noheader"], env=env, capture_output=True, text=True,
                                      timeout=30, check=False)
                if done.returncode != 0 or not done.stdout.strip():
                    break
                time.sleep(0.5)
        for name in reversed(DAEMONS):
            proc = self.processes.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def logs(self, chars: int = 3000) -> str:
        """The tail of each daemon's log, for an error message."""
        out = []
        for path in sorted((self.root / "log").glob("*")):
            out.append(f"--- {path.name}:\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(out)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="align-slurm-"))
    with LocalCluster(directory) as cluster:
        print(f"export SLURM_CONF={cluster.conf}")
        input("cluster up; Enter stops it ")
    shutil.rmtree(directory, ignore_errors=True)
