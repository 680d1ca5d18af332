"""``dpmagic init`` asks per table which column holds the person (offering the foreign
keys a DuckDB database declares, and saying why one cannot be a link yet) and how
many rows one person may have there (``max_rows_per_unit``, suggested from the data's
rows per unit, shown to the owner alone), then writes ``links`` and
``max_rows_per_unit`` a real gate loads and answers with.

Real DuckDB files with declared foreign keys and real CSV files; the questions are
answered by a script (:class:`Script`), or through ``sys.stdin`` for the command."""

from __future__ import annotations

import hashlib
import io
import re
import tomllib
from pathlib import Path

import duckdb
import pytest

from dpmagic.commands.cli import main
from dpmagic.commands.init_policy import (
    Answers,
    InitError,
    nice_ceiling,
    parse_answers,
    plan,
    read_data,
    report,
    write_plan,
    write_skeleton,
)
from dpmagic.gate.engine import Engine, count_error_of
from dpmagic.gate.policy import load_policy

# People 0..299; person p has p % 4 + 1 visits, and person 7 has 37: the 99th
# percentile of visits per person is 4, the most 37.
PEOPLE = 300
HEAVY, HEAVY_VISITS = 7, 37


class Script:
    """The owner at a terminal, answering from a list: ``said`` is everything shown
    (explanations and questions, in order); the end of the list is the end of stdin."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.said: list[str] = []
        self.questions: list[str] = []

    def say(self, text: str) -> None:
        self.said.append(text)

    def ask(self, question: str) -> str:
        self.said.append(question)
        self.questions.append(question)
        if not self.answers:
            raise EOFError
        return self.answers.pop(0)

    @property
    def text(self) -> str:
        return "\n".join(self.said)


def _visits(person: int) -> int:
    return HEAVY_VISITS if person == HEAVY else person % 4 + 1


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    """A DuckDB file declaring visits.patient → people.person_id (a person's column) and
    rx.visit_id → visits.visit_id (a visit's key: a chain, rx → visits → people)."""
    path = tmp_path / "data" / "shop.duckdb"
    path.parent.mkdir()
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE people (person_id INTEGER PRIMARY KEY, age INTEGER, region VARCHAR)")
    con.execute(
        "CREATE TABLE visits (visit_id INTEGER PRIMARY KEY, "
        "patient INTEGER REFERENCES people (person_id), cost DOUBLE)"
    )
    con.execute("CREATE TABLE rx (visit_id INTEGER REFERENCES visits (visit_id), drug VARCHAR)")
    con.execute(
        f"INSERT INTO people SELECT range, 20 + range % 60, "
        f"CASE WHEN range % 2 = 0 THEN 'N' ELSE 'S' END FROM range({PEOPLE})"
    )
    con.execute(
        "INSERT INTO visits SELECT row_number() OVER () - 1, p, (p * 13) % 500 FROM "
        f"(SELECT p, unnest(range(CASE WHEN p = {HEAVY} THEN {HEAVY_VISITS} ELSE p % 4 + 1 "
        f"END)) FROM (SELECT range AS p FROM range({PEOPLE})))"
    )
    assert con.execute("SELECT count(*) FROM visits").fetchone() == (
        sum(_visits(p) for p in range(PEOPLE)),
    )
    con.execute("INSERT INTO rx SELECT range % 100, 'd' || (range % 3) FROM range(250)")
    con.close()
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _answer(policy: Path, sql: str) -> list[list[object]]:
    """The rows a real gate (the engine behind ``dpmagic serve``) answers."""
    engine = Engine(load_policy(policy))
    try:
        reply = engine.query("alice", {"sql": sql, "epsilon": 1.0, "fresh": True})
    finally:
        engine.close()
    return reply["rows"]  # type: ignore[return-value]


def test_the_owner_answers_per_table_and_a_gate_answers_with_the_policy(
    shop: Path, tmp_path: Path
) -> None:
    before = _digest(shop)
    owner = Script("", "", "", "", "")  # each default: people 1; visits and rx their keys
    out = tmp_path / "policy.toml"
    write_skeleton([shop], "person_id", out, prompter=owner)
    # Asked per table, in order: each of people's, visits' and rx's questions.
    asked = ["people", "visits", "visits", "rx", "rx"]
    assert [q.split(":")[0] for q in owner.questions] == asked
    # people: unique in the data, so one row per person is offered first.
    assert "people: each person_id has one row in the data (300 of them)" in owner.text
    assert "people: most rows one person may have here? [1] " in owner.questions
    # visits: its declared key offered as the default link.
    assert "declared foreign key visits.patient → people.person_id" in owner.text
    assert "visits: which column holds the person? [patient=people.person_id] " in owner.text
    # The owner sees the data's own counts (theirs), and the suggestion they lead to.
    assert f"median 2, 99% have at most 4, the most {HEAVY_VISITS}." in owner.text
    assert "visits: most rows one person may have here? [4] " in owner.questions
    # rx: its key names a visit, whose person the gate reads along it (a chain); its
    # rows are counted per person along the same chain (rx row r names visit r % 100).
    assert "rx: which column holds the person? [visit_id=visits.visit_id] " in owner.text
    rx_rows = [sum(1 for r in range(250) if r % 100 == v) for v in range(100)]
    visit_person = [p for p in range(PEOPLE) for _ in range(_visits(p))]
    per_person: dict[int, int] = {}
    for v, n in enumerate(rx_rows):
        per_person[visit_person[v]] = per_person.get(visit_person[v], 0) + n
    assert f"the most {max(per_person.values())}." in owner.text

    raw = tomllib.loads(out.read_text())["datasets"]["shop"]
    assert raw["database"] == "data/shop.duckdb" and "sources" not in raw
    assert set(raw["tables"]) == {"people", "visits", "rx"}
    assert raw["tables"]["visits"]["links"] == {"patient": "people.person_id"}
    assert raw["tables"]["rx"]["links"] == {"visit_id": "visits.visit_id"}
    assert "unit" not in raw["tables"]["rx"]
    assert raw["tables"]["people"]["max_rows_per_unit"] == 1
    assert raw["tables"]["visits"]["max_rows_per_unit"] == 4
    # The counts went to the owner only: the policy, public, holds the bound alone.
    assert str(HEAVY_VISITS) not in re.findall(r"\d+", out.read_text())

    ds = load_policy(out).dataset("shop")
    assert ds.tables["visits"].unit == "patient" and ds.tables["people"].unit == "person_id"
    assert (ds.tables["people"].max_rows, ds.tables["visits"].max_rows) == (1, 4)
    # A real gate answers: the join is allowed only through the link.
    ((people,),) = _answer(out, "SELECT COUNT(*) AS n FROM people")
    assert abs(people - PEOPLE) <= 20  # ±3 is the 95% error; 20 fails ~1 in 5e8
    ((joined,),) = _answer(
        out,
        "SELECT COUNT(*) AS n FROM visits AS v JOIN people AS p ON v.patient = p.person_id",
    )
    kept = sum(min(_visits(p), 4) for p in range(PEOPLE))  # rows past the bound left out
    assert abs(joined - kept) <= 60  # ±12 is the 95% error at 4
    # And along the chain: prescriptions joined to their visit, answered as one person's.
    ((prescribed,),) = _answer(
        out, "SELECT COUNT(*) AS n FROM rx JOIN visits ON rx.visit_id = visits.visit_id"
    )
    rx = ds.tables["rx"].max_rows or ds.max_rows_per_partition
    kept = sum(min(n, rx, ds.max_rows_per_partition) for n in per_person.values())
    assert abs(prescribed - kept) <= 60  # ±12 is the 95% error at 4
    assert _digest(shop) == before  # read-only: init changed nothing in the owner's file


def test_without_a_terminal_declared_keys_are_written_and_no_count(
    shop: Path, tmp_path: Path
) -> None:
    """Nobody to ask: the database's own foreign keys (schema) go in; a bound from the
    data's counts does not, and the report says how to add one."""
    out = tmp_path / "policy.toml"
    settled = plan(read_data([shop]), "person_id", parse_answers(skip=["rx"]))
    write_plan(settled, out)
    ds = load_policy(out).dataset("shop")
    assert ds.tables["visits"].links == {"patient": "people.person_id"}
    assert ds.tables["people"].max_rows is None and ds.tables["visits"].max_rows is None
    assert "# max_rows_per_unit = ?" in out.read_text()
    said = "\n".join(report(settled))
    assert "visits: the person is patient, linked to people.person_id (declared foreign key" in said
    assert "--rows-per-unit TABLE=N" in said and "people, visits" in said


def test_a_declared_key_to_a_visit_is_written_as_a_chain_without_asking(
    shop: Path, tmp_path: Path
) -> None:
    """Schema, not data: the one declared key of rx names a visit; the policy links it,
    and the gate reads each prescription's person along it."""
    out = tmp_path / "policy.toml"
    settled = plan(read_data([shop]), "person_id", parse_answers())
    write_plan(settled, out)
    ds = load_policy(out).dataset("shop")
    assert ds.tables["rx"].links == {"visit_id": "visits.visit_id"}
    assert ds.tables["rx"].via is not None and ds.tables["rx"].via.table == "visits"
    said = "\n".join(report(settled))
    assert "rx: the person is read along visit_id → visits.visit_id (declared foreign key" in said


def test_a_link_to_a_column_that_is_no_key_is_refused(shop: Path, tmp_path: Path) -> None:
    con = duckdb.connect(str(shop))
    con.execute("CREATE TABLE notes (visit_cost DOUBLE)")
    con.close()
    out = tmp_path / "policy.toml"
    with pytest.raises(InitError) as info:
        write_skeleton([shop], "person_id", out, answers=parse_answers(
            links=["notes.visit_cost=visits.cost"]))  # fmt: skip
    message = str(info.value)
    assert "visits.cost is neither the person's column of visits (patient) nor a key" in message
    assert "\n" not in message and not out.exists()


def test_yes_takes_each_suggestion_and_asks_nothing(shop: Path, tmp_path: Path) -> None:
    owner = Script()
    out = tmp_path / "policy.toml"
    write_skeleton(
        [shop], "person_id", out, answers=parse_answers(skip=["rx"], yes=True), prompter=owner
    )
    assert owner.said == []
    tables = load_policy(out).dataset(None).tables
    assert (tables["people"].max_rows, tables["visits"].max_rows) == (1, 4)
    assert str(HEAVY_VISITS) not in re.findall(r"\d+", out.read_text())


def test_wrong_answers_are_asked_again_and_say_why(shop: Path, tmp_path: Path) -> None:
    owner = Script(
        "0",  # people's bound: not ≥ 1
        "none",  # people: no bound
        "nope",  # visits: no such column
        "patient=people.age",  # not people's unit column
        "patient=people.person_id",
        "many",  # visits' bound: not a number
        "6",
        "visit_id=visits.nope",  # rx: no such column
        "skip",
    )
    out = tmp_path / "policy.toml"
    write_skeleton([shop], "person_id", out, prompter=owner)
    assert owner.answers == []
    assert "  '0': answer a whole number ≥ 1, or none (or Enter: 1)" in owner.said
    assert any(s.startswith("  'nope' is not a column of visits") for s in owner.said)
    assert any("people.age is neither the person's column of people" in s for s in owner.said)
    assert any("visits has no column 'nope'" in s for s in owner.said)
    tables = load_policy(out).dataset(None).tables
    assert (tables["people"].max_rows, tables["visits"].max_rows) == (None, 6)
    assert tables["visits"].links == {"patient": "people.person_id"}
    assert "rx" not in tables


def test_stdin_ending_is_an_error_and_writes_nothing(shop: Path, tmp_path: Path) -> None:
    out = tmp_path / "policy.toml"
    with pytest.raises(InitError, match="stdin ended before init's question about visits"):
        write_skeleton([shop], "person_id", out, prompter=Script("1"))
    assert not out.exists()


def test_flags_settle_every_question(shop: Path, tmp_path: Path) -> None:
    owner = Script()  # asked nothing: the flags said it all
    answers = parse_answers(
        links=["visits.patient=people.person_id"],
        rows=["people=1", "visits=none"],
        skip=["rx"],
    )
    out = tmp_path / "policy.toml"
    write_skeleton([shop], "person_id", out, answers=answers, prompter=owner)
    assert owner.said == []
    tables = load_policy(out).dataset(None).tables
    assert (tables["people"].max_rows, tables["visits"].max_rows) == (1, None)
    assert 'links = { patient = "people.person_id" }  # from --link' in out.read_text()


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ({"links": ["visits.patient"]}, "--link visits.patient: must be TABLE.COLUMN=TABLE.COLUMN"),
        ({"rows": ["visits=0"]}, "--rows-per-unit visits=0: must be TABLE=N"),
        ({"rows": ["visits"]}, "--rows-per-unit visits: must be TABLE=N"),
        ({"units": ["visits"]}, "--unit visits: must be TABLE.COLUMN"),
        ({"skip": ["nosuch"]}, "--skip nosuch: no such table (there are people, rx, visits)"),
        ({"links": ["visits.nope=people.person_id"]}, "visits has no column 'nope'"),
        ({"links": ["visits.patient=people.nope"]}, "=people.nope: no such table and column"),
        (
            {"links": ["visits.patient=people.age"], "skip": ["rx"]},
            "people.age is neither the person's column of people (person_id) nor a key",
        ),
    ],
)
def test_a_bad_flag_is_one_clear_line(
    shop: Path, tmp_path: Path, flags: dict[str, list[str]], said: str
) -> None:
    out = tmp_path / "policy.toml"
    with pytest.raises(InitError) as info:
        write_skeleton([shop], "person_id", out, answers=parse_answers(**flags))
    assert said in str(info.value) and "\n" not in str(info.value)
    assert not out.exists()


