"""``dpmagic init``: a policy skeleton from the schema of data files.

Only the *schema* is read, and only where the file declares one; no data
value goes into the policy. Bounds and public key lists are facts the data
owner must declare from knowledge of the domain: copying the observed minimum,
maximum or distinct values into a public file would itself leak the data.
So would a type guessed from the values: a CSV declares no types, and DuckDB's
sniffer would make ``age`` a float for one person's ``41.5``, in a policy every
user reads. A Parquet file's declared types are used; a CSV's columns are
written ``str`` (which any CSV text is) with a placeholder asking the owner for
the type. The skeleton leaves all of these as commented placeholders to fill
in, each marked ``TODO(dpmagic init)``; ``dpmagic serve`` refuses a policy that
still has one (:func:`unfilled` names them), so a skeleton is never served by
mistake.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import duckdb

from dpmagic.gate.engine import count_error_of
from dpmagic.gate.policy import DEFAULT_QUANTUM_MS, PolicyError, parse_policy

# DuckDB type names (without precision) -> the policy's column types.
_TYPES: dict[str, str] = {
    **dict.fromkeys(
        (
            "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT",
            "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT",
        ),
        "int",
    ),
    **dict.fromkeys(("FLOAT", "DOUBLE", "DECIMAL"), "float"),
    "BOOLEAN": "bool",
    "DATE": "date",
    "VARCHAR": "str",
}  # fmt: skip
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
PLACEHOLDER = "TODO(dpmagic init)"
_COLUMNS_HEADER = re.compile(r"^\s*\[datasets\.(?:[^.\]]+|\"[^\"]*\")\.tables\.(.+)\.columns\]")


class InitError(ValueError):
    """The skeleton cannot be written; the message says why in one line."""


def describe(path: Path) -> list[tuple[str, str | None]]:
    """(column, DuckDB type) for a CSV or Parquet file, from its schema only: a
    Parquet file's declared types; a CSV declares none, so its types are None (the
    names are read as the gate's load reads them, the types it sniffs are dropped)."""
    declared = path.suffix.lower() == ".parquet"
    reader = "read_parquet" if declared else "read_csv_auto"
    con = duckdb.connect()
    try:
        rows = con.execute(f"DESCRIBE SELECT * FROM {reader}(?)", [str(path)]).fetchall()
    except duckdb.Error as exc:
        raise InitError(f"{path}: cannot read its schema: {str(exc).splitlines()[0]}") from None
    finally:
        con.close()
    return [(str(name), str(dtype) if declared else None) for name, dtype, *_ in rows]


def skeleton(
    files: list[Path],
    privacy_unit: str | None,
    dataset: str,
    out: Path,
    row_level: bool = False,
) -> str:
    """The TOML text of a policy for ``files``, written to live at ``out``. With
    ``row_level`` each row is one person: with a ``privacy_unit`` every table declares
    ``max_rows_per_unit = 1``; without one, the dataset has no unit (each row is its
    own) and bounds of 1 × 1."""
    tables: dict[str, tuple[Path, list[tuple[str, str | None]]]] = {}
    for path in files:
        if not path.is_file():
            raise InitError(f"{path}: no such file")
        name = _table_name(path)
        if name in tables:
            raise InitError(f"two files would both become table {name!r}: rename one")
        columns = describe(path)
        names = ", ".join(c for c, _ in columns)
        if privacy_unit is None and row_level:
            tables[name] = (path, columns)
            continue
        if privacy_unit is None:
            raise InitError(
                f"name the column that identifies a person with --privacy-unit "
                f"({path.name} has {names}), or pass --row-level if each row is a person"
            )
        if privacy_unit.lower() not in {c.lower() for c, _ in columns}:
            raise InitError(
                f"{path.name}: has no privacy unit column {privacy_unit!r} (it has {names})"
            )
        tables[name] = (path, columns)

    base = out.resolve().parent
    sources = ", ".join(
        f"{_key(t)} = {_string(os.path.relpath(p.resolve(), base))}" for t, (p, _) in tables.items()
    )
    lines = [
        "# Policy skeleton written by `dpmagic init` from the files' schemas only.",
        f"# Before serving it, settle every {PLACEHOLDER} below: declare public bounds",
        "# for the numeric columns you will aggregate and public_values for the columns",
        "# you will GROUP BY, from what you know of the domain, never from the data,",
        "# or delete the comment to leave the column without. `dpmagic serve` refuses",
        "# this file while one is left. Then review the budgets.",
        *(
            [
                "# A CSV file declares no column types, and a type guessed from its values",
                "# would publish them (one person's fraction makes a column of whole numbers",
                '# float): its columns are written "str", each with a TODO asking for its',
                "# type. Their names come from the file's first line: check that it is a",
                "# header, not a person's row.",
            ]
            if any(dtype is None for _, cols in tables.values() for _, dtype in cols)
            else []
        ),
        "",
        "[gate]",
        'state_dir = "state"          # ledger and audit log, next to this file',
        'accountant = "pure"',
        f"response_quantum_ms = {DEFAULT_QUANTUM_MS:g}  # replies leave on these ticks (0 = off)",
        "",
        f"[datasets.{_key(dataset)}]",
        f"sources = {{ {sources} }}",
        *_unit_lines(privacy_unit, row_level),
        "user_budget = { epsilon = 10.0 }",
        "notebook_budget = { epsilon = 3.0 }",
        "query_default = { epsilon = 0.1 }",
        "# What all users together may spend: the number you can promise the data's",
        "# subjects (per-user budgets alone protect nothing against users who pool",
        "# their answers). With many users, set it, and share releases:",
        '# dataset_budget = { epsilon = 30.0, renew = "month" }',
        '# share_releases = "everyone"',
    ]
    for table, (_, columns) in tables.items():
        if row_level and privacy_unit is not None:
            lines += [
                "",
                f"[datasets.{_key(dataset)}.tables.{_key(table)}]",
                f"max_rows_per_unit = 1        # each row is one person: a count's 95% error "
                f"at ε = 1 is ±{count_error_of(1)}",
            ]
        lines += ["", f"[datasets.{_key(dataset)}.tables.{_key(table)}.columns]"]
        lines += [_column(name, dtype, privacy_unit or "") for name, dtype in columns]
    text = "\n".join(lines) + "\n"
    # The skeleton must load as it is, so the owner starts from a valid file.
    parse_policy(tomllib.loads(text), out.resolve())
    return text


