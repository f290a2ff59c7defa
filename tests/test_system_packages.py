"""`make test` sets up the Debian packages the tests need before anything else: installed as root, or a stop
within a second that names the command to run (``tests/system_packages.sh``)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "system_packages.sh"


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def run(tmp_path: Path, packages: str, uid: int) -> subprocess.CompletedProcess:
    """The script with ``packages`` wanted, believing it runs as ``uid``, with a stub apt-get that records its
    arguments and "installs" a package by putting a command of its name on the PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub(bin_dir, "id", f'echo {uid}')
    stub(bin_dir, "apt-get", f'echo "$@" >> {tmp_path}/apt.log\n'
                             f'for arg in "$@"; do case "$arg" in phi-api-*) printf "#!/bin/sh\\n" > {bin_dir}/"$arg"; '
                             f'chmod +x {bin_dir}/"$arg";; esac; done')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PHI_API_SYSTEM_PACKAGES": packages}
    return subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)


def test_nothing_happens_when_everything_is_there(tmp_path):
    finished = run(tmp_path, "sh:dash", uid=0)
    assert finished.returncode == 0, finished.stderr
    assert not (tmp_path / "apt.log").exists()


def test_without_root_it_stops_at_once_naming_the_command(tmp_path):
    started = time.monotonic()
    finished = run(tmp_path, "sh:dash phi-api-missing-tool:phi-api-missing-package", uid=1000)
    assert time.monotonic() - started < 5
    assert finished.returncode == 2
    assert "sudo apt-get install -y --no-install-recommends phi-api-missing-package" in finished.stderr
    assert not (tmp_path / "apt.log").exists()


def test_as_root_it_installs_what_is_missing(tmp_path):
    finished = run(tmp_path, "sh:dash phi-api-missing-tool:phi-api-missing-tool", uid=0)
    assert finished.returncode == 0, finished.stderr
    calls = (tmp_path / "apt.log").read_text().splitlines()
    assert calls[0].startswith("update")
    assert calls[1].split()[-1] == "phi-api-missing-tool" and calls[1].startswith("install -y")


def test_an_install_that_does_not_provide_the_command_fails(tmp_path):
    finished = run(tmp_path, "phi-api-tool-nobody-provides:other-package", uid=0)
    assert finished.returncode == 2
    assert "still missing: other-package" in finished.stderr


def test_make_test_checks_the_packages_before_the_minutes_of_set_up():
    # Under an outer make (CI runs `make test`, which runs these tests) the inherited MAKEFLAGS and MAKELEVEL
    # would make this make print "Entering directory" lines: the recipe is read as a top-level make.
    env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    commands = subprocess.run(["make", "--no-print-directory", "-n", "-B", "test"], cwd=REPO, env=env,
                              capture_output=True, text=True, check=True).stdout.splitlines()
    assert commands[0] == "tests/system_packages.sh"
    assert any("-m venv" in command for command in commands[1:])