def test_the_privacy_unit_is_asked_offering_the_referenced_column(
    shop: Path, tmp_path: Path
) -> None:
    owner = Script("", "1", "", "", "skip")
    out = tmp_path / "policy.toml"
    write_skeleton([shop], None, out, prompter=owner)
    assert owner.questions[0] == "privacy unit? [person_id] "
    assert "  visits: visit_id, patient, cost" in owner.said
    assert load_policy(out).dataset(None).privacy_unit == "person_id"


def test_an_existing_policy_is_kept_and_nothing_asked(shop: Path, tmp_path: Path) -> None:
    out = tmp_path / "policy.toml"
    out.write_text("# mine\n")
    owner = Script("", "", "", "skip")
    with pytest.raises(InitError, match="exists; pass --force"):
        write_skeleton([shop], "person_id", out, prompter=owner)
    assert owner.said == [] and out.read_text() == "# mine\n"


def test_a_database_with_files_is_refused(shop: Path, tmp_path: Path) -> None:
    csv = tmp_path / "extra.csv"
    csv.write_text("person_id,x\n1,2\n")
    with pytest.raises(InitError, match="a DuckDB database, a dataset of its own: give it alone"):
        write_skeleton([shop, csv], "person_id", tmp_path / "p.toml")


def test_csv_files_a_unique_unit_and_a_link_by_answer(tmp_path: Path) -> None:
    """CSV files declare no keys: the owner names the link; ``patients`` is one row per
    patient in the data, ``visits`` up to 3 per patient."""
    folder = tmp_path / "clinic"
    folder.mkdir()
    (folder / "patients.csv").write_text(
        "person_id,age\n" + "".join(f"{p},{30 + p % 40}\n" for p in range(120))
    )
    (folder / "visits.csv").write_text(
        "pid,cost\n" + "".join(f"{p},{p % 90}\n" for p in range(120) for _ in range(p % 3 + 1))
    )
    owner = Script("", "pid=patients.person_id", "")
    out = tmp_path / "policy.toml"
    write_skeleton(
        [folder / "patients.csv", folder / "visits.csv"], "person_id", out, prompter=owner
    )
    assert "visits has no column 'person_id' (it has pid, cost)." in owner.said
    assert "visits: most rows one person may have here? [3] " in owner.questions
    raw = tomllib.loads(out.read_text())["datasets"]["clinic"]
    assert raw["sources"] == {"patients": "clinic/patients.csv", "visits": "clinic/visits.csv"}
    assert raw["tables"]["visits"]["links"] == {"pid": "patients.person_id"}
    tables = load_policy(out).dataset("clinic").tables
    assert (tables["patients"].max_rows, tables["visits"].max_rows) == (1, 3)
    # The columns stay "str" until the owner types them: the join still answers.
    ((n,),) = _answer(
        out, "SELECT COUNT(*) AS n FROM visits AS v JOIN patients AS p ON v.pid = p.person_id"
    )
    assert abs(n - 240) <= 60


