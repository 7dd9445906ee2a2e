"""The sinusoidal encoding and analyze.py: each measurement against an independent reference,
and checks that the measurements can tell apart what they claim to (uniform vs concentrated
attention, shifted vs not), plus the CLI on checkpoints of every variant and its bad input."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from attention.positional import RoPE, sinusoidal_encoding
from attention.record import record_attention
from attn_kernels.reference import naive_recurrent_gla
from helpers import ROOT, perturbed_model, reference_qkv_attention, tiny_model_kwargs
from model import GPT, GPTConfig
from test_contract import VARIANT_KWARGS, a_position
from tools import analyze

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_model(attention="mha", pos_encoding="rope", **overrides):
    """An untrained tiny model with perturbed weights (so attention is far from uniform)."""
    torch.manual_seed(0)
    kwargs = {**VARIANT_KWARGS[attention], **overrides}
    model = GPT(GPTConfig(**tiny_model_kwargs(attention=attention, pos_encoding=pos_encoding, attn_impl="naive",
                                              **kwargs))).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def random_tokens(n=2000, seed=0):
    return np.random.default_rng(seed).integers(0, 65, n).astype(np.uint16)


# ---- sinusoidal positions ----

def test_sinusoidal_code_matches_the_paper_and_its_dot_product_depends_only_on_the_offset():
    dim = 32
    pos = torch.tensor([0, 1, 7, 100, 999])
    code = sinusoidal_encoding(pos, dim)
    for row, m in enumerate(pos.tolist()):  # "Attention Is All You Need", section 3.5, written out
        for i in range(dim // 2):
            angle = m / 10000 ** (2 * i / dim)
            assert abs(code[row, 2 * i].item() - math.sin(angle)) < 1e-6
            assert abs(code[row, 2 * i + 1].item() - math.cos(angle)) < 1e-6
    gen = torch.Generator().manual_seed(0)
    m = torch.randint(0, 5000, (200,), generator=gen)
    offset = torch.randint(-300, 300, (200,), generator=gen).clamp_min(-m)   # n = m + offset >= 0
    dots = (sinusoidal_encoding(m, dim) * sinusoidal_encoding(m + offset, dim)).sum(-1)
    # sum_i sin(a)sin(b) + cos(a)cos(b) = sum_i cos((m - n) w_i), whatever m
    expected = torch.tensor([sum(math.cos(o * 10000 ** (-2 * i / dim)) for i in range(dim // 2))
                             for o in offset.tolist()])
    assert (dots - expected).abs().max().item() < 1e-4
    assert expected.std() > 1.0  # the offsets give different products: the comparison has teeth


def test_sinusoidal_code_is_added_to_the_token_embeddings():
    model = make_model("mha", "sinusoidal")
    idx = torch.randint(0, 65, (2, 20))
    seen = []
    model.h[0].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        model(idx)
    angles = torch.arange(20.0)[:, None] / 10000 ** (torch.arange(0, 32, 2) / 32)
    code = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)
    code = code * 0.02 * 2 ** 0.5   # scaled to the rms of a 0.02-std embedding table
    assert (seen[0] - (model.wte(idx) + code)).abs().max().item() < 1e-6


@pytest.mark.parametrize("attention", ["mha", "gla"])
def test_sinusoidal_generation_past_block_size_same_with_and_without_cache(attention):
    """Absolute codes cannot slide a cache: past the window the cached path recomputes (softmax
    variants) or keeps its state (GLA), and must print what recomputing every step prints."""
    model = make_model(attention, "sinusoidal")
    idx = torch.randint(0, 65, (2, 10), generator=torch.Generator().manual_seed(0))
    with_cache = model.generate(idx, 40, temperature=0, use_cache=True)
    assert torch.equal(with_cache, model.generate(idx, 40, temperature=0, use_cache=False))
    assert len(set(with_cache[:, 10:].flatten().tolist())) >= 3


# ---- the weights analyze.py reads ----

def recorded_and_reference(model, pos_encoding):
    """analyze.forward_at's weights of every layer for 24 random tokens, and the last layer's
    softmax probabilities (B, H, T, T) from the independent reference on that layer's input."""
    idx = torch.randint(0, 65, (2, 24))
    inputs = []
    model.h[-1].attn.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
    weights = analyze.forward_at(model, idx, 0)
    probs = []
    with torch.no_grad():
        reference_qkv_attention(model.h[-1].attn, inputs[0], pos_encoding, probs_out=probs)
    return weights, torch.stack(probs, dim=1)


