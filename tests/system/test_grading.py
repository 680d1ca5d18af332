"""Grading: re-runs replay for free, transcripts, offline replay, auto-loading.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject
are in tests/unit/test_grading.py, the kernel helpers in tests/kernels.py."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import sysconfig
from importlib.resources import files
from pathlib import Path

import nbformat
import pytest
from nbformat import NotebookNode

from dpmagic.client.errors import DPError, QueryRefused
from dpmagic.client.http_gate import Gate, connect
from dpmagic.client.transcript import TranscriptGate
from dpmagic.commands.cli import main
from dpmagic.commands.demo import GateProcess as DemoGate
from dpmagic.commands.demo import prepare_example
from dpmagic.kernel import write_spec
from tests.conftest import GateProcess
from tests.kernels import table_of

COUNT = "SELECT COUNT(*) AS n FROM t"
BY_SEX = "SELECT sex, AVG(age) AS mean_age FROM t WHERE age >= $lo GROUP BY sex"
NOTEBOOK = "hw1.ipynb"


def export(capsys: pytest.CaptureFixture[str], policy: Path, out: Path, notebook: str) -> int:
    user = _me()
    code = main(
        ["transcript", "export", "--policy", str(policy), "--user", user, "--notebook", notebook,
         "-o", str(out)]
    )  # fmt: skip
    capsys.readouterr()
    return code


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture
def released(gate: GateProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """A notebook's answers from a real gate, and their exported transcript."""
    client = Gate(gate.address)
    first = [
        client.query(COUNT, epsilon=0.2, notebook=NOTEBOOK),
        client.query(BY_SEX, epsilon=0.5, params={"lo": 30}, notebook=NOTEBOOK),
        client.query(COUNT, notebook=NOTEBOOK),  # at the policy's default ε
    ]
    # Released in another notebook first, then replayed in this one.
    client.query("SELECT SUM(age) AS s FROM t", epsilon=0.3, notebook="scratch.ipynb")
    client.query("SELECT SUM(age) AS s FROM t", epsilon=0.3, notebook=NOTEBOOK)
    replays = [
        client.query(COUNT, epsilon=0.2, notebook=NOTEBOOK),
        client.query(BY_SEX, epsilon=0.5, params={"lo": 30}, notebook=NOTEBOOK),
        client.query(COUNT, notebook=NOTEBOOK),
        client.query("SELECT SUM(age) AS s FROM t", epsilon=0.3, notebook=NOTEBOOK),
    ]
    path = tmp_path / "hw1.transcript.json"
    assert export(capsys, gate.policy, path, NOTEBOOK) == 0
    return gate, first, replays, path


def test_a_transcript_replays_what_the_gate_replays(released) -> None:
    gate, first, replays, path = released
    assert all(r.replayed for r in replays)
    assert [r.rows for r in replays[:3]] == [r.rows for r in first]
    offline = TranscriptGate(path)
    again = [
        offline.query(COUNT, epsilon=0.2),
        offline.query(BY_SEX, epsilon=0.5, params={"lo": 30}),
        offline.query(f"  {COUNT}\n"),
        offline.query("SELECT SUM(age) AS s FROM t", epsilon=0.3),
    ]
    for live, replay in zip(replays, again, strict=True):
        assert replay.replayed and replay.cost == {"epsilon": 0.0, "delta": 0.0}
        assert (replay.columns, replay.rows, replay.accuracy) == (
            live.columns,
            live.rows,
            live.accuracy,
        )
        assert replay.budget == live.budget
        assert replay._repr_html_() == live._repr_html_()
    assert offline.budget() == {k: v for k, v in Gate(gate.address).budget(
        notebook=NOTEBOOK).items()}  # fmt: skip
    assert offline.schema()["tables"] == Gate(gate.address).schema()["tables"]
    live_history = Gate(gate.address).history(notebook=NOTEBOOK)
    assert offline.history() == {**live_history, "datasets": ["d"]}
    assert offline.history(limit=2)["entries"] == live_history["entries"][-2:]


@pytest.mark.parametrize(
    ("sql", "options"),
    [
        ("SELECT COUNT(*) AS m FROM t", {"epsilon": 0.2}),  # never asked
        (COUNT, {"epsilon": 0.25}),  # asked at another ε
        (COUNT, {"epsilon": 0.2, "delta": 1e-6}),
        (BY_SEX, {"epsilon": 0.5, "params": {"lo": 31}}),  # another parameter value
        (BY_SEX, {"epsilon": 0.5}),
        ("SELECT * FROM t", {}),
    ],
)
def test_a_transcript_refuses_anything_else(released, sql: str, options: dict) -> None:
    offline = TranscriptGate(released[3])
    with pytest.raises(QueryRefused, match="not in the transcript"):
        offline.query(sql, **options)
    with pytest.raises(QueryRefused, match="no answers about dataset 'other'"):
        offline.query(COUNT, epsilon=0.2, dataset="other")