def write_skeleton(
    files: list[Path],
    privacy_unit: str | None,
    out: Path,
    *,
    dataset: str | None = None,
    force: bool = False,
    row_level: bool = False,
) -> Path:
    """Write the skeleton to ``out``; refuses to replace a file unless ``force``."""
    name = dataset or dataset_name(files)
    try:
        text = skeleton(files, privacy_unit, name, out, row_level)
    except PolicyError as exc:
        raise InitError(str(exc)) from None
    # The policy is the gate's file: readable by its owner only (SECURITY.md, Deployment rules).
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(out, flags, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
    except FileExistsError:
        raise InitError(f"{out} exists; pass --force to replace it") from None
    except OSError as exc:
        raise InitError(f"{out}: {exc.strerror}") from None
    return out


def _unit_lines(privacy_unit: str | None, row_level: bool) -> list[str]:
    """The dataset's unit and contribution bounds, each bound with what it costs: a
    count's 95% error at ε = 1 (``engine.count_error_of``)."""
    if privacy_unit is None:
        return [
            "# No privacy unit: each row is one person (--row-level), one row in one group.",
            'neighbouring = "add_remove"',
            "max_partitions = 1",
            "max_rows_per_partition = 1",
        ]
    groups, rows = (1, 1) if row_level else (4, 4)
    return [
        f"privacy_unit = {_string(privacy_unit)}",
        'neighbouring = "add_remove"',
        f"max_partitions = {groups}           # groups one unit may touch: a grouped count's "
        f"95% error at ε = 1 is ±{count_error_of(groups * rows)}",
        f"max_rows_per_partition = {rows}   # rows one unit may add to each group: a count's "
        f"95% error at ε = 1 is ±{count_error_of(rows)}",
    ]


def _column(name: str, dtype: str | None, privacy_unit: str) -> str:
    if dtype is None:  # a CSV's column: the owner chooses its type
        decl = f"{_key(name)} = {{ type = {_string('str')} }}  # {PLACEHOLDER}: type = ?"
        if name.lower() == privacy_unit.lower():
            return f"{decl}  (int, float, str, bool or date)"
        return (
            f"{decl}, then lower = ?, upper = ? or public_values = [...]  (type: int, float, "
            "str, bool or date; public bounds to SUM/AVG it, public_values to GROUP BY it)"
        )
    base_type = dtype.split("(")[0].upper()
    ctype = _TYPES.get(base_type)
    if ctype is None:
        return f"# {_key(name)}: {dtype} has no policy type yet; left undeclared (not queryable)"
    decl = f"{_key(name)} = {{ type = {_string(ctype)} }}"
    if name.lower() == privacy_unit.lower():
        return decl
    if ctype in ("int", "float"):
        return f"{decl}  # {PLACEHOLDER}: lower = ?, upper = ?  (public bounds, to SUM/AVG it" + (
            "; or public_values = [...] to GROUP BY it)" if ctype == "int" else ")"
        )
    if ctype == "str":
        return f"{decl}  # {PLACEHOLDER}: public_values = [...]  (to GROUP BY it)"
    return decl


def unfilled(policy_text: str) -> list[str]:
    """``table.column (what)`` for each placeholder still in a policy's text.

    Placeholders are comments, invisible to TOML, so the text is read line by
    line, each under the last ``[...columns]`` header seen. A line that is all
    comment (the file's own instructions, a column commented out) has none.
    """
    return [f"{column} ({', '.join(names)})" for column, names in _placeholders(policy_text)]


def untyped(policy_text: str) -> list[str]:
    """``table.column`` for each column whose placeholder asks for its type (a CSV's)."""
    return [column for column, names in _placeholders(policy_text) if "type" in names]


def _placeholders(policy_text: str) -> list[tuple[str, list[str]]]:
    """(``table.column``, the keys it asks for) for each placeholder, in order."""
    table = "?"
    found = []
    for line in policy_text.splitlines():
        header = _COLUMNS_HEADER.match(line)
        if header:
            table = header.group(1).strip('"')
        elif PLACEHOLDER in line and not line.lstrip().startswith("#"):
            column = line.split("=", 1)[0].strip().strip('"')
            what = line.split(PLACEHOLDER, 1)[1].lstrip(": ").split("  ")[0]
            found.append((f"{table}.{column}", re.findall(r"(\w+) = ", what) or [what]))
    return found


def dataset_name(files: list[Path]) -> str:
    """Named for the data, never for the policy file (``policy.toml`` would
    make it "policy"): one file's name, or the folder the files share."""
    folders = {p.resolve().parent for p in files}
    name = _table_name(files[0]) if len(files) == 1 or len(folders) > 1 else folders.pop().name
    return re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "data"


def _table_name(path: Path) -> str:
    return path.name.split(".")[0].lower()


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else _string(name)


def _string(value: str) -> str:
    # A JSON string with ASCII escapes is a valid TOML basic string.
    return json.dumps(value)
