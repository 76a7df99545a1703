"""exec and exec_stream against the real gateway."""

from __future__ import annotations

import hashlib
import io
import time

import pytest

import openshell


def test_stdout_stderr_and_exit_code(client, sandbox):
    r = client.exec(sandbox, ["sh", "-c", "echo out; echo err >&2; exit 4"])
    assert isinstance(r, openshell.ExecResult)
    assert r.stdout == b"out\n"
    assert r.stderr == b"err\n"
    assert r.exit_code == 4
    with pytest.raises(openshell.CommandFailed) as e:
        r.check()
    assert e.value.exit_code == 4
    assert client.exec(sandbox, ["true"]).check().exit_code == 0


def test_start_in_the_upgrade_request_or_as_a_message(client, sandbox, monkeypatch):
    # The start rides in the upgrade request where it fits, else it is sent
    # as the stream's first message: the same command, the same result.
    import openshell.client as client_module
    argv = ["sh", "-c", 'echo "$K"; cat; exit 6']
    early = client.exec(sandbox, argv, env={"K": "v w"}, stdin=b"in")
    monkeypatch.setattr(client_module, "START_HEADER_MAX", 0)
    sent = client.exec(sandbox, argv, env={"K": "v w"}, stdin=b"in")
    assert early == sent == openshell.ExecResult(b"v w\nin", b"", 6)
    # A start too long for the field (a long argument) goes as a message too.
    monkeypatch.undo()
    long_word = "x" * 20000
    assert client.exec(sandbox, ["echo", long_word]).stdout == long_word.encode() + b"\n"


def test_signal_status(client, sandbox):
    assert client.exec(sandbox, ["sh", "-c", "kill -9 $$"]).exit_code == 137


def test_stdin_bytes_text_file_and_iterable(client, sandbox):
    assert client.exec(sandbox, ["cat"], stdin=b"hello").stdout == b"hello"
    assert client.exec(sandbox, ["cat"], stdin="h\u00e9").stdout == "h\u00e9".encode()
    assert client.exec(sandbox, ["cat"], stdin=io.BytesIO(b"from a file")).stdout == \
        b"from a file"
    assert client.exec(sandbox, ["cat"], stdin=iter([b"a", "b", b"c"])).stdout == b"abc"
    # No stdin: an empty input, so that a reader ends.
    assert client.exec(sandbox, ["cat"]).stdout == b""


def test_large_stdin_and_stdout(client, sandbox):
    data = bytes(range(256)) * 8192  # 2 MiB
    r = client.exec(sandbox, ["sh", "-c", "cat | md5sum; head -c 3000000 /dev/zero"], stdin=data)
    assert r.exit_code == 0
    digest, _, rest = r.stdout.partition(b"  -\n")
    assert digest.decode() == hashlib.md5(data).hexdigest()
    assert rest == b"\0" * 3000000


def test_env_workdir_and_user(client, sandbox):
    r = client.exec(sandbox, ["sh", "-c", 'echo "$FOO $BAR"; pwd; id -u'],
                    env={"FOO": "bar", "BAR": "baz qux"}, workdir="/tmp")
    assert r.stdout == b"bar baz qux\n/tmp\n1000\n"
    assert client.exec(sandbox, ["sh", "-c", 'echo "$X"'], env=["X=1"]).stdout == b"1\n"
    assert client.exec(sandbox, ["pwd"]).stdout == b"/sandbox\n"
    assert client.exec(sandbox, ["id", "-u"], user="65534").stdout == b"65534\n"


def test_exec_errors(client, sandbox):
    with pytest.raises(openshell.ExecError) as e:
        client.exec(sandbox, ["no-such-command"])
    assert e.value.exit_code == 127
    with pytest.raises(openshell.ExecError) as e:
        client.exec(sandbox, ["true"], workdir="/no/such/dir")
    assert e.value.exit_code == 125
    # Root only where the policy allows it.
    with pytest.raises(openshell.ExecError) as e:
        client.exec(sandbox, ["id"], user="0")
    assert e.value.exit_code == 125
    assert "--user" in e.value.message
    with pytest.raises(TypeError):
        client.exec(sandbox, "echo hi")  # type: ignore[arg-type]


