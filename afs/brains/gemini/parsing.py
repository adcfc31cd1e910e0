"""Model output → AFS data, robustly (the seed's "Response Parsing"). Pure: no I/O.

    text ─► extract_json (fences, prose around the object)
         ─► load_object (json; else repaired: comments, trailing commas, single quotes)
         ─► parse_analysis / parse_proposals (required fields, types, ranges, enums)

A proposal answer is `{"candidates": [<proposal>, ...]}`: up to MAX_CANDIDATES designs,
best first, each with the seed's proposal fields plus `rewritten_query`, `equivalence`,
`settings` ({"work_mem": "64MB"} only) and `needs_application_change`. The single-proposal
shape of the seed (one object with `proposal_type`) still reads as one candidate.

Critical problems raise `ModelOutputError`, whose reason goes back to the model in
a re-prompt; for proposals that is only when no candidate at all is usable (a malformed
candidate among good ones is dropped with a warning). Everything else is repaired,
clamped or defaulted, and reported as a warning: out-of-range numbers are clamped, enum
spellings are mapped (`create_index` → `index`), missing optional fields get defaults,
settings other than work_mem are dropped, and an analysis without `proposed_actions`
falls back to its insights with confidence 0.5. Unknown extra fields are ignored.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from afs.config import ASKING
from afs.errors import ModelOutputError, UnsafeSqlError
from afs.models import (
    PROPOSAL_TYPES,
    AgentKey,
    AnalysisResult,
    EstimatedImpact,
    OptimizationProposal,
    ProposalType,
    ReviewFlag,
    RiskLevel,
)
from afs.safety import SETTING_LIMITS_KB, split_statements

NO_PROPOSAL: Final = "none"  # the proposal_type of "nothing is worth changing"
UNCERTAIN: Final = 0.5  # confidence when the model gave none, or only partial analysis


# -- structured output schemas (the seed's field names) ------------------------------------
_STRINGS: Final = {"type": "array", "items": {"type": "string"}}
ANALYSIS_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "insights": {**_STRINGS, "minItems": 1,
                     "description": "specific observations from the plan and statistics, with numbers"},
        "proposed_actions": {**_STRINGS, "minItems": 1, "description": "high-level recommendations"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "metadata": {"type": "object", "properties": {
            "bottleneck_type": {"type": "string"},
            "estimated_improvement": {"type": "string"},
        }},
    },
    "required": ["insights", "proposed_actions", "confidence"],
}
MAX_CANDIDATES: Final = ASKING.max_candidates  # candidate designs asked for in one answer, by default
WORK_MEM: Final = "work_mem"  # the one per-query setting offered to the models
# The reasoning fields come before the SQL fields: a model that does not think writes its reasons
# first, then the SQL that follows from them. Guidance lives in the descriptions (the prompts
# hold no JSON example that could disagree with this schema).
_LEVEL: Final = {"type": "string", "enum": ["low", "medium", "high"]}
CANDIDATE_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "proposal_type": {"type": "string", "enum": [*PROPOSAL_TYPES, NO_PROPOSAL],
                          "description": f"the kind of design; {NO_PROPOSAL!r} when nothing is worth "
                                         "changing"},
        "rationale": {"type": "string",
                      "description": "why this design makes the query faster, with the plan's numbers; "
                                     "its trade-offs (storage, writes, refresh strategy of a view)"},
        "equivalence": {"type": "string",
                        "description": "for a rewrite: why it returns exactly the same rows"},
        "sql_commands": {**_STRINGS, "description": "one SQL statement per item, applied in order, only "
                                                    "what the safety rules allow; empty for a rewrite "
                                                    "or a setting alone"},
        "rollback_commands": {**_STRINGS, "description": "statements that undo sql_commands, e.g. "
                                                         "DROP INDEX IF EXISTS name"},
        "rewritten_query": {"type": "string",
                            "description": "the complete query to run instead, when the design needs a "
                                           "rewrite; it keeps every clause of the original"},
        "settings": {"type": "object", "description": "planner settings for this query only",
                     "properties": {WORK_MEM: {"type": "string", "description": "e.g. 64MB"}}},
        "needs_application_change": {
            "type": "boolean",
            "description": "true when the application must change too (keyset pagination)"},
        "estimated_impact": {
            "type": "object",
            "description": "your estimate; the measurement decides",
            "properties": {
                "query_time_improvement": {"type": "number", "minimum": 0, "maximum": 100,
                                           "description": "percent less time"},
                "storage_overhead_mb": {"type": "number", "minimum": 0},
                "complexity": _LEVEL,
                "risk": _LEVEL,
            },
            "required": ["query_time_improvement", "storage_overhead_mb", "complexity", "risk"],
        },
        "validation_steps": {**_STRINGS, "description": "how to check the change works, e.g. what "
                                                        "EXPLAIN should show"},
    },
    "required": ["proposal_type", "rationale", "sql_commands", "estimated_impact"],
}
def proposal_schema(max_candidates: int = MAX_CANDIDATES) -> Mapping[str, Any]:
    """The proposal answer: up to `max_candidates` designs (the agent's AFS_CANDIDATES)."""
    return {
        "type": "object",
        "properties": {
            "candidates": {"type": "array", "items": CANDIDATE_SCHEMA, "maxItems": max_candidates,
                           "description": f"up to {max_candidates} distinct designs, best first; "
                                          "empty when nothing is worth changing"},
        },
        "required": ["candidates"],
    }


PROPOSAL_SCHEMA: Final = proposal_schema()

MAX_FLAGS: Final = 6  # a reviewer's flags in one answer
MAX_CONCERN_CHARS: Final = 600


def review_schema(agents: Sequence[AgentKey]) -> Mapping[str, Any]:
    """The reviewer's answer: flags on the proposals of `agents`."""
    return {
        "type": "object",
        "properties": {
            "flags": {"type": "array", "maxItems": MAX_FLAGS, "description": "empty when nothing is wrong",
                      "items": {"type": "object", "properties": {
                          "agent": {"type": "string", "enum": list(agents),
                                    "description": "whose proposal"},
                          "concern": {"type": "string",
                                      "description": "what the measurement cannot show, concretely"}},
                                "required": ["agent", "concern"]}},
        },
        "required": ["flags"],
    }


def parse_review(reviewer: AgentKey, agents: Sequence[AgentKey],
                 text: str) -> tuple[tuple[ReviewFlag, ...], list[str]]:
    """The reviewer's flags; one on an agent not reviewed, or without a concern, is dropped."""
    data = load_object(text)
    raw = data.get("flags", [])
    if not isinstance(raw, list):
        raise ModelOutputError(f'flags must be a list of {{"agent", "concern"}} objects, '
                               f"got {type(raw).__name__}", text)
    flags: list[ReviewFlag] = []
    warnings: list[str] = []
    for item in raw[:MAX_FLAGS]:
        agent = item.get("agent") if isinstance(item, dict) else None
        concern = " ".join(str(item.get("concern") or "").split()) if isinstance(item, dict) else ""
        if agent not in agents or not concern:
            warnings.append(f"flag {item!r} dropped: no reviewed agent or no concern")
            continue
        if len(concern) > MAX_CONCERN_CHARS:
            concern = concern[:MAX_CONCERN_CHARS - 1] + "…"
        flags.append(ReviewFlag(agent=str(agent), reviewer=reviewer, concern=concern))
    return tuple(flags), warnings


# -- step 1: extract -------------------------------------------------------------------------
_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_-]*[ \t]*\r?\n?(.*?)(?:```|\Z)", re.DOTALL)


def extract_json(text: str) -> str:
    """The JSON text inside `text`: itself when it is bare JSON (a ``` in one of its strings is
    no fence), else the first fenced block holding JSON, else from the first { to the last }."""
    text = text.strip()
    if not text.startswith(("{", "[")):
        blocks = (match.group(1).strip() for match in _FENCE.finditer(text))
        text = next((block for block in blocks if block.startswith(("{", "["))), text)
    if text.startswith(("{", "[")):
        return text
    start, end = text.find("{"), text.rfind("}")
    return text[start:end + 1] if 0 <= start < end else text


# -- step 2: parse, repairing what models commonly break -----------------------------------------
def _skip_blank(text: str, i: int) -> int:
    """The index of the first character at or after `i` that is not blank or in a comment."""
    while i < len(text):
        if text[i].isspace():
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = len(text) if end < 0 else end + 2
        else:
            break
    return i


def repair_json(text: str) -> str:
    """Remove // and /* */ comments and trailing commas; turn 'single' into "double" quotes.

    String contents are left alone (an apostrophe in a double-quoted string stays).
    """
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif c == "'":
            j, chars = i + 1, []
            while j < n and text[j] != "'":
                if text[j] == "\\" and j + 1 < n:
                    chars.append("'" if text[j + 1] == "'" else text[j:j + 2])
                    j += 2
                else:
                    chars.append('\\"' if text[j] == '"' else text[j])
                    j += 1
            out.append('"' + "".join(chars) + '"')
            i = j + 1
        elif c.isspace() or text.startswith(("//", "/*"), i):
            j = _skip_blank(text, i)
            out.append(" " if "\n" not in text[i:j] else "\n")
            i = j
        elif c == ",":
            j = _skip_blank(text, i + 1)
            if j >= n or text[j] not in "}]":
                out.append(c)
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _load_json(text: str) -> Any:
    """The JSON value in a model's answer (repaired if need be); raises ModelOutputError."""
    candidate = extract_json(text)
    if not candidate:
        raise ModelOutputError("the answer was empty; respond with one JSON object", text)
    try:
        return json.loads(candidate, strict=False)  # strict=False: raw newlines in strings (SQL)
    except ValueError:
        try:
            return json.loads(repair_json(candidate), strict=False)
        except ValueError as exc:
            raise ModelOutputError(f"not valid JSON ({exc}); respond with one JSON object only",
                                   text) from None


