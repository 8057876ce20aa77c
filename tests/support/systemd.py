"""A real systemd as PID 1 of private namespaces, for testing receivewal@.service under it.

How (see ../shared/spec/systemd-in-namespace.md for the facts this is built from): a cgroup2
sub-tree of the host's (empty) unified hierarchy holds the launcher; ``unshare`` gives it new
cgroup, pid, mount, uts, ipc and net namespaces (so its own loopback); inside, PID 1 mounts a
tmpfs with an overlay of the host's ``/`` on it (nothing of the host is written), fresh proc,
sys, cgroup2, a small /dev and /run, pivots into it and execs systemd with a minimal target.
Everything is bounded by ``timeout`` and torn down by PID (kill -9 of the namespace's PID 1
ends every process in it).

Host paths on the root file system (e.g. a test's /tmp directories) are visible inside through
the overlay; writes to them inside land in the overlay only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

# The cgroup2 hierarchy: the (empty) unified one beside cgroup v1's controllers, or the only one.
UNIFIED = next((path for path in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
                if (path / "cgroup.procs").exists() and (path / "cgroup.max.depth").exists()),
               Path("/sys/fs/cgroup/unified"))
SYSTEMD = Path("/lib/systemd/systemd")
TARGET = "receivewal-test.target"

# Units that would touch the host's kernel settings or only make noise in a container.
MASKED = [
    "systemd-sysctl.service", "systemd-binfmt.service", "proc-sys-fs-binfmt_misc.automount",
    "systemd-modules-load.service", "systemd-timesyncd.service", "systemd-random-seed.service",
    "systemd-pstore.service", "systemd-tmpfiles-setup.service", "systemd-remount-fs.service",
    "systemd-journald-audit.socket", "getty.target", "console-getty.service",
    "apt-daily.timer", "apt-daily-upgrade.timer", "fstrim.timer", "man-db.timer",
    "e2scrub_all.timer", "systemd-hwdb-update.service", "systemd-sysusers.service",
    "ldconfig.service", "systemd-firstboot.service", "systemd-update-utmp.service",
]

INNER = r"""#!/bin/bash
# PID 1 of the new namespaces: build the overlay root, pivot into it, exec systemd.
set -euo pipefail
mnt=$1
mount --make-rprivate /
mount -t tmpfs -o mode=0755,size=1g tmpfs "$mnt"
mkdir "$mnt/upper" "$mnt/work" "$mnt/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$mnt/upper,workdir=$mnt/work" "$mnt/root"
r=$mnt/root
mount -t proc proc "$r/proc"
mount --bind "$r/proc/sys" "$r/proc/sys"
mount -o remount,bind,ro "$r/proc/sys"
mount -t sysfs -o ro sysfs "$r/sys"
mount -t cgroup2 cgroup2 "$r/sys/fs/cgroup"
mount -t tmpfs -o mode=0755,size=16m tmpfs "$r/dev"
for dev in null zero full random urandom tty; do
  touch "$r/dev/$dev"
  mount --bind "/dev/$dev" "$r/dev/$dev"
done
mkdir "$r/dev/pts" "$r/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$r/dev/pts"
ln -s pts/ptmx "$r/dev/ptmx"
mount -t tmpfs -o mode=1777 tmpfs "$r/dev/shm"
mount -t tmpfs -o mode=0755 tmpfs "$r/run"
mkdir -p "$r/.oldroot"
cd "$r"
pivot_root . .oldroot
cd /
umount -l /.oldroot
rmdir /.oldroot
mkdir -p /etc/systemd/system
cat > /etc/systemd/system/@TARGET@ <<EOF
[Unit]
Description=receivewal test system
Requires=basic.target
After=basic.target
EOF
for unit in @MASKED@; do ln -sf /dev/null "/etc/systemd/system/$unit"; done
echo receivewal-test > /etc/hostname
exec env -i container=receivewal-test \
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  @SYSTEMD@ --system --unit=@TARGET@
"""


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections of a unit file; a key may repeat, so each maps to the list of its values."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def unavailable() -> str | None:
    """Why a namespaced systemd cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "running systemd in namespaces needs root"
    if not SYSTEMD.exists():
        return f"{SYSTEMD} is missing (apt-get install systemd)"
    for tool in ("unshare", "nsenter", "timeout"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (util-linux, coreutils)"
    if not (UNIFIED / "cgroup.procs").exists():
        return f"no cgroup2 hierarchy at {UNIFIED}"
    if not Path("/proc/self/ns/cgroup").exists():
        return "the kernel has no cgroup namespaces"
    return None


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(child) for child in text.split()]


