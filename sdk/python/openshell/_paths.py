"""Where the local gateway's socket is, resolved exactly as openshell does
(src/base/paths.cc; docs/api.md, "Transport"), and the checks the command
line makes before it talks to it."""

from __future__ import annotations

import os
import stat
from typing import Mapping, Optional, Tuple

# The longest run directory whose sockets all fit a Unix socket address
# (kMaxRunDirLength in src/base/paths.h).
MAX_RUN_DIR_LENGTH = 67


def _env(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "") or ""


def resolve(environ: Optional[Mapping[str, str]] = None,
            euid: Optional[int] = None) -> Tuple[str, str]:
    """(STATE_DIR, RUN_DIR) from the environment: OPENSHELL_HOME when set
    (an absolute path), else root's /var/lib/openshell and /run/openshell,
    else $XDG_STATE_HOME/openshell (~/.local/state/openshell) and
    $XDG_RUNTIME_DIR/openshell, else STATE_DIR/run, else /tmp/openshell-UID
    when STATE_DIR/run would be too long for a socket's address."""
    from .errors import OpenShellError

    environ = os.environ if environ is None else environ
    euid = os.geteuid() if euid is None else euid
    home = _env(environ, "OPENSHELL_HOME")
    if home:
        if not home.startswith("/"):
            raise OpenShellError("OPENSHELL_HOME %s: must be an absolute path" % home,
                                 code="config")
        while len(home) > 1 and home.endswith("/"):
            home = home[:-1]
        return home, home + "/run"
    if euid == 0:
        return "/var/lib/openshell", "/run/openshell"
    state = _env(environ, "XDG_STATE_HOME")
    if not state:
        user_home = _env(environ, "HOME")
        if not user_home:
            raise OpenShellError("neither OPENSHELL_HOME, XDG_STATE_HOME nor HOME is set",
                                 code="config")
        state = user_home + "/.local/state"
    state_dir = state + "/openshell"
    runtime = _env(environ, "XDG_RUNTIME_DIR")
    if runtime:
        run_dir = runtime + "/openshell"
    elif len(state_dir) + 4 <= MAX_RUN_DIR_LENGTH:
        run_dir = state_dir + "/run"
    else:
        run_dir = "/tmp/openshell-%d" % euid
    return state_dir, run_dir


def socket_path(environ: Optional[Mapping[str, str]] = None) -> str:
    """RUN_DIR/gateway.sock."""
    return resolve(environ)[1] + "/gateway.sock"


def _not_yours(path: str, st: os.stat_result, remove: str) -> str:
    euid = os.geteuid()
    out = "%s belongs to uid %d, not you (uid %d); remove it (as root: %s %s)" % (
        path, st.st_uid, euid, remove, path)
    if path.startswith("/tmp/openshell-%d" % euid):
        out += " or set XDG_RUNTIME_DIR"
    return out


def private_dir_problem(path: str) -> str:
    """What is wrong with a run directory that should be ours and private:
    "" when nothing is, or when it does not exist."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as e:
        return "stat %s: %s" % (path, e.strerror)
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a file"
        return "%s is not a directory (%s); remove it (rm %s)" % (path, kind, path)
    if st.st_uid != os.geteuid():
        return _not_yours(path, st, "rm -rf")
    if st.st_mode & 0o027:
        return "%s has mode %04o, not 0700; make it private (chmod 700 %s)" % (
            path, stat.S_IMODE(st.st_mode), path)
    return ""


def private_socket_problem(path: str) -> str:
    """The same for the gateway's socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    except OSError as e:
        return "stat %s: %s" % (path, e.strerror)
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a file"
        return "%s is not a socket (%s); remove it (rm %s)" % (path, kind, path)
    if st.st_uid != os.geteuid():
        return _not_yours(path, st, "rm -f")
    if st.st_mode & 0o007:
        return ("%s has mode %04o, not 0600; whatever listens there is not your gateway: stop it "
                "and remove the socket (rm %s)" % (path, stat.S_IMODE(st.st_mode), path))
    return ""
