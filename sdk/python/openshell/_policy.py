"""A sandbox's policy revisions (docs/api.md, ``GET``/``PUT
.../policy``, ``GET .../policies``; the format in docs/policy.md)."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple, Union

from .errors import InvalidPolicy
from .models import PolicyRevision, PolicyUpdate

if TYPE_CHECKING:
    from .client import Client

EndpointSpec = Union[str, Tuple[str, int]]

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _toml_string(text: str) -> str:
    # A JSON string with only ASCII in it is a TOML basic string.
    return json.dumps(text, ensure_ascii=True)


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else _toml_string(key)


def _parse_endpoint(endpoint: EndpointSpec) -> Tuple[str, int]:
    if isinstance(endpoint, tuple):
        host, port = endpoint
        return str(host), int(port)
    host, sep, port = str(endpoint).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidPolicy("endpoint '%s': expected HOST:PORT" % endpoint, status=0)
    return host.strip("[]"), int(port)


def _has_rule(text: str, rule: str) -> bool:
    key = re.escape(rule) + "|" + re.escape(_toml_string(rule))
    return re.search(r"^\s*\[\s*network_policies\s*\.\s*(%s)\s*[\].]" % key, text,
                     re.MULTILINE) is not None


def rule_table(rule: str, endpoints: Sequence[EndpointSpec], binaries: Sequence[str],
               allowed_ips: Sequence[str]) -> str:
    """A new ``[network_policies.RULE]`` table, TOML text."""
    items = []
    for e in endpoints:
        host, port = _parse_endpoint(e)
        item = "host = %s, port = %d" % (_toml_string(host), port)
        if allowed_ips:
            item += ", allowed_ips = [%s]" % ", ".join(_toml_string(ip) for ip in allowed_ips)
        items.append("  { %s },\n" % item)
    out = "\n[network_policies.%s]\nendpoints = [\n%s]\n" % (_toml_key(rule), "".join(items))
    if binaries:
        out += "binaries = [%s]\n" % ", ".join("{ path = %s }" % _toml_string(b)
                                               for b in binaries)
    return out


class PolicyAPI:
    """``client.policy``: get, list, set and update a sandbox's policy."""

    def __init__(self, client: "Client") -> None:
        self._client = client

    def get(self, name: str, rev: Optional[int] = None) -> PolicyRevision:
        """The current revision, or revision ``rev``. A sandbox created
        without a policy has the default one, written out in full
        (``default`` True)."""
        target = self._client._sandbox_path(name, "/policy")
        if rev is not None:
            target += "?rev=%d" % int(rev)
        return PolicyRevision.from_json(self._client._http.call("GET", target))

    def list(self, name: str) -> List[PolicyRevision]:
        """Every revision, oldest first (without their text: ``policy``
        is "")."""
        j = self._client._http.call("GET", self._client._sandbox_path(name, "/policies"))
        return [PolicyRevision.from_json(r) for r in j.get("revisions", [])]

    def set(self, name: str, policy: str, *, source: Optional[str] = None,
            at_next_start: bool = False) -> PolicyUpdate:
        """A new revision with this whole text (TOML, or OpenShell's YAML
        when ``source`` ends in .yaml). On a Ready sandbox its network part
        applies at once (``applied``); a change of ``filesystem_policy``,
        ``landlock`` or ``process`` raises StaticChange unless
        ``at_next_start``. Raises InvalidPolicy for a text that does not
        validate."""
        body = {"policy": policy}
        if source is not None:
            body["source"] = source
        if at_next_start:
            body["at_next_start"] = True
        return PolicyUpdate.from_json(
            self._client._http.call("PUT", self._client._sandbox_path(name, "/policy"), body))

    def update(self, name: str, edit: Optional[Callable[[str], Optional[str]]] = None, *,
               add_endpoints: Sequence[EndpointSpec] = (), binaries: Sequence[str] = (),
               allowed_ips: Sequence[str] = (), rule: Optional[str] = None,
               source: Optional[str] = None, at_next_start: bool = False) -> PolicyUpdate:
        """Reads the current revision, changes it, and puts it back as a new
        one. ``edit`` takes the current text and returns the new one (None,
        or the same text: nothing is stored, and the result has ``changed``
        False). ``add_endpoints`` ("HOST:PORT" or (host, port)) adds a new
        rule that allows them, for ``binaries`` (absolute paths; none: any
        program) and within ``allowed_ips`` (CIDRs), named ``rule``
        (default: "sdk", "sdk-2", ... whichever is free)."""
        if edit is None and not add_endpoints:
            raise TypeError("policy.update: give edit or add_endpoints")
        if (binaries or allowed_ips or rule) and not add_endpoints:
            raise TypeError("policy.update: binaries, allowed_ips and rule go with add_endpoints")
        for b in binaries:
            if not b.startswith("/"):
                raise InvalidPolicy("binary %s: must be an absolute path" % b, status=0)
        current = self.get(name)
        text = current.policy
        if edit is not None:
            edited = edit(text)
            text = text if edited is None else edited
        if add_endpoints:
            if rule is None:
                rule, n = "sdk", 1
                while _has_rule(text, rule):
                    n += 1
                    rule = "sdk-%d" % n
            elif _has_rule(text, rule):
                raise InvalidPolicy(
                    "policy.update: the policy already has a rule %s: add_endpoints makes a new "
                    "one (change an existing rule with edit)" % rule, status=0)
            text = text.rstrip("\n") + "\n" + rule_table(rule, add_endpoints, binaries, allowed_ips)
        if text == current.policy:
            return PolicyUpdate(current.revision, False, None, [], None, changed=False)
        return self.set(name, text, source=source or "policy update",
                        at_next_start=at_next_start)
