"""A real gateway for the SDK's tests: one per test session, in a state
directory of its own (OPENSHELL_HOME in a temporary directory), serving its
Unix socket and TLS on 127.0.0.1 (a port the kernel picks), with a busybox
root made by rootfs-tools/build-busybox-rootfs for the sandboxes (`--from
DIR`). At the end every sandbox is deleted, the gateway stopped, and no
process of that state directory may be left (one that is, is killed and the
session fails).

The binary is $OPENSHELL_BIN (default build/openshell of the repository);
the root's script $OSH_ROOTFS_SCRIPT. Without the binary the tests that need
the gateway skip, saying so.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

import openshell

REPO = Path(__file__).resolve().parents[3]


def _path_from_env(name: str, default: Path) -> Path:
    value = os.environ.get(name)
    return Path(value) if value else default


class Gateway:
    """The session's gateway: its binary, state directory, root, and the
    environment its commands run with."""

    def __init__(self, binary: Path, scratch: Path) -> None:
        self.binary = binary
        self.scratch = scratch
        self.home = scratch / "home"
        self.config = scratch / "config"  # the user's gateway registry
        self.system_config = scratch / "etc"  # an empty system registry
        self.rootfs = scratch / "rootfs"
        self.proc: Optional[subprocess.Popen] = None
        self.tls_address = ""

    @property
    def env(self) -> Dict[str, str]:
        env = dict(os.environ)
        env.update(OPENSHELL_HOME=str(self.home), XDG_CONFIG_HOME=str(self.config),
                   OPENSHELL_SYSTEM_CONFIG_DIR=str(self.system_config))
        env.pop("OPENSHELL_GATEWAY", None)
        return env

    def cli(self, *args: str, check: bool = True, timeout: float = 120,
            env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """`openshell ARGS` against this gateway."""
        r = subprocess.run([str(self.binary), *args], env=env or self.env, capture_output=True,
                           timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError("openshell %s: status %d: %s" %
                                 (" ".join(args), r.returncode, r.stderr.decode(errors="replace")))
        return r

    def processes(self) -> List[str]:
        """The processes of this state directory ("PID: COMMAND")."""
        marker = ("OPENSHELL_HOME=%s" % self.home).encode() + b"\0"
        out = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open("/proc/%s/environ" % pid, "rb") as f:
                    environ = f.read()
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in environ or environ.startswith(marker):
                out.append("%s: %s" % (pid, cmdline.strip()))
        return out


def _as_mapped_root(argv: List[str]) -> List[str]:
    # An ordinary user makes the root in a user namespace with its
    # subordinate ids (its /sandbox belongs to uid 1000 inside).
    return argv if os.geteuid() == 0 else ["unshare", "--map-root-user", "--map-auto", *argv]


@pytest.fixture(scope="session")
def gateway() -> Iterator[Gateway]:
    binary = _path_from_env("OPENSHELL_BIN", REPO / "build" / "openshell").resolve()
    if not os.access(str(binary), os.X_OK):
        pytest.skip("no openshell binary at %s (build it, or set OPENSHELL_BIN)" % binary)
    script = _path_from_env("OSH_ROOTFS_SCRIPT", REPO / "rootfs-tools" / "build-busybox-rootfs")
    # Short: the sockets under OPENSHELL_HOME/run must fit a socket address.
    scratch = Path(tempfile.mkdtemp(prefix="osh-sdk-", dir="/tmp"))
    os.chmod(str(scratch), 0o755)  # the sandboxes' users read the root below it
    g = Gateway(binary, scratch)
    saved = {k: os.environ.get(k) for k in ("OPENSHELL_HOME", "XDG_CONFIG_HOME",
                                            "OPENSHELL_SYSTEM_CONFIG_DIR", "OPENSHELL_GATEWAY")}
    try:
        for d in (g.home, g.config, g.system_config):
            d.mkdir(mode=0o700)
        r = subprocess.run(_as_mapped_root([str(script), str(g.rootfs)]), capture_output=True)
        if r.returncode != 0:
            raise AssertionError("%s failed: %s" % (script, r.stderr.decode(errors="replace")))
        g.cli("gateway", "generate-certs")
        (g.home / "gateway.toml").write_text('[api]\nlisten = ["127.0.0.1:0"]\n')
        log = open(str(g.home / "gateway-run.log"), "wb")
        g.proc = subprocess.Popen([str(binary), "gateway", "run"], env=g.env, stdout=log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
        log.close()
        for k in saved:
            os.environ.pop(k, None)
        os.environ.update(OPENSHELL_HOME=str(g.home), XDG_CONFIG_HOME=str(g.config),
                          OPENSHELL_SYSTEM_CONFIG_DIR=str(g.system_config))
        deadline = time.monotonic() + 30
        while True:
            if g.proc.poll() is not None:
                raise AssertionError("the gateway exited with status %s: %s" %
                                     (g.proc.returncode,
                                      (g.home / "gateway-run.log").read_text(errors="replace")))
            try:
                with openshell.Client() as c:
                    info = c.gateway_info()
                break
            except openshell.ConnectionFailed:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        g.tls_address = next((listener["address"] for listener in info.get("listeners", [])
                              if listener.get("kind") == "tls"), "")
        yield g
    finally:
        _stop(g)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _stop(g: Gateway) -> None:
    left: List[str] = []
    if g.proc is not None:
        if g.proc.poll() is None:
            g.cli("sandbox", "delete", "--all", check=False)
            g.cli("gateway", "stop", check=False, timeout=60)
            try:
                g.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                g.proc.kill()
                g.proc.wait()
        deadline = time.monotonic() + 30
        while g.processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        left = g.processes()
        for entry in left:
            try:
                os.kill(int(entry.split(":")[0]), 9)
            except OSError:
                pass
    if os.geteuid() == 0:
        shutil.rmtree(str(g.scratch), ignore_errors=True)
    else:
        subprocess.run(_as_mapped_root(["rm", "-rf", str(g.scratch)]), check=False)
    assert left == [], "processes of the test gateway left (killed now): %s" % left


@pytest.fixture(scope="session")
def client(gateway: Gateway) -> Iterator[openshell.Client]:
    with openshell.Client() as c:
        yield c


_names = itertools.count(1)


@pytest.fixture
def new_name() -> "NameMaker":
    return NameMaker()


class NameMaker:
    """Unique sandbox names for one test; what the test made of them is
    deleted after it (see the `made` fixture)."""

    def __call__(self, prefix: str = "t") -> str:
        return "%s-%d-%d" % (prefix, os.getpid() % 10000, next(_names))


@pytest.fixture
def made(client: openshell.Client) -> Iterator[List[str]]:
    """Names to delete after the test (whatever their phase)."""
    names: List[str] = []
    yield names
    for name in names:
        try:
            client.delete(name)
        except openshell.NotFound:
            pass


@pytest.fixture
def sandbox(client: openshell.Client, gateway: Gateway, made: List[str]) -> str:
    """An idle Ready sandbox on the busybox root; its name."""
    name = NameMaker()("box")
    made.append(name)
    box = client.create(name, from_=str(gateway.rootfs))
    assert box.phase == "Ready", box
    return name