def load_object(text: str) -> dict[str, Any]:
    """The JSON object in a model's answer; raises ModelOutputError when there is none."""
    value = _load_json(text)
    if not isinstance(value, dict):
        raise ModelOutputError(f"expected a JSON object, got a JSON {type(value).__name__}", text)
    return value


# -- step 3 and 4: validate and sanitise --------------------------------------------------------
def _strings(data: Mapping[str, Any], key: str, warnings: list[str]) -> list[str] | None:
    """A list of non-empty trimmed strings; a lone string counts as a list of one; None if absent."""
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        warnings.append(f"{key}: a string where a list was expected; used as a list of one")
        value = [value]
    if not isinstance(value, list):
        raise ModelOutputError(f"{key} must be a list of strings, got {type(value).__name__}")
    items = [str(v).strip() for v in value if isinstance(v, str | int | float) and str(v).strip()]
    if len(items) < len(value):
        warnings.append(f"{key}: {len(value) - len(items)} empty or non-string item(s) dropped")
    return items


_NUMBER = re.compile(r"(?<![\d.])[-+]?\d+(?:\.\d+)?")


def _number(value: Any) -> float | None:
    """A float from a number or a string like "75%" or "60-85" (the midpoint); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str):
        found = [float(x) for x in _NUMBER.findall(value.replace(",", ""))]
        if len(found) == 2 and re.search(r"\d\s*(?:-|–|to)\s*\d", value):
            return (found[0] + found[1]) / 2
        if found:
            return found[0]
    return None


@dataclass(frozen=True)
class _Range:
    """What a number of the answer may be (`low` to `high`), and what stands for a missing one."""

    low: float
    high: float
    default: float


_CONFIDENCE: Final = _Range(0.0, 1.0, UNCERTAIN)
_IMPROVEMENT_PCT: Final = _Range(0.0, 100.0, 0.0)
_STORAGE_MB: Final = _Range(0.0, math.inf, 0.0)


def _bounded(data: Mapping[str, Any], key: str, bounds: _Range, warnings: list[str],
             prefix: str = "") -> float:
    """The number `data[key]`, clamped into `bounds` (its default when missing or not a number),
    each repair said in `warnings`."""
    low, high, default = bounds.low, bounds.high, bounds.default
    raw = data.get(key)
    value = _number(raw)
    if value is None:
        warnings.append(f"{prefix}{key}: {'missing' if raw is None else f'not a number ({raw!r})'};"
                        f" {default:g} assumed")
        return default
    if not low <= value <= high:
        clamped = min(max(value, low), high)
        warnings.append(f"{prefix}{key}: {value:g} is out of range; clamped to {clamped:g}")
        value = clamped
    return round(value, 2)


def parse_analysis(text: str) -> tuple[AnalysisResult, list[str]]:
    """The seed's AnalysisResult from a model's answer, and the warnings about it."""
    data = load_object(text)
    warnings: list[str] = []
    try:
        insights = _strings(data, "insights", warnings)
        actions = _strings(data, "proposed_actions", warnings)
    except ModelOutputError as exc:
        raise ModelOutputError(exc.reason, text) from None
    if not insights:
        raise ModelOutputError("insights is missing or empty: list at least one observation", text)
    if not actions:
        warnings.append("proposed_actions missing: the insights are used instead, confidence 0.5")
        actions, confidence = list(insights), UNCERTAIN
    else:
        confidence = _bounded(data, "confidence", _CONFIDENCE, warnings)
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        warnings.append(f"metadata: expected an object, got {type(metadata).__name__}; dropped")
        metadata = None
    return AnalysisResult(insights=tuple(insights), proposed_actions=tuple(actions),
                          confidence=confidence, metadata=metadata or {}), warnings


# Spellings models use for the proposal types, after lower-casing, "-"/" " → "_", and
# dropping a "create_" prefix and a plural "s".
_TYPE_SYNONYMS: Final[Mapping[str, str]] = {
    "btree_index": "index", "b_tree_index": "index", "brin_index": "index", "brin": "index",
    "hash_index": "index", "gin_index": "index", "gist_index": "index", "covering_index": "index",
    "unique_index": "index", "expression_index": "index", "single_column_index": "index",
    "index_creation": "index", "new_index": "index", "btree": "index",
    "multi_column_index": "composite_index", "multicolumn_index": "composite_index",
    "composite": "composite_index", "compound_index": "composite_index",
    "partial": "partial_index", "filtered_index": "partial_index",
    "rewrite": "query_rewrite", "query_rewriting": "query_rewrite", "sql_rewrite": "query_rewrite",
    "materialized": "materialized_view", "matview": "materialized_view", "mv": "materialized_view",
    "materialised_view": "materialized_view", "summary_table": "materialized_view",
    "partition": "partitioning", "range_partitioning": "partitioning",
    "table_partitioning": "partitioning", "partitioned_table": "partitioning",
    "denormalize": "denormalization", "denormalise": "denormalization",
    "denormalisation": "denormalization",
    "no_change": NO_PROPOSAL, "no_op": NO_PROPOSAL, "noop": NO_PROPOSAL, "nothing": NO_PROPOSAL,
    "null": NO_PROPOSAL,
}
_LEVELS: Final[Mapping[str, RiskLevel]] = {
    "low": "low", "medium": "medium", "high": "high",
    "very_low": "low", "minimal": "low", "none": "low", "low_medium": "medium", "med": "medium",
    "moderate": "medium", "medium_high": "high", "very_high": "high",
}


def _key(value: str) -> str:
    return re.sub(r"[\s-]+", "_", value.strip().lower())


def proposal_type_of(value: Any) -> str | None:
    """A proposal type from a model's spelling ("create_index" → "index"), "none", or None."""
    if not isinstance(value, str):
        return None
    key = _key(value)
    for candidate in (key, key.removeprefix("create_"), key.removeprefix("create_").removesuffix("s")):
        if candidate in PROPOSAL_TYPES or candidate == NO_PROPOSAL:
            return candidate
        if candidate in _TYPE_SYNONYMS:
            return _TYPE_SYNONYMS[candidate]
    return None


