"""No silent minutes: `train` says what is coming and shows a progress line from step 1 (loss, tokens/s, ETA),
not only after --log-every steps (at 20 s a step on a CPU, ten steps were 3.5 minutes of silence)."""

from __future__ import annotations

import re

from helpers import cfg_for, read_metrics, write_corpus

LINE = re.compile(r"^\[sinkdlm\] step (\d+)/(\d+) \| loss ([\d.]+) \| lr \S+ \| (\d+) tok/s( \| val_loss \S+)? "
                  r"\| ETA (\d+):(\d\d)$")


def test_progress_line_from_the_first_step_with_loss_rate_and_eta(tmp_path, capsys):
    from sinkdlm.training import train

    cfg = cfg_for(tmp_path, write_corpus(tmp_path / "c.jsonl"), max_steps=5, log_every=100, eval_every=100,
                  save_every=100)
    train(cfg)
    out = capsys.readouterr().err.splitlines()  # progress on stderr; no terminal: plain lines, no bar
    announce = [i for i, line in enumerate(out) if line.startswith("[sinkdlm] training steps 1-5:")]
    rows = [(i, LINE.match(line)) for i, line in enumerate(out) if LINE.match(line)]
    assert announce and rows, out
    assert [int(m.group(1)) for _, m in rows] == [1, 5]  # step 1 at once, then the last (--log-every 100)
    assert announce[0] < rows[0][0]  # said before the first step runs
    first, last = rows[0][1], rows[-1][1]
    assert float(first.group(3)) > 0 and int(first.group(4)) > 0
    assert (int(last.group(6)), int(last.group(7))) == (0, 0)  # nothing left at the end
    # the step-1 line is shown, not logged: metrics.jsonl keeps its --log-every rows
    assert [r["step"] for r in read_metrics(cfg.out)] == [5]
