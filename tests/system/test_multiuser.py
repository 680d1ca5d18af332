"""A multi-user host, for real: the gate as one Unix user, a kernel as another.

Two system users are created for the test and removed after it. The gate
runs as the first with its data, policy and ledger private to it (files
0600, folders 0700) and its socket in a folder under ``/run``; a real kernel,
driven by nbclient, runs as the second. The kernel cannot open the data or
the ledger, yet ``%%dpsql`` works, and the gate charges the kernel's own
user, known from ``SO_PEERCRED``. Needs root; skipped otherwise.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from tests.conftest import write_dataset

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("setpriv") is None,
    reason="needs root, useradd and setpriv to run the gate and a kernel as two Unix users",
)

RUNNER = """\
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, kernel_name="python3", timeout=120, allow_errors=True).execute()
nbformat.write(nb, sys.argv[2])
"""


def as_user(user: str, *argv: str) -> list[str]:
    # Through env(1): setpriv looks the program up with root's rights still,
    # env with the user's, as every later exec (a kernel's) will.
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "env", *argv]


@pytest.fixture
def two_users() -> Iterator[tuple[str, str]]:
    tag = secrets.token_hex(3)
    names = (f"dpm-gate-{tag}", f"dpm-kern-{tag}")
    made = []
    try:
        for name in names:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                check=True, capture_output=True,
            )  # fmt: skip
            made.append(name)
        yield names
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False, capture_output=True)


def python_for(user: str, base: Path) -> Path:
    """A virtual environment both users can run, on our packages.

    Our own interpreter may live where other users cannot reach (a home
    folder); any Python of the same version that they can run will do.
    """
    want = f"{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [sys.executable, getattr(sys, "_base_executable", ""), f"/usr/bin/python{want}"]
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            as_user(user, candidate, "-c", "import sys; print(*sys.version_info[:2], sep='.')"),
            capture_output=True, text=True,
        )  # fmt: skip
        if probe.returncode == 0 and probe.stdout.strip() == want:
            break
    else:
        pytest.skip(f"no Python {want} that another user may run")
    env = base / "env"
    subprocess.run([candidate, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = sysconfig.get_paths()["purelib"]
    (Path(site) / "parent_env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    check = subprocess.run(as_user(user, python, "-c", "import dpmagic, nbclient"), check=False)
    if check.returncode != 0:
        pytest.skip("this checkout's packages are not readable by other users")
    return python


def test_the_kernel_cannot_read_what_the_gate_serves(two_users: tuple[str, str]) -> None:
    gate_user, kernel_user = two_users
    g, k = pwd.getpwnam(gate_user), pwd.getpwnam(kernel_user)
    base = Path(tempfile.mkdtemp(prefix="dpm-host-", dir="/var/tmp"))
    run = Path(tempfile.mkdtemp(prefix="dpmagic-test-", dir="/run"))
    gate = None
    try:
        base.chmod(0o755)
        python = str(python_for(kernel_user, base))
        # The gate's own folder: policy, data and (once it starts) its state.
        private = base / "gate"
        private.mkdir(mode=0o700)
        policy = write_dataset(private)
        for path in (private, *private.iterdir()):
            os.chown(path, g.pw_uid, g.pw_gid)
            path.chmod(0o700 if path.is_dir() else 0o600)
        os.chown(run, g.pw_uid, g.pw_gid)
        run.chmod(0o755)
        sock = run / "gate.sock"

        gate = subprocess.Popen(
            as_user(gate_user, python, "-m", "dpmagic", "serve", "--policy", str(policy),
                    "--listen", f"unix:{sock}"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**_clean_env(), "HOME": str(private)},
        )  # fmt: skip
        assert gate.stdout is not None
        ready, _, _ = select.select([gate.stdout], [], [], 60)
        line = gate.stdout.readline() if ready else ""
        assert line.startswith("dpmagic gate listening on"), (
            gate.stderr.read() if gate.stderr else ""
        )
        ledger = private / "state" / "ledger.sqlite3"
        assert (private / "state").stat().st_mode & 0o777 == 0o700
        assert ledger.stat().st_uid == g.pw_uid and ledger.stat().st_mode & 0o777 == 0o600

        # The kernel's user: its own home, a notebook that tries the files.
        home = base / "kernel-home"
        home.mkdir(mode=0o700)
        os.chown(home, k.pw_uid, k.pw_gid)
        probe = (
            "for path in {paths!r}:\n"
            "    try:\n"
            "        open(path, 'rb').read(1)\n"
            "        print('read', path)\n"
            "    except PermissionError:\n"
            "        print('denied', path)\n"
        ).format(paths=[str(private / "t.csv"), str(ledger), str(policy)])
        nb = nbformat.v4.new_notebook(
            cells=[
                nbformat.v4.new_code_cell("%load_ext dpmagic"),
                nbformat.v4.new_code_cell(probe),
                nbformat.v4.new_code_cell("%%dpsql -e 0.5\nSELECT COUNT(*) AS n FROM t"),
                nbformat.v4.new_code_cell(
                    "from dpmagic.client.http_gate import Gate\n"
                    "print(Gate().budget()['user']['spent']['epsilon'])"
                ),
            ]
        )
        source, out = home / "probe.ipynb", home / "probe.out.ipynb"
        nbformat.write(nb, source)
        os.chown(source, k.pw_uid, k.pw_gid)
        ran = subprocess.run(
            as_user(kernel_user, python, "-c", RUNNER, str(source), str(out)),
            env={**_clean_env(), "HOME": str(home), "DPMAGIC_GATE": f"unix:{sock}"},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr[-3000:]
        cells = nbformat.read(out, as_version=4).cells
        denied = cells[1].outputs[0]["text"].splitlines()
        assert denied == [f"denied {p}" for p in (private / "t.csv", ledger, policy)]
        answer = cells[2].outputs
        assert all(o["output_type"] != "error" for o in answer), answer
        assert "<table>" in answer[0]["data"]["text/html"]
        assert cells[3].outputs[0]["text"].strip() == "0.5"

        # The admin reads the ledger as the gate's user: charged to the kernel's.
        shown = subprocess.run(
            as_user(gate_user, python, "-m", "dpmagic", "budget", "show", "--policy",
                    str(policy), "--json"),
            env={**_clean_env(), "HOME": str(private)},
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        rows = json.loads(shown.stdout)
        assert {r["user"] for r in rows} == {kernel_user}
        assert next(r for r in rows if r["notebook"] == "(all notebooks)")["spent_epsilon"] == 0.5
    finally:
        if gate is not None:
            gate.send_signal(signal.SIGTERM)
            try:
                gate.wait(timeout=20)
            except subprocess.TimeoutExpired:
                gate.kill()
                gate.wait()
            for stream in (gate.stdout, gate.stderr):
                if stream is not None:
                    stream.close()
        # Processes of the kernel's user (the kernel) must be gone before userdel.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _processes_of(k.pw_uid):
            time.sleep(0.2)
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(run, ignore_errors=True)


def _clean_env() -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL")
    return {k: v for k, v in os.environ.items() if k in keep}


def _processes_of(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
            except FileNotFoundError:
                continue
    return found
