"""Typed errors from the real gateway: the API's codes and statuses."""

from __future__ import annotations

import pytest

import openshell


def test_not_found(client):
    with pytest.raises(openshell.NotFound) as e:
        client.get("no-such-sandbox")
    err = e.value
    assert isinstance(err, openshell.OpenShellError)
    assert (err.code, err.status) == ("not_found", 404)
    assert err.message == "no sandbox named 'no-such-sandbox'"
    assert str(err) == err.message
    for call in (client.start, client.stop, client.delete, client.wait):
        with pytest.raises(openshell.NotFound):
            call("no-such-sandbox")


def test_bad_name(client, gateway):
    with pytest.raises(openshell.InvalidName) as e:
        client.create("Bad_Name", from_=str(gateway.rootfs))
    assert isinstance(e.value, openshell.BadRequest)
    assert (e.value.code, e.value.status) == ("invalid_name", 400)
    assert "Bad_Name" in e.value.message


def test_name_taken(client, sandbox, gateway):
    with pytest.raises(openshell.NameTaken) as e:
        client.create(sandbox, from_=str(gateway.rootfs))
    assert isinstance(e.value, openshell.Conflict)
    assert (e.value.code, e.value.status) == ("name_taken", 409)


def test_wrong_phase(client, sandbox):
    with pytest.raises(openshell.WrongPhase) as e:
        client.start(sandbox)
    assert isinstance(e.value, openshell.Conflict)
    assert (e.value.code, e.value.status) == ("wrong_phase", 409)
    assert "Ready" in e.value.message
    client.stop(sandbox)
    with pytest.raises(openshell.WrongPhase):
        client.stop(sandbox)


def test_invalid_spec_and_missing_image(client, gateway, new_name):
    with pytest.raises(openshell.InvalidSpec) as e:
        client.create(new_name("spec"), from_=str(gateway.rootfs), memory_bytes=1)
    assert e.value.code == "invalid_spec" and "memory" in e.value.message
    with pytest.raises(openshell.InvalidSpec):
        client.create(new_name("spec"), from_=str(gateway.rootfs), restart="sometimes")
    with pytest.raises(openshell.ImageNotFound) as e:
        client.create(new_name("img"), from_="no-such-image-here")
    assert isinstance(e.value, openshell.NotFound) and e.value.code == "image_not_found"
    assert [s for s in client.list() if s.name.startswith(("spec-", "img-"))] == []


def test_all_for_an_admin(client, sandbox):
    # As the gateway's own user we are an admin: ?all=1 is allowed.
    everyone = client.list(all=True)
    assert sandbox in [s.name for s in everyone]
    assert all(s.owner for s in everyone)


def test_no_gateway(tmp_path):
    c = openshell.Client(socket_path=str(tmp_path / "nothing.sock"))
    with pytest.raises(openshell.ConnectionFailed) as e:
        c.health()
    assert "no gateway listens at" in e.value.message
    assert e.value.code == "connection"


def test_a_run_directory_others_may_enter_is_refused(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "run").mkdir(parents=True)
    (home / "run").chmod(0o755)
    monkeypatch.setenv("OPENSHELL_HOME", str(home))
    with pytest.raises(openshell.ConnectionFailed) as e:
        openshell.Client()
    assert "has mode 0755, not 0700" in e.value.message


def test_client_arguments():
    with pytest.raises(TypeError):
        openshell.Client(socket_path="/x", gateway="y")
    with pytest.raises(openshell.OpenShellError) as e:
        openshell.Client(endpoint="ftp://x")
    assert "the scheme must be unix, https or http" in e.value.message
