"""policy.get, set, update and list against the real gateway."""

from __future__ import annotations

import pytest

import openshell

NETWORK = """version = 1

[network_policies.local]
endpoints = [ { host = "api.example.test", port = 443 } ]
"""


def test_default_then_set_then_get(client, sandbox):
    first = client.policy.get(sandbox)
    assert isinstance(first, openshell.PolicyRevision)
    assert (first.sandbox, first.revision, first.current, first.default) == (sandbox, 1, True,
                                                                             True)
    assert "version = 1" in first.policy

    update = client.policy.set(sandbox, NETWORK, source="net.toml")
    assert isinstance(update, openshell.PolicyUpdate)
    assert update.revision == 2
    assert update.applied is True and update.error is None
    assert update.sandbox is not None and update.sandbox.name == sandbox

    now = client.policy.get(sandbox)
    assert (now.revision, now.current, now.default, now.policy) == (2, True, False, NETWORK)
    old = client.policy.get(sandbox, rev=1)
    assert (old.revision, old.current) == (1, False)
    assert [(r.revision, r.current) for r in client.policy.list(sandbox)] == [(1, False),
                                                                             (2, True)]


def test_invalid_policy(client, sandbox):
    with pytest.raises(openshell.InvalidPolicy) as e:
        client.policy.set(sandbox, NETWORK.replace(", port = 443", ""), source="bad.toml")
    assert e.value.status == 400 and e.value.code == "invalid_policy"
    assert "bad.toml:4" in e.value.message and "needs a port" in e.value.message
    assert client.policy.get(sandbox).revision == 1  # nothing stored
    with pytest.raises(openshell.NotFound):
        client.policy.get(sandbox, rev=9)


def test_update(client, sandbox):
    first = client.policy.update(sandbox, add_endpoints=["pypi.example.test:443"],
                                 binaries=["/usr/bin/wget"])
    assert first.revision == 2 and first.applied
    text = client.policy.get(sandbox).policy
    assert "[network_policies.sdk]" in text
    assert '{ host = "pypi.example.test", port = 443 }' in text
    assert '{ path = "/usr/bin/wget" }' in text

    second = client.policy.update(sandbox, add_endpoints=[("10.1.2.3", 8080)],
                                  allowed_ips=["10.1.2.0/24"])
    assert second.revision == 3
    text = client.policy.get(sandbox).policy
    assert "[network_policies.sdk-2]" in text and '"10.1.2.0/24"' in text

    same = client.policy.update(sandbox, lambda t: t)
    assert same.changed is False and same.revision == 3
    edited = client.policy.update(sandbox, lambda t: t.replace("8080", "8081"))
    assert edited.revision == 4
    assert "port = 8081" in client.policy.get(sandbox).policy

    with pytest.raises(openshell.InvalidPolicy):
        client.policy.update(sandbox, add_endpoints=["x.test:1"], rule="sdk")
    with pytest.raises(TypeError):
        client.policy.update(sandbox)


def test_static_change_waits_for_the_next_start(client, sandbox):
    static = NETWORK + '\n[filesystem_policy]\nread_write = ["/sandbox", "/tmp", "/dev/null"]\n' \
        'read_only = ["/usr", "/bin", "/lib", "/etc", "/proc"]\n'
    with pytest.raises(openshell.StaticChange) as e:
        client.policy.set(sandbox, static)
    assert isinstance(e.value, openshell.Conflict) and e.value.status == 409
    update = client.policy.set(sandbox, static, at_next_start=True)
    assert update.at_next_start == ["filesystem_policy"]
    # Stopped, anything goes, for the next start.
    client.stop(sandbox)
    later = client.policy.set(sandbox, NETWORK)
    assert later.applied is False and later.error is None