def _level(impact: Mapping[str, Any], key: str, warnings: list[str]) -> RiskLevel:
    raw = impact.get(key)
    level = _LEVELS.get(_key(raw)) if isinstance(raw, str) else None
    if level is not None:
        return level
    warnings.append(f"estimated_impact.{key}: {'missing' if raw is None else repr(raw)};"
                    " medium assumed")
    return "medium"


def _commands(raw: list[str]) -> tuple[str, ...]:
    """One statement per command (a command holding several is split); comment-only ones dropped."""
    out: list[str] = []
    for command in raw:
        try:
            out.extend(split_statements(command))
        except UnsafeSqlError:
            out.append(command)  # unsplittable: the safety check refuses it with its reason
    return tuple(out)


_MEMORY_SIZE = re.compile(r"^\s*(\d+)\s*(kb|mb|gb)?\s*$", re.IGNORECASE)
_UNIT_KB: Final[Mapping[str, int]] = {"kb": 1, "mb": 1024, "gb": 1024 * 1024}
_MIN_WORK_MEM_KB: Final = 64  # PostgreSQL's own minimum


def _memory(kb: int) -> str:
    """A memory size as PostgreSQL writes it, in the largest exact unit."""
    for unit, size in (("GB", 1024 * 1024), ("MB", 1024)):
        if kb % size == 0:
            return f"{kb // size}{unit}"
    return f"{kb}kB"


