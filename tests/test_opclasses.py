"""afs.query.opclasses (pure): the index kind chosen among the operator classes the catalog lists."""

from __future__ import annotations

from afs.models import OperatorSupport
from afs.query.opclasses import (
    brin_fits,
    catalog_type,
    choose,
    order_terms,
    support_key,
    supports,
    where_terms,
)


def s(op: str, left: str, method: str, opclass: str, default: bool, family: int,
      extension: str | None = None, installed: bool = True) -> OperatorSupport:
    return OperatorSupport(op, left, left, method, opclass, default, "search", family, extension, installed)


# as PostgreSQL 18's catalog lists them (pg_amop, pg_opclass; family sizes from pg_amop)
CATALOG = {
    support_key("@>", "jsonb"): (s("@>", "jsonb", "gin", "jsonb_ops", True, 6),
                                 s("@>", "jsonb", "gin", "jsonb_path_ops", False, 3)),
    support_key("?", "jsonb"): (s("?", "jsonb", "gin", "jsonb_ops", True, 6),),
    support_key("=", "text"): (s("=", "text", "brin", "text_minmax_ops", True, 5),
                               s("=", "text", "btree", "text_ops", True, 20),
                               s("=", "text", "btree", "text_pattern_ops", False, 5),
                               s("=", "text", "gin", "gin_trgm_ops", False, 8, "pg_trgm", False),
                               s("=", "text", "hash", "text_ops", True, 4)),
    support_key("~~", "text"): (s("~~", "text", "gist", "gist_trgm_ops", False, 11, "pg_trgm", True),
                                s("~~", "text", "gin", "gin_trgm_ops", False, 8, "pg_trgm", False)),
    support_key("&&", "anyrange"): (s("&&", "anyrange", "brin", "range_inclusion_ops", True, 14),
                                    s("&&", "anyrange", "gist", "range_ops", True, 18),
                                    s("&&", "anyrange", "spgist", "range_ops", True, 10)),
    support_key("<", "integer"): (s("<", "integer", "brin", "int4_minmax_ops", True, 45),
                                  s("<", "integer", "btree", "int4_ops", True, 45)),
    support_key("=", "xid"): (s("=", "xid", "hash", "xid_ops", True, 1),),
}


def test_the_most_specialised_class_that_serves_every_operator() -> None:
    only = choose(CATALOG, [("@>", "jsonb")])
    assert only is not None and (only.method, only.opclass) == ("gin", "jsonb_path_ops")
    both = choose(CATALOG, [("@>", "jsonb"), ("?", "jsonb")])
    assert both is not None and (both.method, both.opclass) == ("gin", None)  # jsonb_ops: the default
    assert choose(CATALOG, [("?|", "jsonb")]) is None  # nothing in the catalog serves it


def test_btree_first_with_its_default_class_and_hash_only_where_no_btree_serves() -> None:
    eq = choose(CATALOG, [("=", "text")])
    assert eq is not None and (eq.method, eq.opclass) == ("btree", None)
    xid = choose(CATALOG, [("=", "xid")])
    assert xid is not None and xid.method == "hash"
    assert choose(CATALOG, [("=", "xid")], ordered=True) is None  # hash returns no order


def test_the_method_ranks_first_and_a_class_to_be_created_names_its_extension() -> None:
    like = choose(CATALOG, [("~~", "text")])
    # GIN comes before GiST, and gin_trgm_ops would need CREATE EXTENSION: it says so
    assert like is not None and (like.method, like.opclass) == ("gin", "gin_trgm_ops")
    assert like.extension == "pg_trgm"
    gist = choose(CATALOG, [("~~", "text")], methods=("gist",))
    assert gist is not None and gist.extension is None and gist.owner == "pg_trgm"


def test_polymorphic_and_typmod_types() -> None:
    assert catalog_type("character varying(255)") == "character varying"
    assert catalog_type("timestamp(3) with time zone") == "timestamp with time zone"
    assert catalog_type("numeric(10, 2)") == "numeric"
    assert supports(CATALOG, "@>", "jsonb") == CATALOG["@> jsonb"]
    # an expression's type is unknown: the one type the query uses the operator with
    assert supports(CATALOG, "&&", None) == CATALOG["&& anyrange"]
    overlap = choose(CATALOG, [("&&", None)])
    assert overlap is not None and (overlap.method, overlap.opclass) == ("gist", None)


def test_brin_only_for_a_correlated_column_and_a_large_range() -> None:
    needs = [("<", "integer")]
    fits = brin_fits(CATALOG, needs, correlation=0.99, fraction=0.3)
    assert fits is not None and (fits.method, fits.opclass) == ("brin", None)
    assert brin_fits(CATALOG, needs, correlation=0.3, fraction=0.3) is None
    assert brin_fits(CATALOG, needs, correlation=0.99, fraction=0.001) is None
    assert brin_fits(CATALOG, [("@>", "jsonb")], correlation=0.99, fraction=0.3) is None
    # never the B-tree rule's choice
    rng = choose(CATALOG, needs)
    assert rng is not None and rng.method == "btree"


def test_where_terms_read_the_operator_as_written_and_the_expression_unqualified() -> None:
    terms = where_terms("SELECT id FROM ev e WHERE e.created::date = '2020-01-02' AND e.during && "
                        "int4range(1, 2) AND lower(email) LIKE 'a%' AND e.a + e.b = 5 AND x = y "
                        "AND doc @@ to_tsquery('english', 'w') AND e.id = (SELECT 1)")
    found = [(t.qualifier, t.column, t.operator, t.expression) for t in terms]
    assert found == [("e", "created", "=", "CAST(created AS date)"), ("e", "during", "&&", None),
                     (None, "doc", "@@", None)]  # LIKE, two columns, column = column, subquery: not
    assert where_terms("UPDATE t SET a = 1 WHERE b && c") == ()
    assert where_terms("SELECT (") == ()


def test_order_terms_and_ordering_classes() -> None:
    (term,) = order_terms("SELECT id FROM p ORDER BY p.loc <-> point '(1,2)' LIMIT 5")
    assert (term.qualifier, term.column, term.operator) == ("p", "loc", "<->")
    assert order_terms("SELECT id FROM p ORDER BY a, b DESC") == ()
    catalog = {"<-> point": (OperatorSupport("<->", "point", "point", "gist", "point_ops", True, "order", 12),
                             OperatorSupport("<->", "point", "point", "spgist", "kd_point_ops", False,
                                             "order", 9))}
    knn = choose(catalog, [("<->", "point")], purpose="order")
    assert knn is not None and (knn.method, knn.opclass) == ("gist", None)
    assert choose(catalog, [("<->", "point")]) is None  # not a WHERE test
