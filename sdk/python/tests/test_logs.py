"""logs and logs follow against the real gateway."""

from __future__ import annotations

import threading
import time

import pytest

import openshell


def test_logs(client, gateway, new_name, made):
    name = new_name("logs")
    made.append(name)
    client.create(name, from_=str(gateway.rootfs),
                  command=["sh", "-c", "echo hello; echo oops >&2; printf tail"])
    client.wait(name, timeout=30)
    records = client.logs(name)
    assert [(r.stream, r.text, r.partial) for r in records] == [
        ("stdout", "hello", False), ("stderr", "oops", False), ("stdout", "tail", True)]
    assert all(isinstance(r, openshell.LogRecord) for r in records)
    assert records[0].time.endswith("Z") and "T" in records[0].time
    assert [r.text for r in client.logs(name, tail=1)] == ["tail"]
    # since: nothing from the future.
    assert client.logs(name, since=time.time() + 3600) == []
    assert len(client.logs(name, since=0)) == 3


def test_follow_as_it_is_written(client, gateway, new_name, made):
    # The main process writes its second line only once told to (a file
    # made through exec): the first record must arrive before that.
    name = new_name("follow")
    made.append(name)
    client.create(name, from_=str(gateway.rootfs), command=[
        "sh", "-c", "echo first; while [ ! -e /sandbox/go ]; do sleep 0.05; done; echo second; "
        "exit 5"])
    with client.logs(name, follow=True) as stream:
        assert isinstance(stream, openshell.LogFollow)
        it = iter(stream)
        first = next(it)
        assert (first.stream, first.text) == ("stdout", "first")
        assert client.exec(name, ["touch", "/sandbox/go"]).exit_code == 0
        assert [r.text for r in it] == ["second"]
    assert stream.end == openshell.LogEnd("Error", 5)


def test_follow_of_an_idle_sandbox_can_be_closed(sandbox):
    # The client's request timeout does not end a quiet stream.
    quick = openshell.Client(timeout=0.2)
    stream = quick.logs(sandbox, follow=True, tail=10)
    got, failures = [], []

    def read():
        try:
            for record in stream:
                got.append(record)
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.6)
    assert reader.is_alive()  # an idle sandbox: the stream stays open
    stream.close()
    reader.join(timeout=5)
    assert not reader.is_alive()
    assert failures == [] and got == [] and stream.end is None
    quick.close()


def test_follow_ends_when_the_sandbox_stops(client, sandbox):
    with client.logs(sandbox, follow=True) as stream:
        threading.Timer(0.3, client.stop, args=(sandbox,)).start()
        assert list(stream) == []
    assert stream.end is not None and stream.end.phase == "Stopped"


def test_network_logs(client, sandbox):
    # A name no rule allows: the DNS stub denies it, and says so in the log.
    client.exec(sandbox, ["nslookup", "denied.example.test"], timeout=20)
    entries = []
    for _ in range(100):
        entries = client.network_logs(sandbox)
        if entries:
            break
        time.sleep(0.05)
    hosts = [(e.get("host"), e.get("decision")) for e in entries]
    assert ("denied.example.test", "deny") in hosts, entries


def test_logs_of_no_sandbox(client):
    with pytest.raises(openshell.NotFound):
        client.logs("no-such-sandbox")
    with pytest.raises(openshell.NotFound):
        client.logs("no-such-sandbox", follow=True)
