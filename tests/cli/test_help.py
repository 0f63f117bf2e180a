"""`sinkdlm --help` lists each command's whole summary (click cut them to the terminal's width with "..."), and
a command's required options come first in its `--help`."""

from __future__ import annotations

import re

from typer.testing import CliRunner


def test_command_summaries_are_whole():
    import typer.main

    from sinkdlm.cli import app

    text = " ".join(CliRunner().invoke(app, ["--help"]).stdout.split("Commands:")[1].split())
    assert "..." not in text
    for name, cmd in typer.main.get_command(app).commands.items():
        summary = " ".join((cmd.help or "").strip().split("\n\n")[0].split())
        assert f"{name} {summary}" in text, name


def test_required_options_come_first():
    from sinkdlm.cli import app

    text = CliRunner().invoke(app, ["generate", "--help"]).stdout
    options = re.findall(r"^  (--[\w-]+)", text, flags=re.M)
    assert options[:3] == ["--model", "--prompt", "--prompt-file"], options[:4]  # then required
