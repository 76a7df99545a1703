"""Files in and out of a sandbox: a tar stream through exec with
``?copy=1`` (what ``openshell sandbox upload`` and ``download`` do; see
src/cli/copy.cc), made and unpacked here with the tarfile module. The
sandbox needs a tar (busybox's or GNU's).

What a download brings is untrusted: it is unpacked into a directory of our
own beside the destination (nothing outside it, through no symbolic link,
no device nodes, no set-uid bits, owned by the caller, under the caller's
umask, within 90% of the free space there) and moved into place only when
complete."""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from .errors import ConnectionFailed, CopyError, ExecError, OpenShellError

if TYPE_CHECKING:
    from ._exec import ExecStream

_CHUNK = 65536
_SIGKILL = 9


@dataclass(frozen=True)
class UploadStats:
    """What an upload's archive held."""

    files: int
    directories: int
    links: int
    bytes: int


def _base_name(path: str) -> str:
    path = path.rstrip("/") or "/"
    return path.rsplit("/", 1)[-1]


def _parent_of(path: str) -> str:
    path = path.rstrip("/") or "/"
    if "/" not in path:
        return "."
    parent = path.rsplit("/", 1)[0]
    return parent or "/"


def tar_failure(errors: bytes, prefix: str, directory: str, status: int) -> str:
    """One line from what tar in the sandbox wrote (its first complaint),
    naming the path it complained about: "upload to /usr/x: Permission
    denied" (as cli::tar_failure does)."""
    line = ""
    for candidate in errors.decode("utf-8", "replace").split("\n"):
        if candidate.strip():
            line = candidate.strip()
            break
    if not line:
        return "%s%s: tar in the sandbox ended with status %d" % (prefix, directory, status)
    if line.startswith("tar: "):
        line = line[5:]
    colon = line.rfind(": ")
    if colon < 0:
        return "%s%s: %s" % (prefix, directory, line)
    reason = line[colon + 2:]
    # busybox quotes the path ('x'), GNU puts it first (x: Cannot ...),
    # busybox's "can't make dir x" has it last.
    if colon >= 2 and line[colon - 1] == "'" and line.rfind("'", 0, colon - 1) >= 0:
        open_quote = line.rfind("'", 0, colon - 1)
        path = line[open_quote + 1:colon - 1]
    elif line.find(": ") != colon:
        path = line[:line.find(": ")]
    elif line.rfind(" ", 0, colon) >= 0:
        space = line.rfind(" ", 0, colon)
        path = line[space + 1:colon]
    else:
        path = line[:colon]
    while path.startswith("./"):
        path = path[2:]
    where = directory
    if path.startswith("/"):
        where = path
    elif path:
        where = ("" if directory == "/" else directory) + "/" + path
    return "%s%s: %s" % (prefix, where, reason)


class _Sender:
    """A file for tarfile's stream mode: what it writes goes to the
    command's stdin in chunks."""

    def __init__(self, stream: "ExecStream") -> None:
        self._stream = stream
        self._buf = bytearray()
        # After a failure nothing more goes out: an unfinished archive must
        # not end as if whole (no end blocks).
        self.aborted = False

    def write(self, data: bytes) -> int:
        if self.aborted:
            return len(data)
        self._buf += data
        if len(self._buf) >= _CHUNK:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self._buf and not self.aborted:
            self._stream.send(bytes(self._buf))
            self._buf = bytearray()


