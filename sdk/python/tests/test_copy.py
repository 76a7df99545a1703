"""upload and download (tar through exec with ?copy=1) against the real
gateway."""

from __future__ import annotations

import os
import stat

import pytest

import openshell


def _tree(root):
    """{relative path: (kind, mode, content or link target)} below root."""
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", None, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), None)
            else:
                with open(path, "rb") as f:
                    out[rel] = ("file", stat.S_IMODE(st.st_mode), f.read())
    return out


@pytest.fixture
def local_tree(tmp_path):
    src = tmp_path / "project"
    (src / "sub" / "deeper").mkdir(parents=True)
    (src / "empty-dir").mkdir()
    (src / "a.txt").write_bytes(b"alpha\n")
    (src / "run.sh").write_bytes(b"#!/bin/sh\necho ran\n")
    os.chmod(str(src / "run.sh"), 0o755)
    (src / "sub" / "blob.bin").write_bytes(os.urandom(300000))
    (src / "sub" / "deeper" / "empty").write_bytes(b"")
    (src / "sub" / "deeper" / ("long-name-" * 12)).write_bytes(b"long\n")
    os.symlink("a.txt", str(src / "link-to-a"))
    return src


def test_round_trip_of_a_directory(client, sandbox, local_tree, tmp_path):
    stats = client.upload(sandbox, str(local_tree), "/sandbox")
    assert isinstance(stats, openshell.UploadStats)
    assert (stats.files, stats.directories, stats.links) == (5, 4, 1)
    assert stats.bytes == 6 + 19 + 300000 + 0 + 5
    r = client.exec(sandbox, ["sh", "-c", "cd /sandbox/project && ./run.sh && cat a.txt && "
                              "readlink link-to-a && stat -c %u sub/blob.bin"])
    assert r.stdout == b"ran\nalpha\na.txt\n1000\n", r.stderr

    back = tmp_path / "back"
    assert client.download(sandbox, "/sandbox/project", str(back)) == str(back)
    assert _tree(str(back)) == _tree(str(local_tree))

    # Into an existing directory: under its own name.
    into = tmp_path / "into"
    into.mkdir()
    assert client.download(sandbox, "/sandbox/project/a.txt", str(into)) == str(into / "a.txt")
    assert (into / "a.txt").read_bytes() == b"alpha\n"
    assert not [n for n in os.listdir(str(into)) if n.startswith(".openshell-download")]


def test_upload_a_file_and_exclude(client, sandbox, local_tree):
    client.upload(sandbox, str(local_tree / "a.txt"), "/tmp")
    assert client.exec(sandbox, ["cat", "/tmp/a.txt"]).stdout == b"alpha\n"
    stats = client.upload(sandbox, str(local_tree), "/sandbox",
                          exclude=lambda rel: rel == "sub" or rel.endswith(".sh"))
    assert stats.files == 1  # a.txt
    r = client.exec(sandbox, ["ls", "/sandbox/project"])
    assert r.stdout.split() == [b"a.txt", b"empty-dir", b"link-to-a"]


def test_copies_with_a_stopped_sandbox(client, sandbox, local_tree, tmp_path):
    client.stop(sandbox)
    client.upload(sandbox, str(local_tree / "a.txt"), "/sandbox")
    assert client.get(sandbox).phase == "Stopped"
    out = tmp_path / "a-again.txt"
    client.download(sandbox, "/sandbox/a.txt", str(out))
    assert out.read_bytes() == b"alpha\n"
    client.start(sandbox)
    assert client.exec(sandbox, ["cat", "/sandbox/a.txt"]).stdout == b"alpha\n"


def test_refusals(client, sandbox, local_tree, tmp_path):
    with pytest.raises(openshell.CopyError) as e:
        client.upload(sandbox, str(local_tree / "a.txt"), "/usr")
    assert e.value.message.startswith("upload to /usr")
    assert "ermission denied" in e.value.message or "Read-only" in e.value.message

    with pytest.raises(openshell.CopyError) as e:
        client.upload(sandbox, str(tmp_path / "missing"), "/sandbox")
    assert "No such file" in e.value.message
    with pytest.raises(openshell.CopyError):
        client.upload(sandbox, str(local_tree / "a.txt"), "relative")

    with pytest.raises(openshell.CopyError) as e:
        client.download(sandbox, "/sandbox/nope", str(tmp_path / "x"))
    assert "/sandbox/nope" in e.value.message and "No such file" in e.value.message
    assert not os.path.exists(str(tmp_path / "x"))

    existing = tmp_path / "exists"
    existing.write_bytes(b"mine")
    client.exec(sandbox, ["sh", "-c", "echo theirs > /sandbox/exists"])
    with pytest.raises(openshell.CopyError) as e:
        client.download(sandbox, "/sandbox/exists", str(existing))
    assert "nothing was changed" in e.value.message
    assert existing.read_bytes() == b"mine"

    # A symbolic link in the sandbox is not downloaded (it could lead the
    # caller's writes anywhere).
    client.exec(sandbox, ["ln", "-s", "/etc", "/sandbox/etc-link"])
    with pytest.raises(openshell.CopyError) as e:
        client.download(sandbox, "/sandbox/etc-link", str(tmp_path / "l"))
    assert "symbolic link" in e.value.message
    assert not os.path.lexists(str(tmp_path / "l"))

    with pytest.raises(openshell.NotFound):
        client.upload("no-such-sandbox", str(local_tree), "/sandbox")


def test_download_drops_setuid_and_devices(client, sandbox, tmp_path):
    client.exec(sandbox, ["sh", "-c", "mkdir /sandbox/d && echo x > /sandbox/d/f && "
                          "chmod 4755 /sandbox/d/f && mkfifo /sandbox/d/fifo"])
    client.download(sandbox, "/sandbox/d", str(tmp_path / "d"))
    mode = stat.S_IMODE(os.lstat(str(tmp_path / "d" / "f")).st_mode)
    assert mode & 0o7000 == 0
    assert os.listdir(str(tmp_path / "d")) == ["f"]