@pytest.mark.parametrize("attention,pos_encoding", [("gqa", "rope"), ("mha", "alibi")])
def test_recorded_weights_equal_an_independent_softmax(attention, pos_encoding):
    weights, probs = recorded_and_reference(make_model(attention, pos_encoding), pos_encoding)
    assert (weights[1][0] - probs).abs().max().item() <= 1e-5


def test_a_hybrid_records_each_layer_as_its_own_kind():
    """gla,mha: layer 0's effective weights come from the linear-attention path, layer 1's are
    softmax probabilities equal to an independent softmax; measure covers both layers."""
    model = perturbed_model(attention="gla,mha", gla_chunk=8, attn_impl="naive")
    weights, probs = recorded_and_reference(model, "rope")
    assert len(weights) == 2 and (weights[1][0] - probs).abs().max().item() <= 1e-5
    assert torch.allclose(weights[0][0].sum(-1), torch.ones(2, 4, 24), atol=1e-5)  # normalised |weights|
    stats, _ = analyze.measure(model, random_tokens(), 32, 4)
    assert len(stats) == 2


def test_gla_effective_weights_equal_the_recurrence_with_one_hot_values():
    """With v_j = e_j the loop reference's output o_i lists each token's weight w_ij."""
    gen = torch.Generator().manual_seed(0)
    B, H, Hkv, T, D = 2, 4, 2, 12, 8
    q, k = torch.randn(B, H, T, D, generator=gen), torch.randn(B, Hkv, T, D, generator=gen)
    g = -torch.rand(B, Hkv, T, D, generator=gen)
    one_hot = torch.eye(T).expand(B, Hkv, T, T)
    w, _ = naive_recurrent_gla(q, k, one_hot, g, scale=0.3)
    want = w.abs() / w.abs().sum(-1, keepdim=True)
    for max_elems in (2 ** 24, 5000):  # all queries at once, and 6 per slice
        got, visible = analyze.linear_attention_weights(q, k, g, 0.3, max_elems=max_elems)
        assert (got - want).abs().max().item() < 1e-5 and torch.equal(visible[0], torch.ones(T, T).tril().bool())


# ---- the measurements can tell things apart ----

@pytest.mark.parametrize("attention", ["mha", "bigbird"])
def test_forced_uniform_decay_equals_the_uniform_baseline(attention):
    model = make_model(attention, "rope")
    val, T = random_tokens(), 32
    forced = [s.curves() for s in analyze.measure(model, val, T, 4, force_uniform=True)[0]]
    real = [s.curves() for s in analyze.measure(model, val, T, 4)[0]]
    for (decay, uniform), (real_decay, _) in zip(forced, real):
        assert np.allclose(decay["weight"], uniform["weight"], atol=1e-9)
        assert np.abs(np.array(real_decay["weight"]) - uniform["weight"]).max() > 1e-3  # teeth
    if attention == "mha":  # dense causal: query i spreads 1/(i+1); distance d has queries i >= d
        expected = [np.mean([1 / (i + 1) for i in range(d, T)]) for d in range(T)]
        assert np.allclose(forced[0][1]["weight"], expected, atol=1e-9)


def test_alibi_with_huge_slopes_concentrates_at_distance_zero():
    model = make_model("mha", "alibi")
    for block in model.h:
        block.attn.alibi_slopes = torch.full_like(block.attn.alibi_slopes, 1e3)
    stats, _ = analyze.measure(model, random_tokens(), 32, 4)
    for decay, uniform in (s.curves() for s in stats):
        assert decay["distance"][0] == 0 and decay["weight"][0] > 0.999
        assert max(decay["weight"][1:]) < 1e-3 and uniform["weight"][0] < 0.2