def test_a_dry_run_from_a_transcript_shows_the_price(released) -> None:
    result = TranscriptGate(released[3]).query(COUNT, epsilon=0.2, dry_run=True)
    assert result.dry_run and not result.rows and result.cost["epsilon"] == 0.2


def test_the_signature_catches_an_edited_answer(
    released, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate, _, _, path = released
    policy = str(gate.policy)
    assert main(["transcript", "verify", "--policy", policy, str(path)]) == 0
    assert "signed by this gate" in capsys.readouterr().out
    assert (gate.state_dir / "transcript.key").stat().st_mode & 0o777 == 0o600

    forged = json.loads(path.read_text())
    forged["answers"][0]["reply"]["rows"][0][0] += 1
    bad = tmp_path / "forged.json"
    bad.write_text(json.dumps(forged))
    assert main(["transcript", "verify", "--policy", policy, str(bad)]) == 1
    assert "the signature does not match" in capsys.readouterr().err


def test_export_of_a_notebook_with_nothing_released(
    gate: GateProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Gate(gate.address).query(COUNT, notebook="a.ipynb")
    code = main(
        ["transcript", "export", "--policy", str(gate.policy), "--user", _me(),
         "--notebook", "b.ipynb", "-o", str(tmp_path / "t.json")]
    )  # fmt: skip
    assert code == 2
    assert "has no released answers in notebook 'b.ipynb'" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


def test_connect_picks_the_transcript(
    released, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = released[3]
    monkeypatch.setenv("DPMAGIC_GATE", "unix:/nowhere/gate.sock")
    monkeypatch.setenv("DPMAGIC_TRANSCRIPT", str(path))
    assert isinstance(connect(), TranscriptGate)
    assert isinstance(connect("unix:/other.sock"), Gate)
    assert isinstance(connect(f"transcript:{path}"), TranscriptGate)
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(DPError, match="is not a dpmagic-transcript/1 file"):
        connect(f"transcript:{tmp_path / 'junk.json'}")
    with pytest.raises(DPError, match="cannot read the transcript"):
        connect(f"transcript:{tmp_path / 'missing.json'}")


# -- the course notebook, end to end ------------------------------------------

RUNNER = """\
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, kernel_name="python3", timeout=120).execute()
nbformat.write(nb, sys.argv[2])
"""


def environment_with_autoload(root: Path) -> Path:
    """A fresh virtual environment that sees our packages, set up as a course's:
    ``dpmagic kernel install --sys-prefix --autoload``. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = sysconfig.get_paths()["purelib"]
    # An `import` line, so that our environment's own .pth files (the editable
    # install) are processed as well.
    (Path(site) / "parent_env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    done = subprocess.run(
        [python, "-m", "dpmagic", "kernel", "install", "--sys-prefix", "--autoload"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert str(root / "etc" / "ipython" / "ipython_kernel_config.py") in done.stdout
    return python


def run_notebook(python: Path, source: Path, out: Path, env: dict[str, str]) -> NotebookNode:
    subprocess.run(
        [python, "-c", RUNNER, str(source), str(out)],
        env=env, check=True, timeout=300, capture_output=True, text=True,
    )  # fmt: skip
    return nbformat.read(out, as_version=4)


def outputs(nb: NotebookNode) -> list[list[dict]]:
    """Each code cell's outputs without what varies between runs by design."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = copy.deepcopy(cell.outputs)
        for output in kept:
            output.pop("execution_count", None)
            output.get("metadata", {}).clear()
        cells.append(kept)
    return cells


def test_the_course_notebook_is_graded_for_free_and_offline(
    tmp_path: Path, short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = prepare_example(tmp_path / "clinic", patients=300)
    course = DemoGate(policy, short_dir / "course.sock", tmp_path / "gate.log")
    course.start()
    try:
        python = environment_with_autoload(tmp_path / "env")
        source = Path(str(files("dpmagic.examples").joinpath("course.ipynb")))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DPMAGIC_", "JPY_"))}
        env.update(JPY_SESSION_NAME="course.ipynb", HOME=str(tmp_path))
        live = dict(env, DPMAGIC_GATE=course.address)

        first = run_notebook(python, source, tmp_path / "run1.ipynb", live)
        spent = Gate(course.address).budget(notebook="course.ipynb")["notebook"]["spent"]
        second = run_notebook(python, source, tmp_path / "run2.ipynb", live)
        assert Gate(course.address).budget(notebook="course.ipynb")["notebook"]["spent"] == spent
        assert spent["epsilon"] == pytest.approx(1.0)

        assert export(capsys, policy, tmp_path / "course.json", "course.ipynb") == 0
    finally:
        course.stop()
    # The autograder: no gate, no network, only the transcript.
    offline = dict(env, DPMAGIC_TRANSCRIPT=str(tmp_path / "course.json"))
    third = run_notebook(python, source, tmp_path / "run3.ipynb", offline)

    assert outputs(second) == outputs(third)
    checks = outputs(third)[-1]
    assert checks[0]["text"] == "all checks passed\n"
    # The first run released what the others replay: the same tables, but it
    # was charged, so only its footers differ.
    # (%dpbudget differs by design: the second run's history has more lines.)
    sources = [c.source for c in first.cells if c.cell_type == "code"]
    for source, a, b in zip(sources, outputs(first), outputs(second), strict=True):
        html_a = [o["data"]["text/html"] for o in a if "text/html" in o.get("data", {})]
        html_b = [o["data"]["text/html"] for o in b if "text/html" in o.get("data", {})]
        if source.startswith("%%dpsql"):
            assert [table_of(h) for h in html_a] == [table_of(h) for h in html_b]
            assert "replayed" in html_b[0] and "replayed" not in html_a[0]
        elif not source.startswith("%dpbudget"):
            assert a == b
    assert "replayed" in str(outputs(third)[sources.index("%dpbudget")])


def test_the_quickstart_as_shipped_is_graded_from_its_transcript(
    tmp_path: Path, short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``jupyter execute`` on the bundled quickstart, first against a gate, then from the
    exported transcript alone: its mock run, dry run, %dpschema, %dpplot, snippets and
    the Python client's ``Gate()`` all work offline."""
    policy = prepare_example(tmp_path / "clinic", patients=300)
    quickstart = tmp_path / "work" / "quickstart.ipynb"
    quickstart.parent.mkdir()
    quickstart.write_text(
        Path(str(files("dpmagic.examples").joinpath("quickstart.ipynb"))).read_text()
    )
    execute = [str(Path(sys.executable).parent / "jupyter-execute"), "--inplace", quickstart.name]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPMAGIC_", "JPY_"))}
    env.update(HOME=str(tmp_path))
    env.pop("MPLBACKEND", None)  # the kernel's inline backend shows the plot
    # The quickstart names the gated kernel, as graders install it (`dpmagic kernel
    # install --sys-prefix`): here in a folder of the test's own.
    jupyter = tmp_path / "prefix" / "share" / "jupyter"
    write_spec(jupyter / "kernels" / "dpmagic")
    env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(jupyter), env.get("JUPYTER_PATH")) if p)
    gate = DemoGate(policy, short_dir / "quickstart.sock", tmp_path / "gate.log")
    gate.start()
    try:
        live = dict(env, DPMAGIC_GATE=gate.address)
        subprocess.run(execute, cwd=quickstart.parent, env=live, check=True, timeout=300,
                       capture_output=True)  # fmt: skip
        # jupyter execute gives the kernel no name: it is named after the file it runs
        spent = Gate(gate.address).budget(notebook="quickstart.ipynb")["notebook"]["spent"]
        assert spent["epsilon"] > 0
        assert export(capsys, policy, tmp_path / "quickstart.json", "quickstart.ipynb") == 0
    finally:
        gate.stop()
    offline = dict(env, DPMAGIC_TRANSCRIPT=str(tmp_path / "quickstart.json"))
    done = subprocess.run(execute, cwd=quickstart.parent, env=offline, timeout=300,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    graded = nbformat.read(quickstart, as_version=4)
    texts = json.dumps(
        [c.outputs for c in graded.cells if c.cell_type == "code"], ensure_ascii=False
    )
    assert "replayed (no cost)" in texts
    assert "mock data — not the real dataset" in texts
    assert "its plan is not in the transcript" in texts  # the dry run, offline
    assert "refused: this query is not in the transcript" in texts  # Gate() replays too
    assert "image/png" in texts  # %dpplot
