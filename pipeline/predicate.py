"""``--where`` predicates: one boolean expression over the requests columns, checked
before anything runs.

A predicate comes from a person, a config file or a scheduled job, and it runs
inside SQL, so it is read the way DuckDB reads it and refused unless it is one
expression that can only look at the requests it filters:

- one expression: no ``;``, no comments (``--``, ``/* */``), no clause keyword
  (ORDER, GROUP, LIMIT, UNION, WINDOW, ...), and, read with DuckDB's own parser
  (``json_serialize_sql``) as ``SELECT * FROM requests WHERE <predicate>``,
  exactly that one SELECT with nothing beside its WHERE;
- names only the requests columns (``REQUESTS.file_columns``), unqualified, and
  the clock (``current_date``, ``current_timestamp``, ``now()``);
- no subquery (so no table function, ``read_csv``, ``glob``, ``query``, ...), no
  window, lambda, ``*`` / ``COLUMNS(...)``, parameter or ``#n``;
- calls only the scalar functions of ``FUNCTIONS``: string, math, date and
  time, list and null handling, none of which reads or writes anything (not
  ``getenv``, ``current_setting``, ``getvariable``, ...), and no DISTINCT,
  ORDER BY or FILTER inside a call;
- constants, comparisons, AND / OR / NOT, IN lists, BETWEEN, LIKE, IS NULL,
  CASE, CAST / TRY_CAST and ``::`` are all allowed;
- at most ``MAX_LENGTH`` characters, nested at most ``MAX_DEPTH`` deep, no
  control characters and no Unicode spaces or invisible characters (DuckDB's
  parser reads some as blanks where its tokenizer does not).

What passes runs as the very statement that was checked, ``SELECT * FROM
requests WHERE <predicate>``, behind a CTE named ``requests`` (``statement``),
on a sandboxed connection that can open only the requests files it filters
(``pipeline.sandbox``): the check and the sandbox each stop what the other
might miss.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Callable, Iterable
from typing import Any

import duckdb

from pipeline import sandbox
from pipeline.contracts import REQUESTS
from pipeline.errors import PredicateError

MAX_LENGTH = 10_000  # characters
MAX_DEPTH = 32  # parentheses, and expressions inside expressions

# What the checked statement is, and what the runner runs after its CTE: one text for both.
_PREFIX = "SELECT * FROM requests WHERE "

# Scalar functions (and the operators DuckDB's parser turns into functions: LIKE is ~~,
# ILIKE ~~*, GLOB ~~~, ^@ starts_with, ...) a predicate may call. Each computes a value
# from its arguments; none reads or writes a file, a setting or the environment.
FUNCTIONS = frozenset(
    """
    + - * / // % ** ^ || & | << >> ~ @ ~~ !~~ ~~* !~~* ~~~ ^@ @> <@ && factorial
    lower upper lcase ucase length len strlen char_length character_length length_grapheme
    substr substring substring_grapheme left right left_grapheme right_grapheme
    trim ltrim rtrim replace concat concat_ws contains starts_with ends_with prefix suffix
    strpos instr position reverse split_part string_split str_split string_split_regex
    regexp_matches regexp_full_match regexp_replace regexp_extract like_escape ilike_escape
    not_like_escape not_ilike_escape ascii chr unicode md5 hash nfc_normalize strip_accents
    levenshtein damerau_levenshtein jaccard hamming translate
    abs ceil ceiling floor round trunc sqrt cbrt exp ln log log2 log10 pow power sign
    greatest least isnan isinf isfinite even gcd lcm mod
    date_trunc datetrunc date_part datepart date_diff datediff date_sub datesub date_add
    time_bucket year month day hour minute second millisecond microsecond dayofweek
    dayofmonth dayofyear weekday week weekofyear yearweek quarter isodow isoyear century
    decade era millennium epoch epoch_ms epoch_us epoch_ns make_date make_time make_timestamp
    make_timestamptz to_timestamp strftime strptime try_strptime last_day dayname monthname
    age timezone now today current_date get_current_timestamp transaction_timestamp
    to_years to_months to_weeks to_days to_hours to_minutes to_seconds to_milliseconds
    to_microseconds
    nullif if
    array_length list_contains list_has array_contains array_has list_has_any list_has_all
    array_has_any array_has_all list_position list_indexof array_position list_extract
    list_element array_extract list_value list_min list_max list_sum list_unique
    list_distinct array_distinct list_sort array_sort row struct_pack struct_extract
    """.split()
)

# Names DuckDB reads as a column and then binds to the clock.
_CLOCK = frozenset(
    {"current_date", "current_time", "current_timestamp", "localtime", "localtimestamp"}
)

# Expression kinds the parser gives (its ``class``) that a predicate may hold.
_CLASSES = frozenset(
    {
        "BETWEEN",
        "CASE",
        "CAST",
        "COLLATE",
        "COLUMN_REF",
        "COMPARISON",
        "CONJUNCTION",
        "CONSTANT",
        "FUNCTION",
        "OPERATOR",
        "TYPE",
    }
)
_OPERATORS = frozenset(
    {
        "COMPARE_IN",
        "COMPARE_NOT_IN",
        "OPERATOR_NOT",
        "OPERATOR_IS_NULL",
        "OPERATOR_IS_NOT_NULL",
        "OPERATOR_COALESCE",
        "OPERATOR_NULLIF",
        "ARRAY_EXTRACT",
        "ARRAY_SLICE",
        "ARRAY_CONSTRUCTOR",
        "STRUCT_EXTRACT",
    }
)
_REFUSED = {
    "SUBQUERY": "a subquery (SELECT ..., EXISTS, IN (SELECT ...), ANY/ALL)",
    "WINDOW": "a window function (OVER ...)",
    "STAR": "* or COLUMNS(...)",
    "LAMBDA": "a lambda (x -> ...)",
    "LAMBDA_REF": "a lambda (x -> ...)",
    "PARAMETER": "a parameter (?, $1 or $name)",
    "POSITIONAL_REFERENCE": "a positional reference (#1)",
    "DEFAULT": "DEFAULT",
}
Refuse = Callable[..., PredicateError]  # (what is not allowed[, how to fix it]) -> the error
# Unicode categories refused (tab, newline, carriage return and the plain space aside):
# controls, spaces, line and paragraph separators, invisible format characters, surrogates.
_ODD = frozenset({"Cc", "Zs", "Zl", "Zp", "Cf", "Cs"})

# Clauses of a query that may follow a WHERE. The parser's tree drops some it never uses
# (an unused WINDOW), so they are refused by keyword too.
_CLAUSES = frozenset(
    {
        "window",
        "qualify",
        "group",
        "having",
        "order",
        "limit",
        "offset",
        "union",
        "except",
        "intersect",
        "using",
        "sample",
        "tablesample",
        "fetch",
        "returning",
        "into",
    }
)
_MORE = "holds more than a predicate (ORDER BY, GROUP BY, LIMIT, UNION, WINDOW, ...)"
HOW = (
    "write one boolean expression over the requests columns, with constants, operators "
    "(AND, OR, NOT, =, <, IN (...), BETWEEN, LIKE, IS NULL), CASE, CAST and the scalar "
    'functions docs/replay.md lists, e.g. "prompt_tokens > 1000 AND lower(model) LIKE '
    "'%llama%'\""
)


def check_predicate(
    text: str, origin: str = "--where", columns: Iterable[str] = REQUESTS.file_columns
) -> str:
    """``text`` as it will run (surrounding blanks removed), once it passes every rule of
    the module docstring.

    Args:
        text: the predicate.
        origin: where it came from, for the message: ``--where``, or a config file and key.
        columns: the column names it may use.

    Raises:
        PredicateError: one line naming ``origin``, what is not allowed and how to write
            it instead. Nothing has run: the predicate was only parsed.
    """
    known = tuple(columns)
    if not isinstance(text, str):
        raise PredicateError(f"{origin}: must be a string (a SQL predicate), got {text!r}")
    text = text.strip()

    def refuse(what: str, how: str = HOW) -> PredicateError:
        return PredicateError(f"{origin} {quoted(text)}: {what}; {how}")

    if not text:
        raise refuse("is empty", "leave the option out to keep every request")
    if len(text) > MAX_LENGTH:
        raise refuse(
            f"is {len(text):,} characters long, more than {MAX_LENGTH:,}",
            "select fewer values, or write the requests to a file with `tracereplay sql "
            "--format parquet -o FILE` and pass --requests FILE",
        )
    odd = next((c for c in text if c not in " \t\n\r" and unicodedata.category(c) in _ODD), None)
    if odd is not None:
        # NOTE: DuckDB's parser reads some of these as blanks where its tokenizer reads a
        # word; the two must read a predicate alike (``_check_tokens``).
        raise refuse(
            f"a control, Unicode space or invisible character (U+{ord(odd):04X}) is not allowed",
            f"use plain spaces, and chr({ord(odd)}) for the character inside a string",
        )
    _check_tokens(text, refuse)
    where, shell = _parse(text, refuse)
    _check_expression(where, {c.lower() for c in known}, known, refuse)
    if shell != _reference_shell():
        raise refuse(_MORE)
    return text


def quoted(text: str) -> str:
    """A predicate as a message shows it: quoted on one line, cut after 80 characters."""
    return repr(text if len(text) <= 80 else text[:77] + "...")


def statement(predicate: str, source_sql: str) -> str:
    """The SQL that runs a checked ``predicate`` over ``source_sql`` (a SELECT of the
    requests rows): the checked statement itself, after a CTE named ``requests``."""
    return f"WITH requests AS ({source_sql}) {_PREFIX}{predicate}"


def _check_tokens(text: str, refuse: Refuse) -> None:
    """No comment, no ``;``, no clause of a query (``_CLAUSES``), parentheses nested at
    most ``MAX_DEPTH`` deep: read with DuckDB's tokenizer, so string literals are values."""
    try:
        tokens = duckdb.tokenize(text)
    except (duckdb.Error, RuntimeError) as exc:
        raise refuse(f"cannot be read as SQL ({str(exc).splitlines()[0][:200]})") from None
    depth = 0
    for k, (pos, kind) in enumerate(tokens):
        if kind == duckdb.token_type.comment:
            raise refuse("a comment (-- or /* */) is not allowed")
        end = tokens[k + 1][0] if k + 1 < len(tokens) else len(text)
        word = text[pos:end].strip()
        if kind == duckdb.token_type.keyword and word.lower() in _CLAUSES:
            raise refuse(f"{word.upper()} is not allowed: a predicate has no clauses of a query")
        if kind != duckdb.token_type.operator:
            continue
        if ";" in word:
            raise refuse("';' is not allowed: a predicate is one expression, not statements")
        for ch in word:
            depth += ch in "([{"
            depth -= ch in ")]}"
            if depth > MAX_DEPTH:
                raise refuse(f"is nested more than {MAX_DEPTH} deep")