@pytest.mark.parametrize("attention,pos_encoding,invariant", [
    ("mha", "rope", True), ("mha", "alibi", True), ("mha", "none", True), ("gla", "rope", None),
    ("mha", "learned", False), ("mha", "sinusoidal", False)])
def test_shift_invariance(attention, pos_encoding, invariant):
    """Relative encodings keep every weight when the text moves; absolute ones do not (so the
    shift is applied). GLA with rope: checked with gla_gate=none (no decay), where q.k is RoPE's."""
    extra = {"gla_gate": "none"} if attention == "gla" else {}
    model = make_model(attention, pos_encoding, **extra)
    change, per_layer = analyze.shift_invariance(model, random_tokens(), np.arange(0, 400, 50), 32)
    assert len(per_layer) == 2 and change == max(per_layer)
    if invariant is False:
        assert change > 1e-2
    else:
        assert change <= 1e-5


def test_same_token_ratio_against_a_direct_count():
    """DistanceStats' ratio equals a loop over (query, key) pairs of one weight matrix."""
    gen = torch.Generator().manual_seed(0)
    T = 10
    tokens = torch.randint(0, 3, (1, T), generator=gen)
    w = torch.rand(1, 1, T, T, generator=gen).tril()
    stats = analyze.DistanceStats(T - 1)
    stats.add(w, torch.ones(1, T, T, dtype=torch.bool).tril(), tokens)
    num = den = 0.0
    for d in range(1, T):
        pairs = [(i, i - d) for i in range(d, T)]
        same = [w[0, 0, i, j].item() for i, j in pairs if tokens[0, i] == tokens[0, j]]
        other = [w[0, 0, i, j].item() for i, j in pairs if tokens[0, i] != tokens[0, j]]
        if same and other:
            num += sum(same)
            den += len(same) * sum(other) / len(other)
    got_num, got_den = stats.same_token_terms()
    assert abs(got_num - num) < 1e-9 and abs(got_den - den) < 1e-9 and num > 0