class NamespacedSystemd:
    """One booted systemd in its own namespaces; :meth:`run` runs a command inside."""

    def __init__(self, work: Path, limit: int) -> None:
        self.work = work
        self.name = work.name
        self.cgroup = UNIFIED / self.name
        self.log = work / "launcher.log"
        self.limit = limit
        self.launcher: subprocess.Popen[bytes] | None = None
        self.pid1 = 0

    def start(self, timeout: float = 120) -> None:
        """Launch and wait until the system is up (running or degraded)."""
        inner = self.work / "inner.sh"
        inner.write_text(INNER.replace("@TARGET@", TARGET).replace("@MASKED@", " ".join(MASKED))
                         .replace("@SYSTEMD@", str(SYSTEMD)))
        inner.chmod(0o755)
        (self.work / "mnt").mkdir()
        self.cgroup.mkdir()
        launch = (f'echo $$ > {self.cgroup}/cgroup.procs && exec timeout -k 10 {self.limit} '
                  "unshare --cgroup --pid --fork --mount --uts --ipc --net "
                  f"--propagation private --kill-child=SIGKILL {inner} {self.work / 'mnt'}")
        with self.log.open("wb") as log:
            self.launcher = subprocess.Popen(["sh", "-c", launch], stdout=log, stderr=log,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        self.pid1 = self._find_pid1(deadline)
        while True:
            state = self.run("systemctl", "is-system-running", "--wait", check=False,
                             timeout=max(1.0, deadline - time.monotonic()))
            if state.stdout.strip() in ("running", "degraded"):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"systemd did not come up: {state.stdout}{state.stderr}; "
                                   f"{self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def _find_pid1(self, deadline: float) -> int:
        assert self.launcher is not None
        while time.monotonic() < deadline:
            if self.launcher.poll() is not None:
                raise RuntimeError(f"the namespace launcher exited {self.launcher.returncode}:"
                                   f" {self.log.read_text()[-2000:]}")
            for unshare in _children(self.launcher.pid):
                for pid in _children(unshare):
                    with contextlib.suppress(FileNotFoundError):
                        if os.readlink(f"/proc/{pid}/exe") == os.path.realpath(SYSTEMD):
                            return pid
            time.sleep(0.05)
        raise TimeoutError(f"systemd did not start: {self.log.read_text()[-2000:]}")

    def run(self, *argv: str, check: bool = True, timeout: float = 60,
            ) -> subprocess.CompletedProcess[str]:
        """Run a command in the namespaces (and root) of systemd."""
        done = subprocess.run(["nsenter", "-t", str(self.pid1), "-a", *argv],
                              capture_output=True, text=True, check=False, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: "
                                 f"{done.stdout}{done.stderr}")
        return done

    def write(self, path: str, text: str) -> None:
        """Write a file inside (through the namespace's root)."""
        self.run("sh", "-c", f'mkdir -p "$(dirname "$1")" && cat > "$1" <<"EOF"\n{text}EOF\n',
                 "sh", path)

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        """``systemctl show`` properties of a unit."""
        out = self.run("systemctl", "show", unit, *(f"--property={p}" for p in properties))
        return dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)

    def stop(self) -> None:
        """Kill PID 1 (and so every process of the namespace), remove the cgroups."""
        if self.pid1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid1, 9)
        if self.launcher is not None:
            try:
                self.launcher.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.launcher.pid, 9)
                self.launcher.wait(timeout=30)
        deadline = time.monotonic() + 10
        while self.cgroup.exists():
            for path in sorted(self.cgroup.rglob("*"), key=lambda p: -len(p.parts)):
                if path.is_dir():
                    with contextlib.suppress(OSError):
                        path.rmdir()
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not remove {self.cgroup}")
            time.sleep(0.1)


@contextlib.contextmanager
def namespaced_systemd(limit: int = 600) -> Iterator[NamespacedSystemd]:
    """A booted systemd in fresh namespaces, killed afterwards (``limit``: seconds at most)."""
    work = Path(tempfile.mkdtemp(prefix="receivewal-systemd-"))
    system = NamespacedSystemd(work, limit)
    try:
        system.start()
        yield system
    finally:
        system.stop()
        shutil.rmtree(work, ignore_errors=True)
