"""The result of `scaffold verify`: named checks, a table, JSON."""

from __future__ import annotations

from dataclasses import dataclass, field

PASS, FAIL, SKIP, NOTE = "pass", "FAIL", "skipped", "note"


@dataclass
class Check:
    name: str
    status: str
    detail: str
    data: dict = field(default_factory=dict)


@dataclass
class Report:
    port: str
    checkpoint: str
    checks: list[Check] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)

    def add(self, name: str, ok: bool | None, detail: str, **data) -> Check:
        check = Check(name, SKIP if ok is None else PASS if ok else FAIL, detail, data)
        self.checks.append(check)
        return check

    def note(self, name: str, detail: str, **data) -> Check:
        check = Check(name, NOTE, detail, data)
        self.checks.append(check)
        return check

    @property
    def passed(self) -> bool:
        return not any(c.status == FAIL for c in self.checks)

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if c.status == FAIL), None)

    def render(self) -> str:
        width = max((len(c.name) for c in self.checks), default=10)
        lines = [f"verify {self.port}", f"  against {self.checkpoint}", ""]
        lines += [f"  {c.status:<7}  {c.name:<{width}}  {c.detail}" for c in self.checks]
        for table in self.tables:
            lines += ["", table]
        lines.append("")
        failure = self.first_failure
        skipped = [c.name for c in self.checks if c.status == SKIP]
        if failure:
            lines.append(f"FAILED: {failure.name}: {failure.detail}")
            where = next((c for c in self.checks if c.name == "divergence" and c.status == FAIL), None)
            if where is not None and where is not failure:
                lines.append(f"  where: {where.detail}")
        else:
            lines.append("PASSED" + (f" (not run: {', '.join(skipped)})" if skipped else ""))
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "port": self.port,
            "checkpoint": self.checkpoint,
            "passed": self.passed,
            "first_failure": self.first_failure.name if self.first_failure else None,
            "checks": [{"name": c.name, "status": c.status, "detail": c.detail, **c.data} for c in self.checks],
        }
