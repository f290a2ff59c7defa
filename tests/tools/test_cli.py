"""The ``phi-api`` command: every command and benchmark is reachable, with its own arguments, and only the chosen
one's module is imported."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from phi_api.tools import cli


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "phi_api", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("module_name", [module for module, _ in [*cli.COMMANDS.values(), *cli.BENCHES.values()]])
def test_every_command_s_module_declares_its_arguments_and_runs(module_name):
    module = importlib.import_module(module_name)
    assert callable(module.add_cli_args) and callable(module.main)


def test_help_lists_the_commands_and_the_benchmarks():
    top, bench = run("--help"), run("bench", "--help")
    assert top.returncode == 0 and bench.returncode == 0
    assert all(name in top.stdout for name in [*cli.COMMANDS, "bench"]), top.stdout
    assert all(name in bench.stdout for name in cli.BENCHES), bench.stdout


def test_a_benchmark_is_named_under_bench_and_takes_its_own_arguments():
    done = run("bench", "load", "--help")
    assert done.returncode == 0 and "--mixed" in done.stdout
    assert run("bench").returncode == 2  # no benchmark named: usage, not a traceback
    unknown = run("bench", "nonsense")
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr


def test_only_the_chosen_command_s_module_is_imported():
    code = ("import sys; from phi_api.tools import cli\n"
            "try:\n    cli.main(['bench', 'kv', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('phi_api.tools.', 'phi_api.bench.'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    loaded = done.stdout.strip().splitlines()[-1]
    assert "phi_api.bench.kv" in loaded and "phi_api.bench.serving" not in loaded, loaded
    assert "phi_api.tools.serve" not in loaded, loaded
