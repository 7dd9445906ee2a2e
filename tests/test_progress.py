"""data/progress.py: long work says how far it is off a terminal too (plain lines every few
percent), quick work stays silent, and tools.eval and the data prep go through it."""
import io

import numpy as np

from data import progress as prog


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_plain_lines_every_step_percent_after_the_quiet_start():
    clock, out = Clock(), io.StringIO()
    bar = prog.PlainProgress(1000, "char", "tokenizing", out, clock=clock)
    for _ in range(1000):  # 1 s per 10 units: 100 s in all
        clock.t += 0.1
        bar.update(1)
    bar.set_postfix(docs="1/1")
    bar.close()
    bar.close()  # idempotent: one closing line
    lines = out.getvalue().splitlines()
    # one line per 5% step (5, 10, ... 95; QUIET_S = 2 s is before the first), then "done"
    assert [line.split(": ")[1].split(" ")[0] for line in lines[:-1]] == [f"{p}%" for p in range(5, 100, 5)]
    assert lines[-1].startswith("tokenizing: done, 100% (1,000/1,000 char), 100s") and "[docs=1/1]" in lines[-1]
    assert "eta 50s" in lines[int(np.argmax(["50%" in x for x in lines]))]  # 50 s in, half left


def test_quick_work_prints_nothing():
    clock, out = Clock(), io.StringIO()
    bar = prog.PlainProgress(10, "batch", "eval", out, clock=clock)
    for _ in range(10):
        clock.t += 0.1
        bar.update(1)
    bar.close()
    assert out.getvalue() == ""


def test_unknown_total_prints_every_interval():
    clock, out = Clock(), io.StringIO()
    bar = prog.PlainProgress(None, "tok", "tokenizing", out, clock=clock)
    for _ in range(100):  # 100 s, a line every PLAIN_EVERY_S (30 s)
        clock.t += 1.0
        bar.update(1000)
    lines = out.getvalue().splitlines()
    assert len(lines) == int(100 // prog.PLAIN_EVERY_S) and lines[0].startswith("tokenizing: 30,000 tok, 30s")


def test_a_terminal_gets_a_bar_and_a_log_gets_lines():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    assert type(prog.progress(10, "x", "d", stream=Tty())).__name__ == "tqdm"
    assert isinstance(prog.progress(10, "x", "d", stream=io.StringIO()), prog.PlainProgress)


def test_eval_batches_report_off_a_terminal(monkeypatch, capsys):
    """tools.eval's batches go through the helper: with stderr captured (not a terminal) and the
    quiet start off, a batch loop prints plain percent lines (it printed nothing for 44 minutes)."""
    from tools import eval as length_eval
    monkeypatch.setattr(prog, "QUIET_S", 0.0)
    got = [b for b in length_eval.batches(range(100), 10, "run L=64")]
    assert [len(b) for b in got] == [10] * 10
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "run L=64: 10% (1/10 batch), 0s, eta 0s" and err[-1].startswith("run L=64: done, 100%")


def test_the_plain_lines_close_as_a_context_manager_as_tqdm_does():
    import io

    from data.progress import PlainProgress
    ticks = iter([0.0, 10.0, 20.0, 30.0])
    stream = io.StringIO()
    with PlainProgress(10, "row", "mqar", stream, clock=lambda: next(ticks)) as bar:
        bar.update(10)
    assert stream.getvalue().splitlines()[-1].startswith("mqar: done, 100% (10/10 row)")