def test_a_link_to_a_table_asked_later_settles_it(tmp_path: Path) -> None:
    """Neither CSV has a column named for the unit; ``visits`` comes first and links to
    ``people.id``, which makes ``id`` people's unit column: asked or by flags."""
    (tmp_path / "people.csv").write_text("id,age\n1,30\n2,40\n")
    (tmp_path / "visits.csv").write_text("pid,cost\n1,5\n1,6\n2,7\n")
    files = [tmp_path / "visits.csv", tmp_path / "people.csv"]
    owner = Script("pid=people.id", "", "")
    out = tmp_path / "policy.toml"
    write_skeleton(files, "person_id", out, prompter=owner)
    assert [q.split(":")[0] for q in owner.questions] == ["visits", "visits", "people"]
    assert "visits: most rows one person may have here? [2] " in owner.questions
    tables = load_policy(out).dataset(None).tables
    assert tables["people"].unit == "id" and tables["visits"].links == {"pid": "people.id"}
    assert (tables["people"].max_rows, tables["visits"].max_rows) == (1, 2)
    flags = parse_answers(links=["visits.pid=people.id"], rows=["people=1", "visits=2"])
    write_skeleton(files, "person_id", out, answers=flags, force=True)
    assert load_policy(out).dataset(None).tables == tables
    # A unit column of another name, said alone: the table's own column.
    write_skeleton(files, "person_id", out, answers=parse_answers(units=["people.id"],
                   links=["visits.pid=people.id"]), force=True)  # fmt: skip
    assert load_policy(out).dataset(None).tables["people"].unit == "id"


