"""What the SDK's methods return: typed views of the API's JSON
(docs/api.md), each with the JSON itself in ``raw``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

#: Phases after which a sandbox does not become Ready by itself.
FINISHED_PHASES = ("Completed", "Error", "Stopped")


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "Condition":
        return cls(str(j.get("type", "")), str(j.get("status", "")), str(j.get("reason", "")),
                   str(j.get("message", "")), str(j.get("last_transition_time", "")))


@dataclass(frozen=True)
class Sandbox:
    """The sandbox object (docs/api.md, "The sandbox object")."""

    name: str
    id: str
    phase: str
    generation: int
    owner: str = ""
    exit_code: Optional[int] = None
    conditions: List[Condition] = field(default_factory=list)
    created_at: str = ""
    labels: Dict[str, str] = field(default_factory=dict)
    from_: str = ""
    command: List[str] = field(default_factory=list)
    storage: str = ""
    image: Optional[Dict[str, Any]] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "Sandbox":
        exit_code = j.get("exit_code")
        return cls(
            name=str(j.get("name", "")),
            id=str(j.get("id", "")),
            phase=str(j.get("phase", "")),
            generation=int(j.get("generation", 0)),
            owner=str(j.get("owner", "")),
            exit_code=int(exit_code) if exit_code is not None else None,
            conditions=[Condition.from_json(c) for c in j.get("conditions", [])],
            created_at=str(j.get("created_at", "")),
            labels=dict(j.get("labels", {})),
            from_=str(j.get("from", "")),
            command=list(j.get("command", [])),
            storage=str(j.get("storage", "")),
            image=j.get("image"),
            raw=j,
        )

    @property
    def ready(self) -> bool:
        return self.phase == "Ready"

    @property
    def reason(self) -> str:
        """The Ready condition's reason (``MainProcessFailed``, ...)."""
        return self.conditions[0].reason if self.conditions else ""

    @property
    def message(self) -> str:
        """The Ready condition's message."""
        return self.conditions[0].message if self.conditions else ""


@dataclass(frozen=True)
class ExecResult:
    """What ``exec`` returns: the command's output and exit status (128+N
    for signal N)."""

    stdout: bytes
    stderr: bytes
    exit_code: int

    def check(self) -> "ExecResult":
        """Itself when exit_code is 0; else raises CommandFailed."""
        if self.exit_code != 0:
            from .errors import CommandFailed

            why = self.stderr.decode("utf-8", "replace").strip().splitlines()
            raise CommandFailed("the command exited with status %d%s" %
                                (self.exit_code, ": " + why[0] if why else ""), self.exit_code,
                                self.stdout, self.stderr)
        return self


@dataclass(frozen=True)
class ExecOutput:
    """One chunk of a command's output, as it came: ``stream`` is
    ``"stdout"`` or ``"stderr"`` (with a tty everything is stdout)."""

    stream: str
    data: bytes


@dataclass(frozen=True)
class LogRecord:
    """One CRI log record: ``TIME STREAM TAG TEXT`` (docs/api.md, logs).
    ``partial`` is True for a ``P`` record (a part of a longer line, or
    output that ended without a newline)."""

    time: str
    stream: str
    partial: bool
    text: str
    line: str = field(default="", repr=False)

    @classmethod
    def parse(cls, line: str) -> "LogRecord":
        parts = line.split(" ", 3)
        if len(parts) < 3:
            return cls("", "", False, line, line)
        text = parts[3] if len(parts) > 3 else ""
        return cls(parts[0], parts[1], parts[2] == "P", text, line)


@dataclass(frozen=True)
class LogEnd:
    """The end of a followed log: the sandbox's phase then, and its main
    process's exit status when it has one (both may be missing for a
    sandbox deleted meanwhile)."""

    phase: str = ""
    exit_code: Optional[int] = None


@dataclass(frozen=True)
class PolicyRevision:
    """``GET .../policy``: one revision."""

    sandbox: str
    revision: int
    current: bool
    default: bool
    created_at: str
    policy: str
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "PolicyRevision":
        return cls(str(j.get("sandbox", "")), int(j.get("revision", 0)),
                   bool(j.get("current", False)), bool(j.get("default", False)),
                   str(j.get("created_at", "")), str(j.get("policy", "")), j)


@dataclass(frozen=True)
class PolicyUpdate:
    """``PUT .../policy``: the stored revision, whether the running sandbox
    took its network part (``applied``), why not (``error``, when it
    refused), and the parts that wait for the next start."""

    revision: int
    applied: bool
    error: Optional[str]
    at_next_start: List[str]
    sandbox: Optional[Sandbox]
    changed: bool = True
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, j: Dict[str, Any]) -> "PolicyUpdate":
        sandbox = j.get("sandbox")
        return cls(int(j.get("revision", 0)), bool(j.get("applied", False)), j.get("error"),
                   list(j.get("at_next_start", [])),
                   Sandbox.from_json(sandbox) if isinstance(sandbox, dict) else None, True, j)