def _parse(text: str, refuse: Refuse) -> tuple[dict[str, Any], Any]:
    """(the predicate's parse tree, the tree of the statement around it without it), read
    from ``SELECT * FROM requests WHERE <text>``."""
    try:
        tree = _serialize(_PREFIX + text)
    except RecursionError:
        raise refuse(f"is nested more than {MAX_DEPTH} deep") from None
    except duckdb.Error as exc:
        tree = {"error": True, "error_message": str(exc)}
    if tree.get("error"):
        lines = str(tree.get("error_message", "")).strip().splitlines()
        first = re.sub(r"\s+", " ", lines[0] if lines else "unknown error")
        raise refuse(f"is not a SQL expression ({first[:200]})")
    statements = tree.get("statements") or []
    if len(statements) != 1 or not isinstance(statements[0], dict):
        raise refuse("is not one expression")
    node = statements[0].get("node") or {}
    where = node.get("where_clause")
    if not isinstance(where, dict):
        raise refuse(_MORE)
    return where, _without_where(statements[0])


def _without_where(st: dict[str, Any]) -> Any:
    """A statement's tree without its WHERE and without the positions of its parts."""
    node = {k: v for k, v in (st.get("node") or {}).items() if k != "where_clause"}
    return _strip_positions(dict(st, node=node))