def test_nice_ceiling_rounds_up_to_a_coarse_step() -> None:
    assert [nice_ceiling(v) for v in (1, 2, 4, 5, 7, 9, 11, 37, 61, 999)] == [
        1, 2, 4, 5, 8, 10, 20, 40, 80, 1000,
    ]  # fmt: skip
    assert count_error_of(4) == 12  # what the questions quote at the suggestion


class _TTY(io.StringIO):
    """Lines typed at a terminal: what ``input()`` reads when stdin is one."""

    def isatty(self) -> bool:
        return True


def test_the_command_asks_at_a_terminal(
    shop: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", _TTY("\n\n3\nskip\n"))
    out = tmp_path / "policy.toml"
    assert main(["init", "--from", str(shop), "--privacy-unit", "person_id", "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "people: most rows one person may have here? [1] " in said
    assert "visits: which column holds the person? [patient=people.person_id] " in said
    assert "  people: the person is person_id; max_rows_per_unit = 1 (answered)" in said
    assert "  visits: the person is patient, linked to people.person_id" in said
    assert "  rx: left out (the owner's answer at init's question)" in said
    tables = load_policy(out).dataset(None).tables
    assert (tables["people"].max_rows, tables["visits"].max_rows) == (1, 3)


def test_the_command_without_a_terminal_asks_nothing(
    shop: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "policy.toml"
    args = ["init", str(shop), "--privacy-unit", "person_id", "-o", str(out)]
    assert main(args) == 0  # every table's person is found by name or declared key
    capsys.readouterr()
    assert main([*args, "--skip", "rx", "--rows-per-unit", "people=1", "--force"]) == 0
    said = capsys.readouterr().out
    assert "asked nothing (stdin is not a terminal)" in said and "data for visits:" in said
    assert main([*args, "--skip", "rx", "--yes", "--force"]) == 0
    tables = load_policy(out).dataset(None).tables
    assert (tables["people"].max_rows, tables["visits"].max_rows) == (1, 4)
    assert main([*args, "--link", "visits.patient", "--force"]) == 2
    assert "must be TABLE.COLUMN=TABLE.COLUMN" in capsys.readouterr().err


def test_row_level_still_means_one_row_per_table_without_asking(shop: Path, tmp_path: Path) -> None:
    owner = Script("", "skip")  # visits' and rx's unit questions only: no bound is asked
    out = tmp_path / "policy.toml"
    write_skeleton([shop], "person_id", out, row_level=True, prompter=owner)
    assert [q.split(":")[0] for q in owner.questions] == ["visits", "rx"]
    tables = load_policy(out).dataset(None).tables
    assert {t.max_rows for t in tables.values()} == {1}


def test_answers_default_to_nothing() -> None:
    assert Answers() == parse_answers()


def test_a_composite_key_and_a_key_to_itself_are_shown_not_written(tmp_path: Path) -> None:
    """``links`` names one column; a table's key to itself is no way to a person;
    an empty table offers no bound (nothing to count)."""
    path = tmp_path / "family.data"  # a DuckDB file whatever its name
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE people (person_id INTEGER PRIMARY KEY, mother INTEGER "
        "REFERENCES people (person_id), home INTEGER, UNIQUE (person_id, home))"
    )
    con.execute(
        "CREATE TABLE moves (pid INTEGER, home INTEGER, "
        "FOREIGN KEY (pid, home) REFERENCES people (person_id, home))"
    )
    con.execute("CREATE TABLE notes (person_id INTEGER, note VARCHAR)")
    con.execute("INSERT INTO people SELECT range, NULL, range % 5 FROM range(50)")
    con.execute("INSERT INTO moves SELECT range % 50, range % 5 FROM range(120)")
    con.close()
    owner = Script("", "", "pid", "")  # notes, people (named for the unit), then moves
    out = tmp_path / "policy.toml"
    write_skeleton([path], "person_id", out, prompter=owner)
    assert [q.split(":")[0] for q in owner.questions] == ["notes", "people", "moves", "moves"]
    assert (
        "  declared foreign key moves.pid, home → people.person_id, home: cannot be a link "
        "yet: a link is one column; this key has several"
    ) in owner.said
    assert "notes has no rows with a person_id: nothing to suggest from." in owner.said
    assert "notes: most rows one person may have here? [none] " in owner.questions
    raw = tomllib.loads(out.read_text())["datasets"]["family"]
    assert raw["database"] == "family.data"
    assert "links" not in raw["tables"]["people"] and "links" not in raw["tables"]["moves"]
    tables = load_policy(out).dataset(None).tables
    assert tables["moves"].unit == "pid" and tables["notes"].max_rows is None
    assert (tables["people"].max_rows, tables["moves"].max_rows) == (1, 3)


class _Interrupted(_TTY):
    """A terminal where the owner presses Ctrl-C at the first question."""

    def readline(self, size: int | None = -1) -> str:
        raise KeyboardInterrupt


def test_ctrl_c_at_a_question_stops_and_writes_nothing(
    shop: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", _Interrupted())
    out = tmp_path / "policy.toml"
    assert main(["init", str(shop), "--privacy-unit", "person_id", "-o", str(out)]) == 130
    assert f"dpmagic: init stopped: {out} not written" in capsys.readouterr().err
    assert not out.exists()
