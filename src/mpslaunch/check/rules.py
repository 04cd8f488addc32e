"""The rules at work on one plan: each rule the registry declares for the plan, handed what its
declaration asks for (calls by the name they end with, branches), its findings written from the
registry's words. The code behind each rule: cuda.py, precision.py, fallback.py, loaders.py.
"""

from __future__ import annotations

import ast

from mpslaunch.check import cuda, fallback, loaders, precision, registry  # noqa: F401 - each registers its rules
from mpslaunch.check.calls import called_name
from mpslaunch.check.report import Finding
from mpslaunch.check.scan import Project, Where
from mpslaunch.check.target import Target
from mpslaunch.check.values import Values


class Rules:
    """Called for each call that can run, and each branch; collects the findings for one target."""

    def __init__(self, target: Target, project: Project):
        self.target, self.project = target, project
        self.values = Values(target, project)
        self.uses_accelerate = project.uses_accelerate
        self.device_fix = (
            "accelerator.device"
            if self.uses_accelerate
            else 'torch.device(os.environ["MPSLAUNCH_DEVICE"])'
        )
        self._found: list[Finding] = []
        self.checks = [
            registry.IMPLEMENTATIONS[rule.name](self, rule)
            for rule in registry.RULES
            if rule.plans.applies(target)
        ]
        self._by_call: dict[str | None, list[registry.Check]] = {}  # None: a call of no name
        for check in self.checks:
            for name in check.rule.calls:
                self._by_call.setdefault(name, []).append(check)
        self._every_call = self._by_call.pop("*", [])
        self._on_branch = [check for check in self.checks if check.rule.branches]
        self._fields = {
            "device": target.device,
            "device_fix": self.device_fix,
            "processes": target.processes,
            "on": "on a Mac" if target.device == "mps" else "without an NVIDIA GPU",
        }

    @property
    def findings(self) -> list[Finding]:
        for check in self.checks:
            check.finish()
        return self._found

    def call(self, call: ast.Call, where: Where) -> None:
        name = called_name(call)
        qualified = where.facts.qualified(call.func)
        last = qualified.rpartition(".")[2] if qualified else name
        checks = self._by_call.get(name, [])
        if last != name:
            checks = checks + self._by_call.get(last, [])
        for check in (*self._every_call, *checks):
            check.call(call, where, name, qualified)

    def branch(self, node: ast.AST, where: Where) -> None:
        for check in self._on_branch:
            check.branch(node, where)

    def add(
        self,
        where: Where,
        node: ast.stmt | ast.expr,
        rule_name: str,
        kind: str,
        fix: str | None = None,
        **fields: object,
    ) -> None:
        """A finding of the rule `rule_name` at node: its message of this kind, its fix of kind `fix`
        (the same kind when not given), in the registry's words. Silent where the rule does not
        apply to the plan."""
        rule = registry.BY_NAME[rule_name]
        if not rule.plans.applies(self.target):
            return
        fields = {**self._fields, **fields}
        device = self.target.device
        self._found.append(
            Finding(
                where.facts.source.shown,
                node.lineno,
                rule_name,
                rule.text(rule.messages, kind, device, fields),
                rule.text(rule.fixes, fix or kind, device, fields),
                rule.breaks,
                rule.fact,
            )
        )