def _serialize(sql: str) -> dict[str, Any]:
    """DuckDB's parse tree of ``sql`` as JSON: parsed only, nothing is bound or run (and
    on a sandboxed connection all the same)."""
    con = sandbox.connect()
    try:
        row = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    finally:
        con.close()
    tree = json.loads(row[0]) if row else {}
    return tree if isinstance(tree, dict) else {}


@functools.cache
def _reference_shell() -> Any:
    """The tree of ``SELECT * FROM requests WHERE true`` without its WHERE."""
    (st,) = _serialize(_PREFIX + "true")["statements"]
    return _without_where(st)


def _strip_positions(value: Any) -> Any:
    """``value`` without the ``query_location*`` keys, which differ between texts."""
    if isinstance(value, dict):
        return {
            k: _strip_positions(v) for k, v in value.items() if not k.startswith("query_location")
        }
    if isinstance(value, list):
        return [_strip_positions(v) for v in value]
    return value


def _check_expression(
    where: dict[str, Any], names: set[str], columns: tuple[str, ...], refuse: Refuse
) -> None:
    """Every node of the predicate's tree is of a kind, names a column and calls a
    function that a predicate may use (iteratively: a deep tree is refused, not a crash)."""
    stack: list[tuple[Any, int]] = [(where, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, list):
            stack.extend((v, depth) for v in value)
            continue
        if not isinstance(value, dict):
            continue
        if "class" in value:
            depth += 1
            if depth > MAX_DEPTH:
                raise refuse(f"is nested more than {MAX_DEPTH} deep")
            _check_node(value, names, columns, refuse)
        elif value.get("type") not in (None, "ORDER_MODIFIER"):
            # a SELECT_NODE, a table reference, ...: only a subquery holds one
            raise refuse("a subquery or a table is not allowed")
        stack.extend((v, depth) for v in value.values())


def _check_node(
    node: dict[str, Any], names: set[str], columns: tuple[str, ...], refuse: Refuse
) -> None:
    kind = str(node.get("class"))
    if kind in _REFUSED:
        raise refuse(f"{_REFUSED[kind]} is not allowed")
    if kind not in _CLASSES:
        raise refuse(f"a {kind.lower()} expression is not allowed")
    if kind == "COLUMN_REF":
        parts = [str(p) for p in node.get("column_names") or []]
        if len(parts) != 1:
            raise refuse(
                f"the qualified name {'.'.join(parts)!r} is not allowed",
                "name a requests column alone, e.g. model",
            )
        name = parts[0].lower()
        if name not in names and name not in _CLOCK:
            raise refuse(f"no column {parts[0]!r}", f"the predicate may use: {', '.join(columns)}")
    elif kind == "FUNCTION":
        name = str(node.get("function_name", "")).lower()
        path = (node.get("qualified_name") or {}).get("path") or [name]
        if node.get("schema") or node.get("catalog") or len(path) != 1:
            raise refuse(
                f"the qualified function name {'.'.join(map(str, path))!r} is not allowed",
                "call the function by its name alone",
            )
        if name not in FUNCTIONS:
            what = "operator" if node.get("is_operator") else "function"
            raise refuse(f"the {what} {name} is not allowed")
        orders = (node.get("order_bys") or {}).get("orders") or []
        if node.get("distinct") or node.get("filter") or orders or node.get("export_state"):
            raise refuse(f"DISTINCT, ORDER BY or FILTER in the call of {name} is not allowed")
    elif kind == "OPERATOR" and node.get("type") not in _OPERATORS:
        raise refuse(f"the operator {str(node.get('type')).lower()} is not allowed")
    elif kind == "TYPE" and (node.get("schema") or node.get("catalog")):
        raise refuse("a qualified type name is not allowed", "cast to a built-in type")


__all__ = ["FUNCTIONS", "MAX_DEPTH", "MAX_LENGTH", "check_predicate", "quoted", "statement"]
