"""Task router: the seed's five Router Testing Scenarios, capacity, fallback, rules files (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from afs.config import ROUTING_DEFAULTS
from afs.errors import InputError, RulesError
from afs.models import RoutingDecision
from afs.query.features import extract_features
from afs.router import RULES_FILE, RuleSet, consensus_weights, load_rules, route

REPO_RULES = Path(__file__).resolve().parent.parent / RULES_FILE
ALL = ("gemini25pro", "gemini25flash", "gemini20flash")
SIMPLE = "SELECT * FROM orders WHERE status = 'completed'"
MEDIUM = """
    SELECT u.id, u.email, count(o.id) AS orders
    FROM users u JOIN orders o ON o.user_id = u.id
    GROUP BY u.id, u.email
"""
COMPLEX = """
    SELECT u.email, o.id, p.name, oi.quantity,
           rank() OVER (PARTITION BY u.country ORDER BY o.total_amount DESC) AS rnk
    FROM users u
    JOIN orders o ON o.user_id = u.id
    JOIN order_items oi ON oi.order_id = o.id
    JOIN products p ON p.id = oi.product_id
    WHERE o.total_amount > (SELECT avg(total_amount) FROM orders)
      AND u.id IN (SELECT user_id FROM events WHERE kind = 'purchase')
"""


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return load_rules(REPO_RULES)


def decide(rules: RuleSet, sql: str = SIMPLE, *, task_type: str = "query_optimization",
           priority: str = "normal", rows: int = 50_000,
           load: Mapping[str, int] | None = None) -> RoutingDecision:
    return route(rules, task_type=task_type, priority=priority, features=extract_features(sql),
                 max_table_rows=rows, agent_load=load or {})


# -- the seed's Router Testing Scenarios ---------------------------------------------------
def test_simple_query_gets_flash_only(rules: RuleSet) -> None:
    assert extract_features(SIMPLE).complexity_score == 0
    decision = decide(rules, SIMPLE)
    assert decision.agents == ("gemini25flash",) and not decision.waiting
    assert decision.rationale == ("Low complexity - the structure agent suffices",)


def test_medium_query_gets_flash_and_pro(rules: RuleSet) -> None:
    features = extract_features(MEDIUM)
    assert (features.join_count, features.aggregation_count) == (1, 1)
    assert features.complexity_score == 3  # 1 JOIN + 1 aggregation + GROUP BY
    decision = decide(rules, MEDIUM)
    assert decision.agents == ("gemini25pro", "gemini25flash")
    assert "Medium complexity - the structure and index design agents" in decision.rationale


def test_complex_query_gets_all_three(rules: RuleSet) -> None:
    features = extract_features(COMPLEX)
    assert (features.join_count, features.subquery_count, features.window_count) == (3, 2, 1)
    assert features.complexity_score == 7
    decision = decide(rules, COMPLEX)
    assert decision.agents == ALL
    assert decision.rationale[-1] == "High complexity - all three agents"


def test_simple_query_on_a_large_table_gets_flash_and_pro(rules: RuleSet) -> None:
    decision = decide(rules, SIMPLE, rows=5_000_000)
    assert decision.agents == ("gemini25pro", "gemini25flash")
    assert decision.rationale[0].startswith("Large table")


@pytest.mark.parametrize("sql", [SIMPLE, MEDIUM, COMPLEX])
def test_high_priority_gets_all_three_and_stops(rules: RuleSet, sql: str) -> None:
    decision = decide(rules, sql, priority="high")
    assert decision.agents == ALL
    assert decision.rationale == ("High priority requires all three agents",)


# -- task types ----------------------------------------------------------------------------
def test_index_task_ensures_pro(rules: RuleSet) -> None:
    decision = decide(rules, SIMPLE, task_type="index_recommendation")
    assert decision.agents == ("gemini25pro", "gemini25flash")
    assert decision.rationale[-1] == "Index task - the index design agent required"


def test_schema_task_ensures_flash(rules: RuleSet) -> None:
    decision = decide(rules, SIMPLE, task_type="schema_improvement")
    assert decision.agents == ("gemini25flash",)
    assert decision.rationale[-1] == "Schema task - the structure agent required"


def test_unknown_task_type_or_priority_is_input_error(rules: RuleSet) -> None:
    with pytest.raises(InputError, match="unknown task type 'tuning'"):
        decide(rules, task_type="tuning")
    with pytest.raises(InputError, match="unknown priority 'urgent'"):
        decide(rules, priority="urgent")


# -- capacity ------------------------------------------------------------------------------
def test_agent_at_hard_limit_is_skipped(rules: RuleSet) -> None:
    decision = decide(rules, MEDIUM, load={"gemini25flash": 3})
    assert decision.agents == ("gemini25pro",) and not decision.waiting
    assert ("the structure agent (gemini25flash) at capacity (3 tasks, limit 3) - skipped"
            in decision.rationale)


def test_agent_at_soft_limit_is_kept_with_a_note(rules: RuleSet) -> None:
    decision = decide(rules, MEDIUM, load={"gemini25pro": 2})
    assert decision.agents == ("gemini25pro", "gemini25flash")
    assert ("the index design agent (gemini25pro) busy (2 tasks, soft limit 2) - assigned anyway"
            in decision.rationale)


def test_all_candidates_at_capacity_waits(rules: RuleSet) -> None:
    decision = decide(rules, MEDIUM, load={"gemini25pro": 3, "gemini25flash": 4})
    assert decision.waiting
    assert decision.agents == ("gemini25pro", "gemini25flash")  # what it waits for
    assert decision.rationale[-1] == "all agents at capacity - waiting for agents"


def test_high_priority_keeps_the_free_agents(rules: RuleSet) -> None:
    decision = decide(rules, priority="high", load={"gemini25pro": 3})
    assert decision.agents == ("gemini25flash", "gemini20flash") and not decision.waiting


# -- default fallback ----------------------------------------------------------------------
def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / RULES_FILE
    path.write_text(text)
    return path


ONLY_INDEX_TASKS = """
routing_rules:
  - name: index_task
    priority: 1
    condition: {field: task.type, operator: equals, value: index_recommendation}
    action: {ensure: [gemini25pro]}
    rationale: "Index task"
