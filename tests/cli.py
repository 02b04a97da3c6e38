"""`xh ARGS` inside the test's own process, for tests that watch or replace what a command calls.

    xh("qtype", "--questions", path)                          # returns on success, as a function does
    monkeypatch.setattr(workflows.demo, "run", fake)          # each command calls its driver's function
    with pytest.raises(SystemExit) as exited: xh("score", "--set", "score.model=bad")   # exit code 2

A subprocess (`[sys.executable, "-m", "workflows.cli", ...]`) is the same command in a fresh process.
"""

from __future__ import annotations


def xh(*args: str) -> None:
    """Run `xh ARGS` here: return when it succeeds, raise `SystemExit` with its exit code when it fails."""
    from workflows.cli import app

    try:
        app(args=list(args), prog_name="xh")
    except SystemExit as e:
        if e.code:
            raise
