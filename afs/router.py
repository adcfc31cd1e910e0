"""Which agents work on a task: the seed's Task Router, driven by routing_rules.yaml.

`load_rules()` reads and validates the file once; `route()`, a pure function, applies it
to one task:

1. the rules, in `priority` order (ties keep file order), each one whose condition holds:
   `assign` replaces the candidates and stops, `include` and `ensure` add agents;
   every rule applied adds its rationale;
2. no candidate at all: the file's `default_agent`;
3. capacity: an agent with `hard_limit` tasks or more is skipped, one with `soft_limit` or
   more is kept with a note; when every candidate is skipped the decision is `waiting`,
   listing the agents it waits for.

What the file leaves out (`default_agent`, `capacity`) is afs.config.ROUTING_DEFAULTS.

A condition is `{field, operator, value}` or `{all: [...]}` / `{any: [...]}`. Fields:
`metadata.priority`, `task.type`, `stats.max_table_rows` and `features.<name>` for the
QueryFeatures fields with plain values (numbers, flags, text, table and alias names).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from afs.config import ROUTING_DEFAULTS, safe_yaml
from afs.consensus import check_weights
from afs.errors import InputError, RulesError
from afs.models import AGENT_PREFERENCE, AGENTS, AgentKey, Priority, QueryFeatures, RoutingDecision, TaskType

RULES_FILE = "routing_rules.yaml"

Action = Literal["assign", "include", "ensure"]
ACTIONS: tuple[Action, ...] = ("assign", "include", "ensure")
OPERATORS: Mapping[str, Callable[[Any, Any], bool]] = {
    "equals": operator.eq,
    "not_equals": operator.ne,
    "greater_than": operator.gt,
    "greater_or_equal": operator.ge,
    "less_than": operator.lt,
    "less_or_equal": operator.le,
    "in": lambda actual, values: actual in values,
    "contains": lambda actual, value: actual is not None and value in actual,
}
_SECTIONS = ("routing_rules", "capacity", "default_agent", "consensus_weights")
_RULE_KEYS = ("name", "priority", "condition", "action", "rationale")


@dataclass(frozen=True)
class Comparison:
    field: str
    operator: str
    value: Any


@dataclass(frozen=True)
class Combination:
    mode: Literal["all", "any"]
    conditions: tuple[Condition, ...]


Condition = Comparison | Combination


@dataclass(frozen=True)
class Rule:
    name: str
    priority: int
    condition: Condition
    action: Action
    agents: tuple[AgentKey, ...]
    rationale: str


@dataclass(frozen=True)
class RuleSet:
    """A validated rules file (what it leaves out: afs.config.ROUTING_DEFAULTS)."""

    source: str  # the file, for messages
    rules: tuple[Rule, ...]  # in the order they are applied
    soft_limit: int
    hard_limit: int
    default_agent: AgentKey
    weights: Mapping[str, Any] | None = None  # consensus_weights as written; None: the defaults


def role_of(agent: AgentKey) -> str:
    """"the index design agent (gemini25pro)": an agent as a rationale names it, by its role
    (the brain behind it, a configured model or the offline strategists, is chosen elsewhere)."""
    spec = AGENTS.get(agent)
    role = spec.specialization.split(":", 1)[0].split(" for ", 1)[0] if spec is not None else "unknown"
    return f"the {role} agent ({agent})"


def route(rules: RuleSet, *, task_type: str, priority: str, features: QueryFeatures,
          max_table_rows: int, agent_load: Mapping[str, int]) -> RoutingDecision:
    """Choose the agents for one task; `agent_load` counts their current tasks (missing: 0)."""
    if task_type not in get_args(TaskType):
        raise InputError(f"unknown task type {task_type!r} (known: {', '.join(get_args(TaskType))})")
    if priority not in get_args(Priority):
        raise InputError(f"unknown priority {priority!r} (known: {', '.join(get_args(Priority))})")
    facts: dict[str, Any] = {
        "metadata.priority": priority,
        "task.type": task_type,
        "stats.max_table_rows": max_table_rows,
        **{f"features.{f.name}": getattr(features, f.name) for f in fields(features)},
    }
    candidates: set[AgentKey] = set()
    rationale: list[str] = []
    for rule in rules.rules:
        if not _holds(rule.condition, facts):
            continue
        rationale.append(rule.rationale)
        if rule.action == "assign":
            candidates = set(rule.agents)
            break
        candidates.update(rule.agents)
    if not candidates:
        candidates = {rules.default_agent}
        rationale.append(f"No rule selected an agent - default to {role_of(rules.default_agent)}")

    wanted = tuple(agent for agent in AGENT_PREFERENCE if agent in candidates)
    assigned = []
    for agent in wanted:
        load, who = agent_load.get(agent, 0), role_of(agent)
        if load >= rules.hard_limit:
            rationale.append(f"{who} at capacity ({load} tasks, limit {rules.hard_limit}) - skipped")
            continue
        if load >= rules.soft_limit:
            rationale.append(f"{who} busy ({load} tasks, soft limit {rules.soft_limit}) - assigned anyway")
        assigned.append(agent)
    if not assigned:
        rationale.append("all agents at capacity - waiting for agents")
        return RoutingDecision(agents=wanted, rationale=tuple(rationale), waiting=True)
    return RoutingDecision(agents=tuple(assigned), rationale=tuple(rationale))


def _holds(condition: Condition, facts: Mapping[str, Any]) -> bool:
    if isinstance(condition, Combination):
        results = (_holds(c, facts) for c in condition.conditions)
        return all(results) if condition.mode == "all" else any(results)
    return OPERATORS[condition.operator](facts[condition.field], condition.value)


def consensus_weights(rules: RuleSet) -> dict[str, float]:
    """The consensus weights of the rules file (the consensus defaults when it has none)."""
    raw = rules.weights
    if raw is not None:
        if not isinstance(raw, Mapping):
            raise RulesError(f"{rules.source}: consensus_weights: expected a mapping of weights")
        for key, value in raw.items():
            if not _is_number(value) or not 0 <= value <= 1:
                raise RulesError(f"{rules.source}: consensus_weights: {key} must be a number"
                                 f" from 0 to 1, got {value!r}")
    try:
        return dict(check_weights(raw))
    except ValueError as exc:
        raise RulesError(f"{rules.source}: consensus_weights: {exc}") from exc


# -- loading ------------------------------------------------------------------------
def default_rules_path() -> Path:
    """routing_rules.yaml in the current directory, the repository root, or the package."""
    here = Path(__file__).resolve().parent
    places = (Path.cwd(), here.parent, here)
    for place in places:
        if (place / RULES_FILE).is_file():
            return place / RULES_FILE
    raise RulesError(f"{RULES_FILE} not found in {', '.join(str(p) for p in places)}")


def load_rules(path: Path | None = None) -> RuleSet:
    """Read and validate a rules file (default: `default_rules_path()`); raises RulesError."""
    path = default_rules_path() if path is None else path
    source = str(path)
    try:
        data = safe_yaml(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RulesError(f"{source}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise RulesError(f"{source}: not valid YAML{line}: {getattr(exc, 'problem', None) or exc}") from exc
    if not isinstance(data, dict):
        raise RulesError(f"{source}: expected a mapping with a routing_rules list")
    unknown = sorted(str(key) for key in data if key not in _SECTIONS)
    if unknown:
        raise RulesError(f"{source}: unknown section {unknown[0]!r} (known: {', '.join(_SECTIONS)})")
    raw_rules = data.get("routing_rules")
    if not isinstance(raw_rules, list):
        raise RulesError(f"{source}: routing_rules must be a list of rules")

    rules: list[Rule] = []
    for index, raw in enumerate(raw_rules, start=1):
        name = raw.get("name") if isinstance(raw, dict) else None
        label = repr(name) if isinstance(name, str) and name else f"#{index}"
        try:
            rule = _rule(raw)
        except _Invalid as exc:
            raise RulesError(f"{source}: rule {label}: {exc}") from None
        if any(r.name == rule.name for r in rules):
            raise RulesError(f"{source}: rule {label}: the name is used twice")
        rules.append(rule)

    try:
        soft, hard = _capacity(data.get("capacity", {}))
    except _Invalid as exc:
        raise RulesError(f"{source}: {exc}") from None
    default_agent = data.get("default_agent", ROUTING_DEFAULTS.default_agent)
    if default_agent not in AGENTS:
        raise RulesError(f"{source}: default_agent: unknown agent {default_agent!r}"
                         f" (known: {', '.join(AGENTS)})")
    ruleset = RuleSet(source=source, rules=tuple(sorted(rules, key=lambda r: r.priority)),
                      soft_limit=soft, hard_limit=hard, default_agent=default_agent,
                      weights=data.get("consensus_weights"))
    consensus_weights(ruleset)
    return ruleset


class _Invalid(Exception):
    """A problem in one part of the rules file; load_rules adds the file and the rule."""


@dataclass(frozen=True)
class _Field:
    kind: Literal["number", "flag", "text", "names"]
    choices: tuple[str, ...] = ()  # the only values a text field takes, when known


_KIND_OPERATORS: Mapping[str, tuple[str, ...]] = {
    "number": ("equals", "not_equals", "greater_than", "greater_or_equal", "less_than",
               "less_or_equal", "in"),
    "flag": ("equals", "not_equals"),
    "text": ("equals", "not_equals", "in", "contains"),
    "names": ("contains",),
}


def _field_of(hint: object) -> _Field | None:
    if hint is bool:
        return _Field("flag")
    if hint is int:
        return _Field("number")
    if get_origin(hint) is Literal:
        return _Field("text", get_args(hint))
    if hint is str or set(get_args(hint)) == {str, type(None)}:
        return _Field("text")
    if get_origin(hint) in (tuple, Mapping) and get_args(hint)[0] is str:
        return _Field("names")  # `contains` looks for a table or alias name
    return None


_FIELDS: Mapping[str, _Field] = {
    "metadata.priority": _Field("text", get_args(Priority)),
    "task.type": _Field("text", get_args(TaskType)),
    "stats.max_table_rows": _Field("number"),
    **{f"features.{name}": kind for name, hint in get_type_hints(QueryFeatures).items()
       if (kind := _field_of(hint)) is not None},
}


def _rule(raw: object) -> Rule:
    if not isinstance(raw, dict):
        raise _Invalid("expected a mapping with name, priority, condition, action, rationale")
    unknown = sorted(str(key) for key in raw if key not in _RULE_KEYS)
    if unknown:
        raise _Invalid(f"unknown key {unknown[0]!r} (known: {', '.join(_RULE_KEYS)})")
    for key in ("name", "priority", "condition", "action"):
        if key not in raw:
            raise _Invalid(f"missing {key!r}")
    name, priority, action = raw["name"], raw["priority"], raw["action"]
    if not isinstance(name, str) or not name:
        raise _Invalid("name must be a non-empty string")
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise _Invalid(f"priority must be an integer, got {priority!r}")
    if not isinstance(action, dict):
        raise _Invalid(f"action must be a mapping with one of {', '.join(ACTIONS)}")
    kinds = [key for key in action if key in ACTIONS]
    unknown = sorted(str(key) for key in action if key not in (*ACTIONS, "rationale"))
    if unknown or len(kinds) != 1:
        raise _Invalid(f"action needs exactly one of {', '.join(ACTIONS)} (and may hold the rationale)")
    if ("rationale" in raw) == ("rationale" in action):
        raise _Invalid("needs one rationale, in the rule or in its action")
    rationale = raw.get("rationale", action.get("rationale"))
    if not isinstance(rationale, str) or not rationale.strip():
        raise _Invalid("rationale must be a non-empty string")
    return Rule(name=name, priority=priority, condition=_condition(raw["condition"]),
                action=kinds[0], agents=_agents(action[kinds[0]], kinds[0]), rationale=rationale.strip())


def _agents(raw: object, action: str) -> tuple[AgentKey, ...]:
    if not isinstance(raw, list) or not raw:
        raise _Invalid(f"{action}: expected a list of agents")
    for agent in raw:
        if agent not in AGENTS:
            raise _Invalid(f"{action}: unknown agent {agent!r} (known: {', '.join(AGENTS)})")
    return tuple(dict.fromkeys(raw))


def _condition(raw: object) -> Condition:
    if not isinstance(raw, dict):
        raise _Invalid("a condition must be a mapping")
    if "all" in raw or "any" in raw:
        if len(raw) != 1:
            raise _Invalid("a condition with all/any has nothing else")
        mode: Literal["all", "any"] = "all" if "all" in raw else "any"
        items = raw[mode]
        if not isinstance(items, list) or not items:
            raise _Invalid(f"{mode}: expected a non-empty list of conditions")
        return Combination(mode, tuple(_condition(item) for item in items))
    for key in ("field", "operator", "value"):
        if key not in raw:
            raise _Invalid(f"condition: missing {key!r}")
    unknown = sorted(str(key) for key in raw if key not in ("field", "operator", "value"))
    if unknown:
        raise _Invalid(f"condition: unknown key {unknown[0]!r}")
    name, op, value = raw["field"], raw["operator"], raw["value"]
    field = _FIELDS.get(name)
    if field is None:
        raise _Invalid(f"unknown field {name!r} (known: {', '.join(_FIELDS)})")
    if op not in OPERATORS:
        raise _Invalid(f"unknown operator {op!r} (known: {', '.join(OPERATORS)})")
    usable = _KIND_OPERATORS[field.kind]
    if op not in usable:
        raise _Invalid(f"operator {op!r} does not apply to {name} (use {', '.join(usable)})")
    if op == "in":
        if not isinstance(value, list) or not value:
            raise _Invalid(f"{name} in: expected a non-empty list, got {value!r}")
        value = tuple(value)
    for item in value if op == "in" else (value,):
        _check_value(name, field, op, item)
    return Comparison(name, op, value)


def _check_value(name: str, field: _Field, op: str, value: object) -> None:
    if field.kind == "number":
        valid, expected = _is_number(value), "a number"
    elif field.kind == "flag":
        valid, expected = isinstance(value, bool), "true or false"
    else:
        valid, expected = isinstance(value, str), "a string"
    if not valid:
        raise _Invalid(f"{name} {op}: expected {expected}, got {value!r}")
    if field.choices and op != "contains" and value not in field.choices:
        raise _Invalid(f"{name} is never {value!r} (it is one of {', '.join(field.choices)})")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _capacity(raw: object) -> tuple[int, int]:
    if not isinstance(raw, dict):
        raise _Invalid("capacity: expected a mapping with soft_limit and hard_limit")
    unknown = sorted(str(key) for key in raw if key not in ("soft_limit", "hard_limit"))
    if unknown:
        raise _Invalid(f"capacity: unknown key {unknown[0]!r}")
    soft = raw.get("soft_limit", ROUTING_DEFAULTS.soft_limit)
    hard = raw.get("hard_limit", ROUTING_DEFAULTS.hard_limit)
    for key, value in (("soft_limit", soft), ("hard_limit", hard)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise _Invalid(f"capacity: {key} must be a positive integer, got {value!r}")
    if soft > hard:
        raise _Invalid(f"capacity: soft_limit {soft} is above hard_limit {hard}")
    return soft, hard
