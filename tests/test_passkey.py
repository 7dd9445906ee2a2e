"""tools.passkey and YaRN's regime: the regime against turns counted by hand; the prompt decodes back to
filler, the key sentence where the trial says and the question at the end; the scorer gives 1.0 to a
model that copies the key and 0 to one that does not; the CLI on tiny runs writes its rows and refuses
bad input in one line. Nothing here asserts a real model's accuracy."""
import json
import math
import re

import numpy as np
import pytest
import torch

import train
from attention.positional import RoPE
from helpers import run_cli, train_args
from model import GPT
from tokenizer import CharTokenizer, load_tokenizer
from tools import eval as length_eval
from tools import passkey

ROW_KEYS = {"run", "attention", "pos_encoding", "rope_scaling", "rope_factor", "block_size", "length", "multiple",
            "trials", "hits", "accuracy", "ci95", "chance", "digits", "key_format", "depths", "correct"}


def hand_turns(L, d, base):
    """Turns of pair i over L positions, written out: L * base^(-2i/d) / (2 pi)."""
    return [L * base ** (-2 * i / d) / (2 * math.pi) for i in range(d // 2)]


@pytest.mark.parametrize("L,d,base,betas,regime", [
    (64, 32, 10000.0, (32.0, 1.0), "partial interpolation"), (256, 32, 10000.0, (32.0, 1.0), "three bands"),
    (1024, 32, 10000.0, (32.0, 1.0), "three bands"), (4096, 128, 500000.0, (32.0, 1.0), "three bands"),
    (8, 16, 10000.0, (32.0, 2.0), "position interpolation"), (256, 16, 10.0, (32.0, 1.0), "no full interpolation")])
def test_yarn_regime_counts_turns_as_by_hand(L, d, base, betas, regime):
    turns = hand_turns(L, d, base)
    rope = RoPE(base, "yarn", 4.0, L, *betas)
    r = rope.yarn_regime(d)
    assert r["turns_fastest"] == pytest.approx(turns[0], rel=1e-12)
    assert r["turns_slowest"] == pytest.approx(turns[-1], rel=1e-12)
    assert r["by_turns"] == {"above_beta_fast": sum(t > betas[0] for t in turns),
                             "between": sum(betas[1] <= t <= betas[0] for t in turns),
                             "below_beta_slow": sum(t < betas[1] for t in turns)}
    assert r["regime"] == regime and r["context"] == L and r["rotated_dims"] == d
    # the ramp's counts are the pairs the model really keeps (theta_i) and interpolates (theta_i / 4)
    theta, applied = RoPE(base).inv_freq(d), rope.inv_freq(d)
    kept, interpolated = torch.isclose(applied, theta, rtol=1e-12), torch.isclose(applied, theta / 4, rtol=1e-12)
    assert r["by_ramp"] == {"kept": int(kept.sum()), "interpolated": int(interpolated.sum()),
                            "ramped": d // 2 - int(kept.sum()) - int(interpolated.sum())}


def test_yarn_at_64_is_partial_interpolation_and_at_256_three_bands():
    """The issue's numbers: d_h 32, base 1e4: pair 0 turns 64 / 2 pi = 10.2 times over 64 tokens, below
    beta_fast = 32; over 256 tokens 40.7 times, above it. The ramp, its bounds rounded outward as in
    Hugging Face's code, still keeps pair 0 at 64."""
    at64, at256 = (RoPE(scaling="yarn", factor=4.0, original_context=L).yarn_regime(32) for L in (64, 256))
    assert at64["turns_fastest"] == pytest.approx(10.186, abs=1e-3) and at64["by_turns"]["above_beta_fast"] == 0
    assert at64["by_ramp"] == {"kept": 1, "ramped": 4, "interpolated": 11}
    assert at256["turns_fastest"] == pytest.approx(40.744, abs=1e-3) and at256["by_turns"]["above_beta_fast"] == 1
    assert at256["by_ramp"] == {"kept": 1, "ramped": 6, "interpolated": 9}


@pytest.fixture(scope="module")
def runs(data_root, tmp_path_factory):
    """Tiny RoPE and learned-position runs (block_size 32), 5 steps."""
    root = tmp_path_factory.mktemp("passkey_runs")
    for pos in ("rope", "learned"):
        train.main(train_args(data_root, root / pos, "--max_iters=5", "--eval_interval=5", f"--pos_encoding={pos}"))
    return root


@pytest.fixture(scope="module")
def chars(data_root):
    meta = json.loads((data_root / "shakespeare_char" / "meta.json").read_text())
    val = np.fromfile(data_root / "shakespeare_char" / "val.bin", dtype=np.uint16)
    return load_tokenizer(meta), val


def check_prompts(tok, tokens, fmt, length, n_trials):
    trials = passkey.make_trials(tokens, tok, fmt, length, n_trials, 5, seed=3)
    for k, t in enumerate(trials):
        sentence = passkey.KEY_SENTENCE.format(key=t.answer.strip())
        n_sentence, question = len(tok.encode(sentence)), tok.encode(passkey.QUESTION)
        assert len(t.ids) + t.n_answer == length                          # prompt and answer fill the length
        assert tok.decode(t.ids[t.at:t.at + n_sentence].tolist()) == sentence
        assert t.ids[-len(question):].tolist() == question                # the question closes the prompt
        filler = np.concatenate([t.ids[:t.at], t.ids[t.at + n_sentence:-len(question)]])
        found = [s for s in range(len(tokens) - len(filler) + 1)          # one stretch of the split
                 if np.array_equal(tokens[s:s + len(filler)], filler)]
        assert found, "the filler is not a contiguous stretch of the split"
        assert t.depth == pytest.approx(t.at / len(filler))
        assert k / n_trials - 1 / len(filler) <= t.depth <= (k + 1) / n_trials + 1 / len(filler)  # stratified
        assert re.fullmatch(r"\d{5}", t.key) and t.answer == passkey.answer_text([int(c) for c in t.key], fmt)
    return trials


def test_char_prompt_spells_the_key_in_words_and_puts_it_where_it_says(chars):
    tok, val = chars
    assert passkey.key_format(tok) == "words"      # Tiny Shakespeare's characters hold only the digit 3
    assert passkey.key_format(CharTokenizer(list("0123456789 abc"))) == "digits"
    trials = check_prompts(tok, val[:20000], "words", 300, 6)
    assert trials[0].answer.startswith(" ") and all(w in passkey.DIGIT_WORDS for w in trials[0].answer.split())
    again = passkey.make_trials(val[:20000], tok, "words", 300, 6, 5, seed=3)
    assert all(np.array_equal(a.ids, b.ids) for a, b in zip(trials, again))          # seeded
    other = passkey.make_trials(val[:20000], tok, "words", 300, 6, 5, seed=4)
    assert not all(np.array_equal(a.ids, b.ids) for a, b in zip(trials, other))


def test_bpe_prompt_puts_the_digits_where_it_says(chars, gpt2_vocab):
    tok = gpt2_vocab
    chars_tok, val = chars
    text = chars_tok.decode(val[:20000].tolist())
    tokens = np.array(tok.encode(text), dtype=np.int64)
    assert passkey.key_format(tok) == "digits"
    check_prompts(tok, tokens, "digits", 200, 5)


def test_a_prompt_too_long_for_the_length_is_refused(chars):
    tok, val = chars
    with pytest.raises(ValueError, match="more than 64"):
        passkey.make_trials(val, tok, "words", 64, 2, 5, seed=1)
    with pytest.raises(ValueError, match="the split has 100 tokens"):
        passkey.make_trials(val[:100], tok, "words", 512, 2, 5, seed=1)


class Stub:
    """GPT.generate stand-ins: `copy` reads the key back out of the decoded prompt, `garbage` repeats
    token 0; both record the keyword arguments they were called with."""

    def __init__(self, tok, copy):
        self.tok, self.copy, self.calls = tok, copy, []

    def generate(self, idx, n, **kw):
        self.calls.append(kw)
        rows = []
        for row in idx.tolist():
            key = re.search(r"The pass key is (.+?)\. Remember it\.", self.tok.decode(row)).group(1)
            rows.append(self.tok.encode(" " + key)[:n] if self.copy else [0] * n)
        return torch.cat([idx, torch.tensor(rows, dtype=idx.dtype)], dim=1)


@pytest.mark.parametrize("copy,expected", [(True, 1.0), (False, 0.0)])
def test_scorer_gives_a_copying_model_all_and_garbage_none(chars, copy, expected):
    tok, val = chars
    trials = passkey.make_trials(val[:20000], tok, "words", 256, 7, 5, seed=1)
    stub = Stub(tok, copy)
    correct = passkey.score(stub, trials, tok, 256, 3, "cpu", "stub")
    assert len(correct) == 7 and sum(correct) / 7 == expected
    assert all(kw == {"temperature": 0.0, "max_context": 256} for kw in stub.calls)   # greedy, the whole length


def test_cli_writes_rows_with_the_yarn_regime_and_na_with_reasons(runs, data_root, tmp_path):
    out = tmp_path / "pk.json"
    code, stdout, err = run_cli(["-m", "tools.passkey", str(runs / "rope"), str(runs / "learned"),
                                 "--lengths=1x,8x", "--trials=2", "--rope_scaling=none,yarn", "--rope_factor=8",
                                 f"--data_dir={data_root}", f"--json={out}"])
    assert code == 0, err
    rows = json.loads(out.read_text())
    assert [(r["run"], r["length"]) for r in rows] == [
        ("rope [none]", 32), ("rope [none]", 256), ("rope [yarn x8]", 32), ("rope [yarn x8]", 256),
        ("learned", 32), ("learned", 256)]
    for r in rows:
        assert ROW_KEYS <= set(r) and r["chance"] == 1e-5 and r["key_format"] == "words"
        assert (r["accuracy"] is None) == (r["length"] == 32 or r["pos_encoding"] == "learned")
    done = [r for r in rows if r["accuracy"] is not None]
    assert len(done) == 2 and all(r["trials"] == 2 == len(r["correct"]) == len(r["depths"]) for r in done)
    assert all(0 <= r["ci95"][0] <= r["accuracy"] <= r["ci95"][1] <= 1 for r in done)
    assert rows[3]["yarn_regime"] == RoPE(scaling="yarn", factor=8.0, original_context=32).yarn_regime(8)
    assert "yarn_regime" not in rows[1]
    assert "learned positions stop at block_size=32" in stdout and "more than 32" in stdout
    assert "yarn regime of rope [yarn x8]: L=32: fastest pair 5.1 turns" in stdout


def test_cli_scores_a_copying_model_one(runs, data_root, tmp_path, monkeypatch):
    """The whole path (trials, batches, rows) with GPT.generate replaced by the copying stub."""
    tok = load_tokenizer(json.loads((data_root / "shakespeare_char" / "meta.json").read_text()))
    monkeypatch.setattr(GPT, "generate", lambda self, idx, n, **kw: Stub(tok, True).generate(idx, n, **kw))
    out = tmp_path / "pk.json"
    code, _, err = run_cli(["-m", "tools.passkey", str(runs / "rope"), "--lengths=160", "--trials=5",
                            "--batch_size=2", f"--data_dir={data_root}", f"--json={out}"])
    assert code == 0, err
    row, = json.loads(out.read_text())
    assert row["accuracy"] == 1.0 and row["hits"] == 5 and row["ci95"][1] == 1.0 and row["multiple"] == 5


def test_eval_writes_the_yarn_regime_beside_its_rows(runs, data_root, tmp_path):
    out = tmp_path / "eval.json"
    code, stdout, err = run_cli(["-m", "tools.eval", str(runs / "rope"), "--lengths=32", "--rope_scaling=none,yarn",
                                 "--rope_factor=4", "--max_tokens=300", f"--data_dir={data_root}", f"--json={out}",
                                 f"--plot={tmp_path / 'e.png'}"])
    assert code == 0, err
    none, yarn = json.loads(out.read_text())
    assert "yarn_regime" not in none
    assert yarn["yarn_regime"]["regime"] == "partial interpolation" and yarn["yarn_regime"]["context"] == 32
    assert stdout.count("yarn regime of") == 1 and length_eval.regime_text(yarn["yarn_regime"]) in stdout


@pytest.mark.parametrize("flags,words", [
    (["--trials=0"], "--trials=0 must be between 1"),
    (["--digits=0"], "--digits=0 must be between 1"),
    (["--lengths=2y"], "--lengths='2y'"),
    (["--lengths=0x"], "--lengths='0x'"),
    (["--rope_factor=4"], "go with --rope_scaling"),
    (["--rope_scaling=yarn", "--rope_factor=4"], "no run uses it"),
    (["--lengths=8x"], "no length of --lengths=8x is possible for any run"),
    (["--json=/nonexistent/pk.json"], "does not exist")])
def test_bad_input_is_one_line_and_exit_2(runs, data_root, flags, words):
    code, out, err = run_cli(["-m", "tools.passkey", str(runs / "learned"), f"--data_dir={data_root}", *flags])
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, err
    assert out == ""


def test_a_missing_run_is_one_line(data_root, tmp_path):
    code, out, err = run_cli(["-m", "tools.passkey", str(tmp_path / "nothing"), f"--data_dir={data_root}"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and out == "", err
