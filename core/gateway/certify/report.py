"""What the certifier found: per-case results, the certificate, its table and its JSON.

Defines:

- ``TokenDiff``: the first token where a trace and the template's rendering differ.
- ``CaseResult``: one case's verdict (``holds``, ``forks``, ``fails`` or ``n/a``), and why.
- ``Certificate``: every case, the end-of-turn ids, the hashes of what was certified;
  ``table()`` for people, ``to_json()`` / ``from_json()`` for machines.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["CERTIFIER_VERSION", "CaseResult", "Certificate", "TokenDiff"]

CERTIFIER_VERSION = 2
"""Bumped when the battery or the checks change, so cached certificates are redone."""

VERDICTS = ("holds", "forks", "fails", "n/a")


@dataclass
class TokenDiff:
    """The first token where the trace and the template's rendering differ."""

    index: int
    """Position in the token sequence."""
    trace_id: int | None
    """The trace's token there (None: the trace ends before it)."""
    trace_text: str
    """That token decoded."""
    reference_id: int | None
    """The rendering's token there (None: the rendering ends before it)."""
    reference_text: str
    """That token decoded."""
    before: str
    """The text of the tokens just before ``index`` (the same on both sides)."""

    def describe(self, trace: str = "trace", reference: str = "template") -> str:
        """One line naming the token on each side."""
        return (
            f"token {self.index} (after {self.before!r}): {trace} {_token(self.trace_id, self.trace_text)}, "
            f"{reference} {_token(self.reference_id, self.reference_text)}"
        )


def _token(ident: int | None, text: str) -> str:
    return "<end>" if ident is None else f"{ident} {text!r}"


@dataclass
class CaseResult:
    """One case's verdict."""

    name: str
    """The case's name (``core.gateway.certify.cases``)."""
    what: str
    """What it exercises."""
    verdict: str
    """``holds`` (one row, every prompt the template's rendering), ``forks`` (several rows,
    each exact), ``fails`` (a trained prompt or turn is not what the template renders, or a
    turn does not come back as written), ``n/a`` (the case cannot run on this tokenizer)."""
    rows: int = 0
    """Rows the session produced."""
    turns: int = 0
    """Assistant turns the model generated."""
    detail: str = ""
    """Why it forks, what fails first, or why it does not apply."""
    diff: TokenDiff | None = None
    """The first differing token of the first failure (or of the first fork's reason)."""
    problems: list[str] = field(default_factory=list)
    """Every failure found, one line each."""
    forks: list[str] = field(default_factory=list)
    """Every new row and why it started, one line each."""


@dataclass
class Certificate:
    """What the certifier found for one tokenizer, template and gateway settings."""

    template_sha256: str
    """SHA-256 of the chat template's text."""
    tokenizer_sha256: str
    """SHA-256 of the tokenizer's serialized vocabulary and special tokens."""
    settings: dict[str, Any]
    """The gateway settings certified (parsers, template variables, history mode)."""
    end_of_turn: list[dict[str, Any]]
    """Every id that stops generation (``{"id", "text"}``)."""
    closer: str
    """What the template writes after an assistant answer in history."""
    closer_stops: bool
    """The closer starts with an end-of-turn id (else every turn after an answer forks)."""
    cases: list[CaseResult]
    """Every case, in battery order."""
    version: int = CERTIFIER_VERSION
    """The certifier version that wrote it."""

    @property
    def verdict(self) -> str:
        """``fails`` if any case fails, else ``forks`` if any forks, else ``holds``."""
        found = {c.verdict for c in self.cases}
        if "fails" in found or not self.end_of_turn:
            return "fails"
        return "forks" if "forks" in found else "holds"

    def failing(self) -> list[CaseResult]:
        """The cases that fail."""
        return [c for c in self.cases if c.verdict == "fails"]

    def summary(self) -> str:
        """One line: the verdict, what forks and why, what fails first."""
        head = f"chat template {self.template_sha256[:12]}: {self.verdict}"
        bad = self.failing()
        if bad:
            first = bad[0]
            return f"{head}: case {first.name!r} fails: {first.detail}"
        if not self.end_of_turn:
            return f"{head}: no end-of-turn id stops generation"
        forks = [c for c in self.cases if c.verdict == "forks"]
        if forks:
            names = ", ".join(c.name for c in forks)
            return (f"{head}: exact, {len(forks)} of {len(self.cases)} cases fork ({names}); "
                    f"first, {forks[0].name}: {forks[0].detail}")
        return f"{head}: one exact row in every case"

    def table(self) -> str:
        """A table for people: one line per case, then the details of what forks or fails."""
        width = max(len(c.name) for c in self.cases) if self.cases else 4
        lines = [
            f"template sha256 {self.template_sha256}",
            f"tokenizer sha256 {self.tokenizer_sha256}",
            "settings " + json.dumps(self.settings, sort_keys=True),
            "end-of-turn ids " + (", ".join(f"{e['id']} {e['text']!r}" for e in self.end_of_turn) or "NONE"),
            f"history closer {self.closer!r} ({'a stop id' if self.closer_stops else 'not a stop id'})",
            "",
            f"{'case':<{width}}  verdict  rows  turns  detail",
        ]
        for c in self.cases:
            lines.append(f"{c.name:<{width}}  {c.verdict:<7}  {c.rows:>4}  {c.turns:>5}  {c.detail}")
        for c in self.cases:
            if c.verdict in ("forks", "fails") and (c.problems or c.forks):
                lines += ["", f"{c.name} ({c.what}):"]
                lines += [f"  fails: {p}" for p in c.problems]
                lines += [f"  forks: {f}" for f in c.forks]
        lines += ["", "verdict: " + self.summary()]
        return "\n".join(lines)

    def to_json(self) -> str:
        """The certificate as JSON (``verdict`` included)."""
        data = asdict(self)
        data["verdict"] = self.verdict
        return json.dumps(data, indent=1, ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Certificate:
        """Read a certificate written by ``to_json``.

        Raises:
            ValueError: not a certificate of this certifier version.
        """
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != CERTIFIER_VERSION:
            raise ValueError("not a certificate of this certifier version")
        data.pop("verdict", None)
        cases = []
        for raw in data.pop("cases"):
            diff = raw.pop("diff", None)
            cases.append(CaseResult(**raw, diff=TokenDiff(**diff) if diff else None))
        return cls(**data, cases=cases)
