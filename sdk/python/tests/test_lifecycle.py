"""create, get, list, start, stop, delete, wait_ready and wait against the
real gateway."""

from __future__ import annotations

import os

import pytest

import openshell


def test_create_get_list_delete(client, gateway, new_name, made):
    name = new_name("life")
    made.append(name)
    box = client.create(name, from_=str(gateway.rootfs), labels={"suite": "sdk", "tier": name})
    assert isinstance(box, openshell.Sandbox)
    assert box.name == name
    assert box.phase == "Ready" and box.ready
    assert box.generation == 1
    assert box.exit_code is None
    assert box.from_ == os.path.realpath(str(gateway.rootfs))
    assert box.labels == {"suite": "sdk", "tier": name}
    assert box.reason == "SupervisorConnected"
    assert len(box.id) == 12

    got = client.get(name)
    assert (got.id, got.phase) == (box.id, "Ready")

    assert name in [s.name for s in client.list()]
    assert [s.name for s in client.list(selector={"tier": name})] == [name]
    assert [s.name for s in client.list(selector="tier=%s,suite" % name)] == [name]
    assert [s.name for s in client.list(selector={"tier": "another"})] == []

    client.delete(name)
    with pytest.raises(openshell.NotFound):
        client.get(name)
    assert name not in [s.name for s in client.list()]


def test_generated_name(client, gateway, made):
    box = client.create(from_=str(gateway.rootfs))
    made.append(box.name)
    assert box.name.startswith("sandbox-")
    assert box.phase == "Ready"


def test_stop_start_keeps_the_workspace(client, sandbox):
    assert client.exec(sandbox, ["sh", "-c", "echo kept > /sandbox/note"]).exit_code == 0
    stopped = client.stop(sandbox)
    assert stopped.phase == "Stopped"
    assert stopped.exit_code is None
    assert client.get(sandbox).phase == "Stopped"
    started = client.start(sandbox)
    assert started.phase == "Ready"
    assert started.generation == 2
    assert client.exec(sandbox, ["cat", "/sandbox/note"]).stdout == b"kept\n"


def test_wait_ready_after_create_without_wait(client, gateway, new_name, made):
    name = new_name("nowait")
    made.append(name)
    box = client.create(name, from_=str(gateway.rootfs), wait=False)
    assert box.phase in ("Provisioning", "Ready")
    ready = client.wait_ready(name, timeout=30)
    assert ready.phase == "Ready"
    assert ready.name == name


def test_wait_for_a_main_process(client, gateway, new_name, made):
    name = new_name("job")
    made.append(name)
    client.create(name, from_=str(gateway.rootfs), command=["sh", "-c", "exit 3"], wait=False)
    done = client.wait(name)
    assert done.phase == "Error"
    assert done.exit_code == 3
    assert done.reason == "MainProcessFailed"
    with pytest.raises(openshell.NotReady) as e:
        client.wait_ready(name, timeout=5)
    assert e.value.sandbox.phase == "Error"
    assert "Error" in str(e.value)

    # A finished sandbox starts again, every time.
    again = client.start(name)
    assert again.generation == 2
    assert client.wait(name, timeout=30).exit_code == 3


def test_completed(client, gateway, new_name, made):
    name = new_name("done")
    made.append(name)
    client.create(name, from_=str(gateway.rootfs), command=["true"])
    done = client.wait(name, timeout=30)
    assert (done.phase, done.exit_code, done.reason) == ("Completed", 0, "MainProcessCompleted")


def test_wait_ready_on_a_stopped_sandbox(client, sandbox):
    client.stop(sandbox)
    with pytest.raises(openshell.NotReady):
        client.wait_ready(sandbox, timeout=0.2)


def test_wait_times_out_on_an_idle_sandbox(client, sandbox):
    with pytest.raises(openshell.WaitTimeout) as e:
        client.wait(sandbox, timeout=0.3)
    assert e.value.sandbox.phase == "Ready"


def test_environment_and_events(client, gateway, new_name, made):
    name = new_name("env")
    made.append(name)
    client.create(name, from_=str(gateway.rootfs), env={"GREETING": "hi there"})
    assert client.exec(name, ["sh", "-c", 'echo "$GREETING"']).stdout == b"hi there\n"
    kinds = [e["type"] for e in client.events(name)]
    assert kinds[0] == "Created"
    assert "Phase" in kinds


def test_gateway_endpoints(client, gateway):
    assert client.health()["status"] == "ok"
    who = client.whoami()
    assert who["transport"] == "unix"
    assert who["admin"] is True
    info = client.gateway_info()
    assert info["state_dir"] == str(gateway.home)
    assert info["socket"] == client.endpoint.socket_path