def _setting_pairs(raw: Any, warnings: list[str]) -> list[tuple[Any, Any]]:
    """`settings` as (name, value) pairs: an object, or a list of pairs, {name, value} or "a=b"
    (a lone "a=b" too)."""
    if isinstance(raw, dict):
        return list(raw.items())
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise ModelOutputError(f'settings must be an object such as {{"{WORK_MEM}": "64MB"}}, '
                               f"got {type(raw).__name__}")
    pairs: list[tuple[Any, Any]] = []
    for item in raw:
        if isinstance(item, dict) and "name" in item:
            pairs.append((item["name"], item.get("value")))
        elif isinstance(item, list) and len(item) == 2:
            pairs.append((item[0], item[1]))
        elif isinstance(item, str) and "=" in item:
            name, _, value = item.partition("=")
            pairs.append((name, value))
        else:
            warnings.append(f"settings: {item!r} is no name and value; dropped")
    return pairs


def _settings(data: Mapping[str, Any], warnings: list[str]) -> tuple[tuple[str, str], ...]:
    """The per-query settings: work_mem only, as a memory size clamped to what the safety check
    accepts. Anything else is dropped with a warning (the rest of the candidate stays)."""
    raw = data.get("settings")
    if raw is None:
        return ()
    found: dict[str, str] = {}
    for name, value in _setting_pairs(raw, warnings):
        key = _key(str(name)).removeprefix("set_local_").removeprefix("set_")
        if key != WORK_MEM:
            warnings.append(f"settings: {name!r} dropped (only {WORK_MEM} may be set for one query)")
            continue
        match = _MEMORY_SIZE.match(str(value)) if isinstance(value, str | int) and not isinstance(
            value, bool) else None
        if match is None:
            warnings.append(f"settings: {WORK_MEM} {value!r} is not a memory size such as 64MB; dropped")
            continue
        kb = int(match[1]) * _UNIT_KB[(match[2] or "kb").lower()]  # no unit: kB, as PostgreSQL reads it
        clamped = min(max(kb, _MIN_WORK_MEM_KB), SETTING_LIMITS_KB[WORK_MEM])
        if clamped != kb:
            warnings.append(f"settings: {WORK_MEM} {value!r} is out of range; clamped to {_memory(clamped)}")
        found[WORK_MEM] = _memory(clamped)
    return tuple(found.items())


