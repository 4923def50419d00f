"""Error types. Bad input raises ValueError/TypeError naming the value, before any change."""

from __future__ import annotations


class CacheOutOfMemory(RuntimeError):
    """No room could be made in a pool. Carries the numbers that explain why."""

    def __init__(self, component: str, tier: str, requested: int, available: int,
                 evictable: int, protected: int, note: str = "") -> None:
        self.component = component
        self.tier = tier
        self.requested = requested
        self.available = available
        self.evictable = evictable
        self.protected = protected
        msg = (f"{component}/{tier} pool out of memory: requested {requested}, available "
               f"{available}, evictable {evictable}, protected {protected}")
        super().__init__(msg + (f" ({note})" if note else ""))


class StaleHandle(ValueError):
    """A node id, match result or receipt that no longer refers to live cache state."""


class InvariantViolation(AssertionError):
    """``check()`` found broken invariants; ``violations`` lists every one."""

    def __init__(self, violations: list[tuple[str, int | None, str]]) -> None:
        self.violations = list(violations)
        lines = [f"  [{name}] node={node}: {detail}" for name, node, detail in self.violations]
        super().__init__(f"{len(self.violations)} invariant violation(s):\n" + "\n".join(lines))
