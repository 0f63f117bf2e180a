"""Python `analyze()` says where it wrote (the command line prints its own summary line)."""

from __future__ import annotations

from pathlib import Path

import sinkdlm.analysis.figures as figures


def test_analyze_says_where_it_wrote_unless_quiet(tmp_path, capsys, monkeypatch):
    # the figures are built but not rendered to PNG (most of the time here; rendering: test_analysis_figures.py)
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: Path(path).write_bytes(b"") or Path(path))
    from helpers import tiny_model, word_tokenizer

    from sinkdlm.analysis import analyze
    from sinkdlm.config import AnalyzeConfig, SampleConfig

    model = tiny_model(vocab_size=47, mask_token_id=46).float()
    for quiet in (False, True):
        out = tmp_path / f"quiet-{quiet}"
        analyze(model, word_tokenizer(), ["w1 w2 w3"],
                AnalyzeConfig(sample=SampleConfig(gen_length=2, steps=2), out=out, quiet=quiet))
        err = capsys.readouterr().err
        said = [line for line in err.splitlines() if line.startswith("[sinkdlm] sink analysis: wrote")]
        if quiet:
            assert not said
        else:
            assert len(said) == 1 and str(out / "analysis.json") in said[0] and str(out / "report.md") in said[0]
            assert (out / "analysis.json").is_file() and (out / "report.md").is_file()
