"""Values kept on this machine: the prompt's copy of a context without the user's data values.

With `gemini.send_values: false` the brain shows the model `withhold(ctx)` instead of the
context: every literal of the query, of its suite, of the plan's conditions, of index,
CHECK and partition definitions is replaced by a numbered placeholder (`$n`, the same
number for the same literal everywhere), found by PostgreSQL's own scanner (pglast `scan`:
string, integer, numeric and bit-string constants; its offsets count characters); most
common values and histogram bounds are dropped (their frequencies and counts stay: the
planner's statistics, not the values); the keyset key is dropped. The model answers with the placeholders, and
`Withheld.fill` puts the literals back into its SQL before anything checks or runs it.

Names (tables, columns, indexes), row counts, sizes and the plan's numbers still leave the
machine; values do not. Pure: no trio, no network, no database.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from pglast import parser as pg
from pglast.parser import ParseError

from afs.models import AnalysisContext, ColumnStats, OptimizationProposal, TableInfo

# what the scanner calls a constant, and how the placeholder list names its kind
CONSTANTS: Final = {"SCONST": "a string", "USCONST": "a string", "ICONST": "an integer",
                    "FCONST": "a number", "BCONST": "a bit string", "XCONST": "a bit string"}
# plan keys holding SQL expressions (conditions, keys): their constants are values
_EXPRESSION_KEYS: Final = ("Cond", "Filter", "Key", "Output", "Order By")
UNREADABLE: Final = "(withheld: not readable as SQL)"


def _params(sql: str) -> list[int]:
    try:
        tokens = pg.scan(sql)
    except ParseError:
        return []
    return [int(sql[t.start + 1:t.end + 1]) for t in tokens if t.name == "PARAM"]


class Withheld:
    """The literals of one context, numbered; `withhold` and `fill` translate between them."""

    def __init__(self, query: str) -> None:
        self.first = max(_params(query), default=0) + 1  # the query's own $n keep their numbers
        self.values: list[str] = []  # literal text, $first onwards
        self.kinds: list[str] = []

    def number(self, literal: str, kind: str) -> int:
        if literal not in self.values:
            self.values.append(literal)
            self.kinds.append(kind)
        return self.first + self.values.index(literal)

    def withhold(self, sql: str) -> str:
        """`sql` with each constant replaced by its placeholder; UNREADABLE when it cannot be
        scanned (nothing of it is sent)."""
        try:
            tokens = pg.scan(sql)
        except ParseError:
            return UNREADABLE
        out, at = [], 0
        for token in tokens:
            kind = CONSTANTS.get(token.name)
            if kind is None:
                continue
            start, end = token.start, token.end + 1
            literal = sql[start:end]
            out.append(sql[at:start])
            out.append(f"${self.number(literal, kind)}")
            at = end
        out.append(sql[at:])
        return "".join(out)

    def fill(self, sql: str) -> str:
        """The model's `sql` with our placeholders replaced by the literals they stand for."""
        try:
            tokens = pg.scan(sql)
        except ParseError:
            return sql
        out, at = [], 0
        for token in tokens:
            if token.name != "PARAM":
                continue
            number = int(sql[token.start + 1:token.end + 1])
            index = number - self.first
            if not 0 <= index < len(self.values):
                continue  # the query's own parameter, or one we never gave
            out.append(sql[at:token.start])
            out.append(self.values[index])
            at = token.end + 1
        out.append(sql[at:])
        return "".join(out)

    def mask(self, text: str) -> str:
        """Free text (a refusal reason, a result check) with every literal we withheld written
        as its placeholder (string literals as they are spelt, numbers standing alone)."""
        for index, literal in sorted(enumerate(self.values), key=lambda item: -len(item[1])):
            placeholder = f"${self.first + index}"
            if literal.startswith(("'", "E'", "e'", "U&", "B'", "b'", "X'", "x'")):
                text = text.replace(literal, placeholder)
            else:
                text = re.sub(rf"(?<![\w.$]){re.escape(literal)}(?![\w.])", placeholder, text)
        return text

    def legend(self) -> str:
        """What each placeholder stands for, by kind only."""
        return ", ".join(f"${self.first + i} {kind}" for i, kind in enumerate(self.kinds))

    def fill_proposal(self, proposal: OptimizationProposal) -> OptimizationProposal:
        """The model's proposal with the literals back in its SQL."""
        return self._each(proposal, self.fill)

    def withhold_proposal(self, proposal: OptimizationProposal) -> OptimizationProposal:
        """A proposal (with its literals) as the model may see it again."""
        return self._each(proposal, self.withhold)

    @staticmethod
    def _each(proposal: OptimizationProposal, change: Callable[[str], str]) -> OptimizationProposal:
        return dataclasses.replace(
            proposal, sql_commands=tuple(change(s) for s in proposal.sql_commands),
            rollback_commands=tuple(change(s) for s in proposal.rollback_commands),
            rewritten_query=None if proposal.rewritten_query is None else change(proposal.rewritten_query))


def _plan(node: Any, withheld: Withheld) -> Any:
    if isinstance(node, Mapping):
        return {key: (withheld.withhold(value) if isinstance(value, str) and any(
                    part in key for part in _EXPRESSION_KEYS) else
                    [withheld.withhold(v) if isinstance(v, str) else v for v in value]
                    if isinstance(value, list) and any(part in key for part in _EXPRESSION_KEYS)
                    else _plan(value, withheld))
                for key, value in node.items()}
    if isinstance(node, list):
        return [_plan(item, withheld) for item in node]
    return node


def _stats(stats: ColumnStats) -> ColumnStats:
    return dataclasses.replace(stats, most_common_vals=(), histogram_bounds=())


def _table(table: TableInfo, withheld: Withheld) -> TableInfo:
    return dataclasses.replace(
        table,
        indexes=tuple(dataclasses.replace(ix, definition=withheld.withhold(ix.definition))
                      for ix in table.indexes),
        column_stats={name: _stats(stats) for name, stats in table.column_stats.items()},
        constraints=tuple(withheld.withhold(c) for c in table.constraints),
        partitioning=withheld.withhold(table.partitioning) if table.partitioning else "",
        ddl="")


def withhold(ctx: AnalysisContext) -> tuple[AnalysisContext, Withheld]:
    """The context as the model may see it, and the literals it stands for."""
    withheld = Withheld(ctx.query)
    shown = dataclasses.replace(
        ctx, query=withheld.withhold(ctx.query), plan=_plan(ctx.plan, withheld),
        suite=tuple(dataclasses.replace(v, sql=withheld.withhold(v.sql),
                                        note=withheld.withhold(v.note) if v.note else "")
                    for v in ctx.suite),
        tables={name: _table(table, withheld) for name, table in ctx.tables.items()},
        keyset_last_key=None)
    return shown, withheld