def _flag(data: Mapping[str, Any], key: str, warnings: list[str]) -> bool:
    raw = data.get(key)
    if raw is None or isinstance(raw, bool):
        return bool(raw)
    if isinstance(raw, str) and raw.strip().lower() in ("true", "yes", "1"):
        return True
    if not (isinstance(raw, str) and raw.strip().lower() in ("false", "no", "0", "")):
        warnings.append(f"{key}: {raw!r} is not true or false; false assumed")
    return False


def _text(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    return value.strip() if isinstance(value, str) else ""


def _candidate(agent: AgentKey, data: Mapping[str, Any],
               warnings: list[str]) -> OptimizationProposal | None:
    """One candidate design (None for "none"); raises ModelOutputError (without the text)."""
    raw_type = data.get("proposal_type")
    kind = proposal_type_of(raw_type)
    if kind is None:
        raise ModelOutputError(
            f"proposal_type {raw_type!r} is not one of {', '.join((*PROPOSAL_TYPES, NO_PROPOSAL))}")
    if isinstance(raw_type, str) and raw_type != kind:
        warnings.append(f"proposal_type {raw_type!r} read as {kind!r}")
    sql = _strings(data, "sql_commands", warnings)
    rollback = _strings(data, "rollback_commands", warnings) or []
    steps = _strings(data, "validation_steps", warnings) or []
    rationale = _text(data, "rationale")
    rewritten = _text(data, "rewritten_query").rstrip(";").strip()
    if kind == NO_PROPOSAL and rewritten and not sql:
        # "nothing to change in the database", with a better query: a rewrite without DDL
        warnings.append(f'proposal_type {NO_PROPOSAL!r} with a rewritten_query: read as "query_rewrite"')
        kind = "query_rewrite"
    if kind == NO_PROPOSAL:
        return None
    commands = _commands(sql or [])
    settings = _settings(data, warnings)
    if kind == "query_rewrite" and not rewritten:
        raise ModelOutputError('a "query_rewrite" needs the complete new query in rewritten_query')
    if kind == "settings" and not settings:
        raise ModelOutputError(f'a "settings" candidate needs settings, e.g. {{"{WORK_MEM}": "64MB"}}')
    if not (commands or rewritten or settings):
        raise ModelOutputError("sql_commands is missing or empty: give the SQL statements to apply "
                               "(or rewritten_query for a rewrite, settings for work_mem), "
                               f"or proposal_type {NO_PROPOSAL!r} when nothing is worth changing")
    equivalence = _text(data, "equivalence")
    if rewritten and not equivalence:
        warnings.append("equivalence missing: the rewrite does not say why it returns the same rows")
    if not rationale:
        warnings.append("rationale missing")
    rationale = " ".join(part for part in (rationale, equivalence and f"Same rows: {equivalence}") if part)
    impact = data.get("estimated_impact")
    if not isinstance(impact, dict):
        warnings.append("estimated_impact missing or not an object: neutral estimates assumed")
        impact = {}
    estimate = EstimatedImpact(
        query_time_improvement=_bounded(impact, "query_time_improvement", _IMPROVEMENT_PCT, warnings,
                                        "estimated_impact."),
        storage_overhead_mb=_bounded(impact, "storage_overhead_mb", _STORAGE_MB, warnings,
                                     "estimated_impact."),
        complexity=_level(impact, "complexity", warnings),
        risk=_level(impact, "risk", warnings),
    )
    proposal_type = cast(ProposalType, kind)  # one of PROPOSAL_TYPES: proposal_type_of says so
    return OptimizationProposal(
        agent=agent, proposal_type=proposal_type, sql_commands=commands,
        rollback_commands=_commands(rollback), rationale=rationale or "(no rationale given)",
        estimated_impact=estimate, rewritten_query=rewritten or None,
        needs_refresh=proposal_type in ("materialized_view", "denormalization"),
        validation_steps=tuple(steps), settings=settings,
        needs_application_change=_flag(data, "needs_application_change", warnings),
    )


def parse_proposal(agent: AgentKey, text: str) -> tuple[OptimizationProposal | None, list[str]]:
    """One candidate object (the single-proposal shape) → the agent's proposal, None for "none".

    The estimated impact is the model's own prediction; the benchmark measures the truth.
    """
    data = load_object(text)
    warnings: list[str] = []
    try:
        return _candidate(agent, data, warnings), warnings
    except ModelOutputError as exc:
        raise ModelOutputError(exc.reason, text) from None


def _candidate_list(value: Any, text: str, warnings: list[str]) -> list[Any]:
    """The candidates of an answer: {"candidates": [...]}, a single proposal, or a bare list."""
    if isinstance(value, list):
        warnings.append("a bare list: read as the candidates")
        return value
    if not isinstance(value, dict):
        raise ModelOutputError(f"expected a JSON object, got a JSON {type(value).__name__}", text)
    for key in ("candidates", "proposals"):
        if key in value:
            listed = value[key]
            if isinstance(listed, dict):
                warnings.append(f"{key}: one object where a list was expected; used as a list of one")
                return [listed]
            if not isinstance(listed, list):
                raise ModelOutputError(f"{key} must be a list of candidate objects, "
                                       f"got {type(listed).__name__}", text)
            return listed
    if "proposal_type" in value:
        return [value]  # the single-proposal shape: one candidate
    raise ModelOutputError('expected {"candidates": [...]}: a list of candidate designs, best first', text)


def _identity(proposal: OptimizationProposal) -> tuple[object, ...]:
    rewrite = " ".join(proposal.rewritten_query.split()) if proposal.rewritten_query else None
    return tuple(" ".join(c.split()) for c in proposal.sql_commands), rewrite, proposal.settings


def parse_proposals(agent: AgentKey, text: str, max_candidates: int = MAX_CANDIDATES
                    ) -> tuple[tuple[OptimizationProposal, ...], list[str]]:
    """The agent's candidate designs from a model's answer, in the model's order, and warnings.

    A malformed candidate is dropped (with a warning naming it and why) and the others
    are kept; a repeated one is dropped too. Only an answer with no usable candidate at
    all raises ModelOutputError (all the reasons, for the re-prompt). An empty list, or
    only "none" candidates, means nothing is worth changing: ().
    """
    warnings: list[str] = []
    listed = _candidate_list(_load_json(text), text, warnings)
    if len(listed) > max_candidates:
        warnings.append(f"{len(listed)} candidates: only the first {max_candidates} are kept")
        listed = listed[:max_candidates]
    proposals: list[OptimizationProposal] = []
    seen: set[tuple[object, ...]] = set()
    problems: list[str] = []
    for number, item in enumerate(listed, 1):
        label = f"candidate {number}"
        mine: list[str] = []
        try:
            if not isinstance(item, dict):
                raise ModelOutputError(f"not a JSON object but a {type(item).__name__}")
            proposal = _candidate(agent, item, mine)
        except ModelOutputError as exc:
            problems.append(f"{label}: {exc.reason}")
            warnings.append(f"{label} dropped: {exc.reason}")
            continue
        warnings.extend(f"{label}: {w}" if len(listed) > 1 else w for w in mine)
        if proposal is None:
            continue
        if _identity(proposal) in seen:
            warnings.append(f"{label} dropped: the same design as an earlier candidate")
            continue
        seen.add(_identity(proposal))
        proposals.append(proposal)
    if not proposals and problems:
        raise ModelOutputError("no usable candidate (" + "; ".join(problems) + ")", text)
    return tuple(proposals), warnings