def test_rope_bound_against_the_paper_sum():
    d, base = 16, 10000.0
    got = analyze.rope_relative_bound(RoPE(base).inv_freq(d), 40)
    def bound(r):
        return sum(abs(sum(complex(math.cos(r * base ** (-2 * k / d)), math.sin(r * base ** (-2 * k / d)))
                           for k in range(j))) for j in range(1, d // 2 + 1)) / (d // 2)
    assert np.allclose(got, [bound(r) / bound(0) for r in range(41)], atol=1e-9)
    assert got[40] < 0.5  # it decays


# ---- the CLI ----

def save_checkpoint(folder, data_root, attention, pos_encoding):
    model = make_model(attention, pos_encoding)
    with open(os.path.join(data_root, "shakespeare_char", "meta.json")) as f:
        meta = json.load(f)
    os.makedirs(folder, exist_ok=True)
    torch.save({"model": model.state_dict(), "model_args": model.config.to_dict(), "meta": meta,
                "config": {"data_dir": str(data_root), "dataset": "shakespeare_char"}},
               os.path.join(folder, "ckpt.pt"))
    return folder


@pytest.mark.parametrize("attention,pos_encoding", [(a, a_position(a)) for a in VARIANT_KWARGS]
                         + [("mha", "sinusoidal"), ("mla", "learned"), ("gla", "sinusoidal")])
def test_analyze_writes_pngs_and_json_for_every_variant(data_root, tmp_path, attention, pos_encoding):
    run = save_checkpoint(str(tmp_path / "run"), data_root, attention, pos_encoding)
    analyze.main([run, "--windows=3", "--out", str(tmp_path / "out"), "--prompt=ROMEO: hello"])
    for name in ("decay.png", "maps.png"):
        with open(tmp_path / "out" / name, "rb") as f:
            assert f.read(8) == PNG_MAGIC
        import matplotlib.image
        assert matplotlib.image.imread(str(tmp_path / "out" / name)).shape[0] > 100
    with open(tmp_path / "out" / "analysis.json") as f:
        result = json.load(f)
    for key in ("decay", "uniform", "shift_invariance", "same_token_ratio", "attention", "pos_encoding"):
        assert key in result
    assert result["attention"] == attention and result["pos_encoding"] == pos_encoding
    assert len(result["decay"]) == 2 and result["decay"][0]["distance"][:2] == [0, 1]
    assert len(result["decay"][1]["weight"]) == len(result["uniform"][1]["distance"])
    assert isinstance(result["shift_invariance"], float) and isinstance(result["same_token_ratio"], float)
    assert (tmp_path / "out" / "analysis.md").read_text().startswith("# Attention analysis")
    assert torch.is_grad_enabled()  # main() leaves the process as it found it (tests run in one process)


def test_compare_positions_draws_runs_side_by_side(data_root, tmp_path, monkeypatch):
    from tools import compare_positions
    folders = []
    for pos_encoding in ("rope", "learned"):
        run = save_checkpoint(str(tmp_path / pos_encoding), data_root, "mha", pos_encoding)
        analyze.main([run, "--windows=2"])
        folders.append(os.path.join(run, "analysis"))
    compare_positions.main([*folders, "--out", str(tmp_path / "positions.png")])
    with open(tmp_path / "positions.png", "rb") as f:
        assert f.read(8) == PNG_MAGIC
    work = tmp_path / "work"   # without --out: into the first folder, never the working folder
    work.mkdir()
    monkeypatch.chdir(work)
    compare_positions.main(folders)
    with open(os.path.join(folders[0], "positions.png"), "rb") as f:
        assert f.read(8) == PNG_MAGIC
    assert not os.listdir(work)


@pytest.mark.parametrize("args,words", [
    (["--layers", "0", "2"], "the model has 2 layers"),
    (["--length=64"], "longer than block_size=32"),
    (["--windows=0"], "--windows"),
    (["--prompt=caf\u00e9"], "not in the model's vocabulary"),
    (["--data_dir=/nonexistent"], "not found"),
])
def test_analyze_bad_input_is_one_line_and_exit_2(data_root, tmp_path, capsys, args, words):
    run = save_checkpoint(str(tmp_path / "run"), data_root, "mha", "learned")
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        analyze.main([run, *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and words in err and len(err.strip().splitlines()) == 1
    assert not os.path.exists(os.path.join(run, "analysis"))  # no work started


@pytest.mark.parametrize("folder,words", [("empty", "not found"), ("missing", "is not a folder")])
def test_analyze_cli_missing_checkpoint(tmp_path, folder, words):
    (tmp_path / "empty").mkdir()
    r = subprocess.run([sys.executable, "-m", "tools.analyze", str(tmp_path / folder)], cwd=ROOT,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_recording_is_off_outside_the_context():
    from attention import record
    with record_attention():
        assert record.state is not None
    assert record.state is None


def test_a_sliding_window_says_why_it_has_no_near_far_ratio(tmp_path):
    """swa with a window of 8 at length 32 attends nothing at distances >= 16: its near/far cells
    were a bare "-"; now they point to a footnote that gives the window."""
    model = make_model("swa", sliding_window=8)
    val = np.random.default_rng(0).integers(0, 65, 400).astype(np.uint16)  # what analyze reads from val.bin
    result = analyze.analyze(model, val, 32, 2)
    for curve in result["decay"]:  # the reason holds: no weight at all at distance >= 16 (here >= 8)
        far = [w for d, w in zip(curve["distance"], curve["weight"]) if d >= 8]
        assert far == [] or max(far) == 0
    assert result["near_far"] == [None, None] and result["near_far_uniform"] == [None, None]
    assert all("a sliding window of 8 tokens sees no key at distance >= 16" in w for w in result["near_far_why"])
    analyze.write_markdown(tmp_path / "a.md", {**result, "checkpoint": "ckpt.pt"})
    text = (tmp_path / "a.md").read_text()
    assert "| 0 | - (1) | - (1) |" in text and "\n(1) a sliding window of 8 tokens" in text
    mha = analyze.analyze(make_model("mha"), val, 32, 2)
    assert mha["near_far_why"] == [None, None] and all(v is not None for v in mha["near_far"])