"""


def test_no_rule_applies_falls_back_to_the_default_agent(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, ONLY_INDEX_TASKS))
    assert rules.default_agent == ROUTING_DEFAULTS.default_agent == "gemini25flash"
    decision = decide(rules)
    assert decision.agents == ("gemini25flash",) and not decision.waiting
    assert decision.rationale == (
        "No rule selected an agent - default to the structure agent (gemini25flash)",)


def test_default_agent_at_capacity_waits(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, ONLY_INDEX_TASKS + "default_agent: gemini20flash\n"))
    decision = decide(rules, load={"gemini20flash": 3})
    assert decision.waiting and decision.agents == ("gemini20flash",)


def test_combinators_in_and_contains(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, """
routing_rules:
  - name: orders_sorted_or_big
    priority: 1
    condition:
      all:
        - {field: features.tables, operator: contains, value: orders}
        - any:
            - {field: features.order_by_count, operator: greater_or_equal, value: 1}
            - {field: stats.max_table_rows, operator: in, value: [1, 2]}
    action: {include: [gemini20flash], rationale: "orders, sorted or tiny"}
capacity: {soft_limit: 1, hard_limit: 2}
"""))
    assert decide(rules, "SELECT * FROM orders ORDER BY id").agents == ("gemini20flash",)
    assert decide(rules, SIMPLE, rows=2).agents == ("gemini20flash",)
    assert decide(rules, SIMPLE).agents == ("gemini25flash",)  # default
    assert decide(rules, "SELECT * FROM users ORDER BY id").agents == ("gemini25flash",)
    assert decide(rules, SIMPLE, rows=2, load={"gemini20flash": 2}).waiting


# -- the rules file ------------------------------------------------------------------------
def test_the_repository_rules_file_is_found_and_valid() -> None:
    rules = load_rules()
    assert [r.priority for r in rules.rules] == sorted(r.priority for r in rules.rules)
    assert (rules.soft_limit, rules.hard_limit) == (2, 3)
    assert consensus_weights(rules) == {"performance": 0.5, "storage": 0.2, "complexity": 0.2, "risk": 0.1}


def test_rules_are_applied_in_priority_order(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, """
routing_rules:
  - {name: second, priority: 2, rationale: "second", action: {include: [gemini20flash]},
     condition: {field: task.type, operator: not_equals, value: schema_improvement}}
  - {name: first, priority: 1, condition: {field: features.has_limit, operator: equals, value: false},
     action: {assign: [gemini25pro]}, rationale: "first"}
"""))
    assert [r.name for r in rules.rules] == ["first", "second"]
    assert decide(rules).rationale == ("first",)  # assign stops


GOOD_RULE = """
  - name: join_optimization
    priority: 3
    condition: {field: features.join_count, operator: greater_than, value: 0}
    action: {include: [gemini25flash]}
    rationale: "JOIN detected"
