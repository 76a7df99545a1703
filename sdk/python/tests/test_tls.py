"""The session's gateway over mutual TLS, reached by its name in the
registry that `openshell gateway add` writes (XDG_CONFIG_HOME is the
session's own)."""

from __future__ import annotations

import shutil

import pytest

import openshell


@pytest.fixture(scope="module")
def tls_name(gateway):
    if not gateway.tls_address:
        pytest.skip("the gateway has no TLS listener")
    name = "sdk-tls"
    gateway.cli("gateway", "add", "https://" + gateway.tls_address, "--local", "--name", name)
    return name


def test_by_name(client, gateway, tls_name, new_name, made):
    with openshell.Client(gateway=tls_name) as tls:
        assert tls.endpoint.kind == "tls"
        assert tls.endpoint.url() == "https://" + gateway.tls_address
        who = tls.whoami()
        assert who["transport"] == "tls"
        name = new_name("tls")
        made.append(name)
        box = tls.create(name, from_=str(gateway.rootfs))
        assert box.phase == "Ready"
        assert box.owner == who["principal"]
        # Streams are relayed by the gateway over TLS.
        r = tls.exec(name, ["sh", "-c", "cat; echo err >&2; exit 2"], stdin=b"over tls")
        assert (r.stdout, r.stderr, r.exit_code) == (b"over tls", b"err\n", 2)
        with tls.exec_stream(name, ["cat"]) as p:
            p.send(b"x" * 200000)
            p.close_stdin()
            assert sum(len(c.data) for c in p) == 200000
        with pytest.raises(openshell.NotFound):
            tls.get("no-such-sandbox")
        tls.delete(name)


def test_from_environment(gateway, tls_name, monkeypatch):
    monkeypatch.setenv("OPENSHELL_GATEWAY", tls_name)
    with openshell.Client.from_environment() as c:
        assert c.whoami()["transport"] == "tls"
    monkeypatch.setenv("OPENSHELL_GATEWAY", "https://" + gateway.tls_address)
    with openshell.Client.from_environment() as c:
        assert c.whoami()["transport"] == "tls"


def test_unknown_name(gateway):
    with pytest.raises(openshell.OpenShellError) as e:
        openshell.Client(gateway="nobody-registered-this")
    assert "no such gateway is registered" in e.value.message


def test_a_foreign_ca_is_refused(gateway, tls_name, tmp_path):
    # Another home's certificates: a CA the gateway does not trust, and
    # one that did not sign the gateway's certificate.
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    env = dict(gateway.env, OPENSHELL_HOME=str(other))
    gateway.cli("gateway", "generate-certs", env=env)
    ours = gateway.home / "tls"
    theirs = other / "tls"
    url = "https://" + gateway.tls_address

    foreign_ca = openshell.TlsFiles(str(theirs / "ca.crt"), str(ours / "client.crt"),
                                    str(ours / "client.key"))
    with pytest.raises(openshell.ConnectionFailed) as e:
        openshell.Client(endpoint=url, tls=foreign_ca).health()
    assert "is not signed by the CA in" in e.value.message

    foreign_cert = openshell.TlsFiles(str(ours / "ca.crt"), str(theirs / "client.crt"),
                                      str(theirs / "client.key"))
    with pytest.raises(openshell.ConnectionFailed) as e:
        openshell.Client(endpoint=url, tls=foreign_cert).health()
    assert "refused our certificate" in e.value.message or "TLS with" in e.value.message
    shutil.rmtree(str(other), ignore_errors=True)