def test_timeout_kills_the_command(client, sandbox):
    began = time.monotonic()
    with pytest.raises(openshell.ExecTimeout) as e:
        client.exec(sandbox, ["sh", "-c", "echo before; exec sleep 30"], timeout=0.5)
    assert time.monotonic() - began < 10
    assert e.value.stdout == b"before\n"
    assert e.value.exit_code == 137
    # The sandbox goes on.
    assert client.exec(sandbox, ["true"]).exit_code == 0


def _read_line(it) -> "openshell.ExecOutput":
    chunk = next(it)
    data, stream = chunk.data, chunk.stream
    while not data.endswith(b"\n"):
        more = next(it)
        assert more.stream == stream
        data += more.data
    return openshell.ExecOutput(stream, data)


def test_stream_is_incremental_both_ways(client, sandbox):
    # Each answer arrives before the next question is sent: nothing waits
    # for the end of the command or of its input.
    with client.exec_stream(sandbox, ["sh", "-c", "while read l; do echo \"got $l\"; "
                                      "echo \"err $l\" >&2; done"]) as p:
        it = iter(p)
        for word in ("one", "two", "three"):
            p.send(word + "\n")
            seen = {_read_line(it), _read_line(it)}
            assert seen == {openshell.ExecOutput("stdout", b"got %s\n" % word.encode()),
                            openshell.ExecOutput("stderr", b"err %s\n" % word.encode())}
        p.close_stdin()
        assert list(it) == []
        assert p.exit_code == 0
        assert p.started


def test_stream_output_as_it_comes(client, sandbox):
    times = []
    with client.exec_stream(sandbox, ["sh", "-c", "echo a; sleep 1; echo b"]) as p:
        began = time.monotonic()
        for chunk in p:
            times.append((chunk.data, time.monotonic() - began))
    assert [d for d, _ in times] == [b"a\n", b"b\n"]
    assert times[0][1] < 0.8 <= times[1][1]
    assert p.exit_code == 0


def test_stream_with_iterable_stdin(client, sandbox):
    def chunks():
        for i in range(100):
            yield b"%d\n" % i

    with client.exec_stream(sandbox, ["wc", "-l"], stdin=chunks()) as p:
        out = b"".join(c.data for c in p if c.stream == "stdout")
    assert out.strip() == b"100"
    assert p.exit_code == 0


def test_stream_signal_and_wait(client, sandbox):
    with client.exec_stream(sandbox, ["sh", "-c", "echo up; exec sleep 30"]) as p:
        it = iter(p)
        assert next(it).data == b"up\n"
        p.signal(15)
        assert p.wait() == 143


def test_stream_closed_early_kills_the_command(client, sandbox):
    with client.exec_stream(sandbox, ["sh", "-c", "echo $$ > /tmp/pid; exec sleep 60"]) as p:
        for _ in range(200):
            if client.exec(sandbox, ["cat", "/tmp/pid"]).exit_code == 0:
                break
            time.sleep(0.02)
    pid = client.exec(sandbox, ["cat", "/tmp/pid"]).stdout.strip().decode()
    for _ in range(250):
        if client.exec(sandbox, ["kill", "-0", pid]).exit_code != 0:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the command of a closed stream still runs")


def test_tty(client, sandbox):
    r = client.exec(sandbox, ["sh", "-c", "tty; stty size; echo err >&2"], tty=True)
    lines = r.stdout.replace(b"\r", b"").split(b"\n")
    assert lines[0].startswith(b"/dev/pts/")
    assert lines[1] == b"24 80"
    assert b"err" in r.stdout  # with a tty everything is stdout
    assert r.stderr == b""
    with client.exec_stream(sandbox, ["sh", "-c", "read x; stty size"], tty=True, rows=50,
                            cols=132) as p:
        p.wait_started()
        p.resize(40, 100)
        p.send(b"go\n")
        out = b"".join(c.data for c in p)
    assert b"40 100" in out


def test_exec_needs_a_ready_sandbox(client, sandbox):
    client.stop(sandbox)
    with pytest.raises(openshell.WrongPhase) as e:
        client.exec(sandbox, ["true"])
    assert e.value.status == 409
    assert "Stopped" in e.value.message
    with pytest.raises(openshell.NotFound):
        client.exec("no-such-sandbox", ["true"])