"""


@pytest.mark.parametrize(("text", "message"), [
    ("routing_rules: [\n", r"routing_rules\.yaml: not valid YAML at line \d+"),
    ("- just a list\n", r"routing_rules\.yaml: expected a mapping"),
    ("routing_rules: {}\n", r"routing_rules\.yaml: routing_rules must be a list"),
    ("routing_rules: []\nextra: 1\n", r"routing_rules\.yaml: unknown section 'extra'"),
    ("routing_rules:\n" + GOOD_RULE.replace("greater_than", "bigger"),
     r"routing_rules\.yaml: rule 'join_optimization': unknown operator 'bigger'"),
    ("routing_rules:\n" + GOOD_RULE.replace("features.join_count", "features.joins"),
     r"routing_rules\.yaml: rule 'join_optimization': unknown field 'features.joins'"),
    ("routing_rules:\n" + GOOD_RULE.replace("[gemini25flash]", "[gemini30ultra]"),
     r"routing_rules\.yaml: rule 'join_optimization': include: unknown agent 'gemini30ultra'"),
    ("routing_rules:\n" + GOOD_RULE.replace("name: join_optimization", "label: x"),
     r"routing_rules\.yaml: rule #1: unknown key 'label'"),
    ("routing_rules:\n" + GOOD_RULE.replace("  - name: join_optimization\n", "  -\n"),
     r"routing_rules\.yaml: rule #1: missing 'name'"),
    ("routing_rules:\n" + GOOD_RULE + GOOD_RULE,
     r"routing_rules\.yaml: rule 'join_optimization': the name is used twice"),
    ("routing_rules:\n" + GOOD_RULE.replace("value: 0", "value: many"),
     r"rule 'join_optimization': features\.join_count greater_than: expected a number, got 'many'"),
    ("routing_rules:\n" + GOOD_RULE.replace("features.join_count", "features.tables"),
     r"rule 'join_optimization': operator 'greater_than' does not apply to features\.tables"),
    ("routing_rules:\n" + GOOD_RULE.replace("{field: features.join_count, operator: greater_than, value: 0}",
                                            "{field: metadata.priority, operator: equals, value: urgent}"),
     r"rule 'join_optimization': metadata\.priority is never 'urgent'"),
    ("routing_rules:\n" + GOOD_RULE.replace("{include: [gemini25flash]}", "{add: [gemini25flash]}"),
     r"rule 'join_optimization': action needs exactly one of assign, include, ensure"),
    ("routing_rules:\n" + GOOD_RULE.replace('    rationale: "JOIN detected"\n', ""),
     r"rule 'join_optimization': needs one rationale"),
    ("routing_rules:\n" + GOOD_RULE.replace("{field: features.join_count, operator: greater_than, value: 0}",
                                            "{all: []}"),
     r"rule 'join_optimization': all: expected a non-empty list of conditions"),
    ("routing_rules: []\ncapacity: {soft_limit: 4, hard_limit: 3}\n",
     r"routing_rules\.yaml: capacity: soft_limit 4 is above hard_limit 3"),
    ("routing_rules: []\ndefault_agent: gpt\n", r"routing_rules\.yaml: default_agent: unknown agent 'gpt'"),
    ("routing_rules: []\nconsensus_weights: {performance: 0.5, storage: 0.2, complexity: 0.2, risk: 0.2}\n",
     r"routing_rules\.yaml: consensus_weights: weights must sum to 1"),
    ("routing_rules: []\nconsensus_weights: {performance: 0.8, storage: 0.2}\n",
     r"routing_rules\.yaml: consensus_weights: weights need exactly the keys"),
    ("routing_rules: []\nconsensus_weights: {performance: 1.5, storage: -0.5, complexity: 0, risk: 0}\n",
     r"routing_rules\.yaml: consensus_weights: performance must be a number from 0 to 1"),
])
def test_broken_rules_files_name_the_file_and_the_rule(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(RulesError, match=message) as caught:
        load_rules(write(tmp_path, text))
    assert str(tmp_path) in str(caught.value) and caught.value.exit_code == 2


def test_missing_rules_file(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match="cannot read"):
        load_rules(tmp_path / "nope.yaml")


def test_rationale_may_sit_in_the_action_as_in_the_seed(tmp_path: Path) -> None:
    rule = GOOD_RULE.replace('    rationale: "JOIN detected"\n', "").replace(
        "{include: [gemini25flash]}", '{include: [gemini25flash], rationale: "JOIN detected"}')
    rules = load_rules(write(tmp_path, "routing_rules:\n" + rule))
    assert rules.rules[0].rationale == "JOIN detected"


def test_rationales_name_roles_not_models() -> None:
    """The agent keys stay identifiers; no rationale of the shipped rules names a model (the
    seed's were retired, and the brain behind an agent is chosen apart from the routing)."""
    rules = load_rules(REPO_RULES)
    texts = [rule.rationale for rule in rules.rules]
    busy = route(rules, task_type="query_optimization", priority="high", features=extract_features(
        "SELECT 1"), max_table_rows=0, agent_load={"gemini25pro": 3, "gemini20flash": 2}).rationale
    for text in (*texts, *busy):
        assert not re.search(r"gemini-\d", text, re.IGNORECASE), text
    assert any("index design" in text for text in busy)