def _tar_info(path: str, name: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    # Without set-uid, set-gid and sticky bits, owned by 0: tar in the
    # sandbox, unprivileged, makes it its user's.
    info.mode = st.st_mode & 0o777
    info.mtime = max(int(st.st_mtime), 0)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if stat.S_ISREG(st.st_mode):
        info.type = tarfile.REGTYPE
        info.size = st.st_size
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
    else:
        raise CopyError("upload: %s: not a file, directory or symbolic link" % path)
    return info


def write_tar(local: str, out: _Sender, exclude: Optional[Callable[[str], bool]]) -> UploadStats:
    """The archive of `local` under its base name (GNU format)."""
    top = _base_name(os.path.normpath(os.path.abspath(local)))
    if top in ("", "/", ".", ".."):
        raise CopyError("upload: %s: name a file or directory below /" % local)
    counts = {"files": 0, "directories": 0, "links": 0, "bytes": 0}
    tar = tarfile.open(fileobj=out, mode="w|", format=tarfile.GNU_FORMAT)  # type: ignore
    try:

        def add(path: str, name: str) -> bool:
            try:
                st = os.lstat(path)
            except OSError as e:
                raise CopyError("upload: %s: %s" % (path, e.strerror)) from None
            info = _tar_info(path, name, st)
            if info.isreg():
                # Opened before its header: what cannot be read is not announced.
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
                except OSError as e:
                    raise CopyError("upload: %s: %s" % (path, e.strerror)) from None
                with os.fdopen(fd, "rb") as f:
                    try:
                        tar.addfile(info, f)
                    except OSError as e:
                        if isinstance(e, (ConnectionFailed, BrokenPipeError)):
                            raise
                        raise CopyError("upload: %s: %s" % (path, e.strerror or e)) from None
                counts["files"] += 1
                counts["bytes"] += info.size
            else:
                tar.addfile(info)
                counts["directories" if info.isdir() else "links"] += 1
            return info.isdir()

        def walk(path: str, rel: str) -> None:
            try:
                entries = sorted(os.listdir(path))
            except OSError as e:
                raise CopyError("upload: %s: %s" % (path, e.strerror)) from None
            for entry in entries:
                child, child_rel = os.path.join(path, entry), rel + "/" + entry if rel else entry
                if exclude is not None and exclude(child_rel):
                    continue
                if add(child, top + "/" + child_rel):
                    walk(child, child_rel)

        if add(local, top):
            walk(local, "")
    except BaseException:
        out.aborted = True
        tar.close()
        raise
    tar.close()
    out.flush()
    return UploadStats(counts["files"], counts["directories"], counts["links"], counts["bytes"])


def upload(open_exec: Callable[..., "ExecStream"], local: str, dest: str,
           exclude: Optional[Callable[[str], bool]] = None) -> UploadStats:
    try:
        st = os.lstat(local)
    except OSError as e:
        raise CopyError("upload: %s: %s" % (local, e.strerror)) from None
    del st
    if not dest.startswith("/"):
        raise CopyError("upload: the destination must be an absolute path in the sandbox")
    stream = open_exec(["tar", "-x", "-f", "-", "-C", dest])
    write_error: List[OpenShellError] = []
    stats: List[UploadStats] = []
    stopped_reading = threading.Event()

    def fail(error: OpenShellError) -> None:
        if stream.finished:
            stopped_reading.set()  # tar there quit first: its status says why
            return
        write_error.append(error)
        try:
            stream.signal(_SIGKILL)  # nothing half-written is kept going
        except OpenShellError:
            pass

    def writer() -> None:
        try:
            stats.append(write_tar(local, _Sender(stream), exclude))
            stream.close_stdin()
        except ConnectionFailed:
            stopped_reading.set()
        except OpenShellError as e:
            fail(e)
        except Exception as e:  # noqa: BLE001 - any failure here is the upload's
            fail(CopyError("upload: write the archive: %s" % e))

    thread = threading.Thread(target=writer, name="openshell-upload", daemon=True)
    thread.start()
    errors = bytearray()
    status: Optional[int] = None
    try:
        with stream:
            for chunk in stream:
                if chunk.stream == "stderr":
                    errors += chunk.data
            status = stream.exit_code
    except ExecError:
        raise
    except OpenShellError:
        if not write_error:
            raise
    finally:
        thread.join()
    if write_error:
        raise write_error[0]
    if status == 127:
        raise CopyError("upload: the sandbox has no tar, which it needs")
    if status != 0:
        raise CopyError(tar_failure(bytes(errors), "upload to ", dest, status or 0))
    if stopped_reading.is_set() or not stats:
        raise CopyError("upload: the sandbox stopped reading")
    return stats[0]


class _Receiver:
    """A file for tarfile's stream mode, read from the command's stdout;
    its stderr is kept aside."""

    def __init__(self, stream: "ExecStream") -> None:
        self._chunks = iter(stream)
        self._buf = bytearray()
        self.errors = bytearray()
        self.ended = False

    def read(self, n: int = -1) -> bytes:
        while not self.ended and (n < 0 or len(self._buf) < n):
            try:
                chunk = next(self._chunks)
            except StopIteration:
                self.ended = True
                break
            if chunk.stream == "stderr":
                self.errors += chunk.data
            else:
                self._buf += chunk.data
        if n < 0:
            n = len(self._buf)
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def drain(self) -> None:
        while not self.ended:
            self._buf.clear()
            self.read(_CHUNK)


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _Unpacker:
    """Unpacks an untrusted tar stream into `root` (a new, empty directory)."""

    def __init__(self, root: str, leaf: str, umask: int, bound: int, what: str) -> None:
        self.root = root
        self.leaf = leaf
        self.umask = umask
        self.bound = bound
        self.declared = 0
        self.what = what
        self.dir_modes: Dict[str, Tuple[int, int]] = {}

    def _relative(self, name: str) -> List[str]:
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if name.startswith("/") or ".." in parts or not parts or parts[0] != self.leaf:
            raise CopyError("%s: the archive names %r, outside what was asked for" %
                            (self.what, name))
        return parts

    def _parent(self, parts: List[str]) -> str:
        """The directory for the last part, made where missing; never
        through a symbolic link."""
        path = self.root
        for part in parts[:-1]:
            path = os.path.join(path, part)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                os.mkdir(path, 0o700)
                self.dir_modes.setdefault(path, (0o777 & ~self.umask, -1))
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise CopyError("%s: the archive puts %s below a %s" % (
                    self.what, "/".join(parts),
                    "symbolic link" if stat.S_ISLNK(st.st_mode) else "file"))
        return os.path.join(path, parts[-1])

    def _clear(self, path: str, for_dir: bool) -> bool:
        """Makes room at path; True when a directory is already there and
        may stay."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            if for_dir:
                return True
            raise CopyError("%s: the archive replaces the directory %s with a file" %
                            (self.what, os.path.relpath(path, self.root)))
        os.unlink(path)
        return False

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = self._relative(member.name)
        path = self._parent(parts)
        mode = member.mode & 0o777 & ~self.umask
        if member.isdir():
            if not self._clear(path, True):
                os.mkdir(path, 0o700)
            self.dir_modes[path] = (mode, int(member.mtime))
        elif member.isreg():
            self.declared += member.size
            if self.declared > self.bound:
                raise CopyError("%s: more than %d bytes (90%% of the free space beside the "
                                "destination); make room there, or download less" %
                                (self.what, self.bound))
            self._clear(path, False)
            source = tar.extractfile(member)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600)
            with os.fdopen(fd, "wb") as f:
                if source is not None:
                    shutil.copyfileobj(source, f, _CHUNK)
                os.fchmod(f.fileno(), mode)
            os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
        elif member.issym():
            self._clear(path, False)
            os.symlink(member.linkname, path)
        elif member.islnk():
            target = os.path.join(self.root, *self._relative(member.linkname))
            try:
                st = os.lstat(target)
            except FileNotFoundError:
                raise CopyError("%s: the archive links %s to %s, which it does not hold" %
                                (self.what, member.name, member.linkname)) from None
            if not stat.S_ISREG(st.st_mode):
                raise CopyError("%s: the archive links %s to %s, not a file" %
                                (self.what, member.name, member.linkname))
            self._clear(path, False)
            os.link(target, path, follow_symlinks=False)
        # Device nodes, FIFOs and the like are left out.

    def finish(self) -> None:
        # Deepest first: a directory's mode may forbid writing into it.
        for path in sorted(self.dir_modes, key=len, reverse=True):
            mode, mtime = self.dir_modes[path]
            os.chmod(path, mode)
            if mtime >= 0:
                os.utime(path, (mtime, mtime))


def download(open_exec: Callable[..., "ExecStream"], remote: str, local: str) -> str:
    if not remote.startswith("/"):
        raise CopyError("download: the source must be an absolute path in the sandbox")
    leaf = _base_name(remote)
    if leaf in ("", "/", ".", ".."):
        raise CopyError("download: '%s' names no file or directory" % remote)
    # Into an existing directory under its own name; or, as docker cp does,
    # as `local` itself when that does not exist yet but its parent does.
    if os.path.isdir(local):
        local_dir, final_path = local, os.path.join(local, leaf)
    elif os.path.lexists(local):
        raise CopyError("download: %s exists and is not a directory; nothing was changed" % local)
    else:
        local_dir, final_path = _parent_of(local), local
        if not os.path.isdir(local_dir):
            raise CopyError("download: %s: no such directory (the destination's parent must "
                            "exist)" % local_dir)
    if os.path.lexists(final_path):
        raise CopyError("download: %s exists; nothing was changed" % final_path)
    umask = _umask()
    try:
        vfs = os.statvfs(local_dir)
        bound = vfs.f_bavail * vfs.f_frsize // 10 * 9
        import tempfile

        staging = tempfile.mkdtemp(prefix=".openshell-download-", dir=local_dir)
    except OSError as e:
        raise CopyError("download: create a directory in %s: %s" % (local_dir, e.strerror)) \
            from None
    what = "download of " + remote
    try:
        stream = open_exec(["tar", "-c", "-f", "-", "-C", _parent_of(remote), "--", leaf])
        receiver = _Receiver(stream)
        unpacker = _Unpacker(staging, leaf, umask, bound, what)
        unpack_error: Optional[str] = None
        killed = False
        with stream:
            try:
                with tarfile.open(fileobj=receiver, mode="r|") as tar:  # type: ignore
                    for member in tar:
                        unpacker.add(tar, member)
                unpacker.finish()
            except CopyError as e:
                # What the archive holds breaks the rules: the rest is not wanted.
                unpack_error = e.message
                stream.signal(_SIGKILL)
                killed = True
            except (tarfile.TarError, OSError) as e:
                # A cut or empty archive: tar's failure there says why, if it failed.
                unpack_error = "%s: %s" % (what, getattr(e, "strerror", None) or e)
            try:
                receiver.drain()
            except ExecError:
                raise
            except OpenShellError:
                if unpack_error is None:
                    raise
        status = stream.exit_code
        if not killed:
            if status == 127:
                raise CopyError("download: the sandbox has no tar, which it needs")
            if status not in (0, None):
                raise CopyError(tar_failure(bytes(receiver.errors), "download of ",
                                            _parent_of(remote), status))
        if unpack_error is not None:
            raise CopyError(unpack_error)
        top = os.path.join(staging, leaf)
        try:
            st = os.lstat(top)
        except FileNotFoundError:
            raise CopyError("%s: the archive holds nothing" % what) from None
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            kind = ("is a symbolic link in the sandbox" if stat.S_ISLNK(st.st_mode) else
                    "is not a file or directory")
            raise CopyError("download: %s %s: only a file or a directory can be downloaded; "
                            "nothing was changed" % (remote, kind))
        try:
            os.rename(top, final_path)
        except OSError as e:
            raise CopyError("download: move into %s: %s" % (final_path, e.strerror)) from None
        return final_path
    finally:
        shutil.rmtree(staging, ignore_errors=True)
