"""Training FLOPs per token, as each variant computes them (what budgets count), against counts made
here from the variant's dense boolean mask: the (query, key) pairs it keeps, times 4 * head_dim per
pair and head (q.k and p.v, 2 FLOPs per multiply-add), times 3 for training (forward + backward).
The masks are written out below (tril, band, the drawn BigBird layout, chunks) or are the one MoBA's
dense path applies; none of these numbers comes from the counting code. And PaLM's convention (every
one of the T keys) for MFU, and the budget tools (--match=flops) on the as-computed count."""
import math
import os

import pytest
import torch

import model as model_module
from helpers import ROOT, tiny_model_kwargs
from model import GPT, GPTConfig
from tools import budget, sweep
from trainer.settings import parse_keys


def layer(**kw):
    """The first attention layer of a tiny model (drawn for real: BigBird's layout is random)."""
    torch.manual_seed(0)
    return GPT(GPTConfig(**tiny_model_kwargs(**kw))).h[0].attn


def tril(T):
    return torch.ones(T, T, dtype=torch.bool).tril()


def chunk_mask(T, C):
    """Query i and key j in the same chunk of C tokens, j <= i: the chunked form's intra-chunk pairs."""
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    return (i // C == j // C) & (j <= i)


def softmax_flops(pairs, T, heads, head_dim):
    """Training FLOPs per token of softmax attention over `pairs` kept (query, key) pairs per head."""
    return 3 * 4 * head_dim * heads * int(pairs) / T


LENGTHS = (1, 5, 8, 13, 32, 45)   # below, at and between block and chunk boundaries


# ---- as computed: dense causal softmax ----
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("kw", [dict(attention="mha"), dict(attention="gqa", n_kv_head=2), dict(attention="mqa")],
                         ids=["mha", "gqa", "mqa"])
def test_dense_softmax_is_billed_the_causal_pairs(kw, T):
    attn = layer(**kw)
    assert attn.attn_flops_per_token(T) == pytest.approx(softmax_flops(tril(T).sum(), T, 4, 8))


@pytest.mark.parametrize("T", LENGTHS)
def test_mla_is_billed_its_expanded_head_dims_over_the_causal_pairs(T):
    attn = layer(attention="mla", kv_lora_rank=16, rope_head_dim=4, qk_nope_head_dim=12, v_head_dim=6)
    per_pair = 3 * 2 * 4 * (12 + 4 + 6)           # q.k over d_h + d_r, p.v over d_v, 4 heads
    assert attn.attn_flops_per_token(T) == pytest.approx(per_pair * int(tril(T).sum()) / T)


# ---- as computed: sparse softmax ----
@pytest.mark.parametrize("T", LENGTHS)
def test_swa_is_billed_the_pairs_of_its_band(T):
    W = 8
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    band = (j <= i) & (j > i - W)
    attn = layer(attention="swa", sliding_window=W)
    assert attn.attn_flops_per_token(T) == pytest.approx(softmax_flops(band.sum(), T, 4, 8))


def drawn_token_mask(layout, blk, T):
    """keep[i][j]: j <= i and j's block is selected for i's block in the drawn layout; a double loop."""
    rows = layout.tolist()
    return torch.tensor([[j <= i and rows[i // blk][j // blk] for j in range(T)] for i in range(T)])


@pytest.mark.parametrize("T", [t for t in LENGTHS if t <= 32])   # the layout ends at block_size
@pytest.mark.parametrize("rules", [(2, 1, 2), (1, 0, 0), (3, 2, 1), (1, 0, 7)])
def test_bigbird_is_billed_the_pairs_of_its_drawn_layout(rules, T):
    window, n_global, n_random = rules
    attn = layer(attention="bigbird", sparse_block=4, sparse_window=window, sparse_global=n_global,
                 sparse_random=n_random)
    keep = drawn_token_mask(attn.layout, 4, T)
    assert attn.attn_flops_per_token(T) == pytest.approx(softmax_flops(keep.sum(), T, 4, 8))


@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("seed", [0, 1])
def test_moba_is_billed_the_pairs_its_chosen_blocks_keep_and_its_gates(T, seed):
    """The token mask MoBA's dense path applies (per head, from random queries and keys), causal."""
    attn = layer(attention="moba", sparse_block=4, moba_topk=2)
    torch.manual_seed(seed)
    q, k = torch.randn(1, 4, T, 8), torch.randn(1, 4, T, 8)
    pos = torch.arange(T)
    keep = attn.token_keep(q, k, pos, pos) & tril(T)                      # (1, H, T, T)
    gates = 3 * 2 * 8 * 4 * math.ceil(T / 4)                               # q . mean(k) per block and head
    assert attn.attn_flops_per_token(T) == pytest.approx(softmax_flops(keep.sum(), T, 1, 8) + gates)


# ---- as computed: the chunked recurrent forms ----
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("kw", [dict(attention="gla"), dict(attention="gla", n_kv_head=2), dict(attention="linear"),
                                dict(attention="retnet"), dict(attention="efficient")],
                         ids=["gla", "gla-gqa", "linear", "retnet", "efficient"])
def test_linear_family_is_billed_the_causal_pairs_of_its_chunks_and_the_state(kw, T):
    attn = layer(gla_chunk=8, pos_encoding="none", **kw)
    H, Hkv, D = 4, attn.n_kv_head, 8
    state = 3 * 2 * (H + Hkv) * D * D                                      # q.S per query head, k^T v per KV head
    assert attn.attn_flops_per_token(T) == pytest.approx(softmax_flops(chunk_mask(T, 8).sum(), T, H, D) + state)


def solve_triples(T, C):
    """Multiply-adds of the forward substitution (I + A) X = diag(beta) within each chunk, A strictly
    lower: row i of X takes A[i, m] X[m, :] for m < i, and X[m, :] is nonzero in columns 0..m (all
    three in one chunk, which starts at s)."""
    return sum(1 for i in range(T) for s in [i // C * C] for m in range(s, i) for j in range(s, m + 1))


@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("attention", ["deltanet", "gated_deltanet"])
def test_delta_rule_is_billed_the_causal_pairs_of_its_chunks_the_solve_and_the_state(attention, T):
    C, H, D, taps = 8, 4, 8, 4
    attn = layer(attention=attention, delta_chunk=C, delta_conv=taps, pos_encoding="none")
    lower = int(chunk_mask(T, C).sum())
    strict = lower - T                                                     # K K^T: the diagonal left out
    per_head = (2 * D * (4 * lower + strict) + 2 * solve_triples(T, C)) / T + 6 * D * D + 2 * taps * 3 * D
    assert attn.attn_flops_per_token(T) == pytest.approx(3 * H * per_head)


# ---- PaLM's convention, for MFU only ----
@pytest.mark.parametrize("kw", [dict(attention="mha"), dict(attention="gqa", n_kv_head=2),
                                dict(attention="mla", kv_lora_rank=16)], ids=["mha", "gqa", "mla"])
def test_mfu_counts_every_key_as_palm_does(kw, monkeypatch):
    """flops_per_token_palm: 6N + 12 * L * H * D * T (appendix B, causal half not subtracted), and
    estimate_mfu divides that, not the as-computed count, by the device's peak."""
    kw = tiny_model_kwargs(block_size=32, **kw)
    model = GPT(GPTConfig(**kw))
    attn = model.h[0].attn
    per_key = 3 * 2 * (attn.qk_nope_head_dim + attn.rope_head_dim + attn.v_head_dim) if kw["attention"] == "mla" \
        else 3 * 4 * 8
    palm = 6 * model.num_params() + kw["n_layer"] * 4 * per_key * 32
    assert model.flops_per_token_palm() == palm
    assert model.flops_per_token() < palm
    monkeypatch.setattr(model_module, "device_peak_flops", lambda device: 1e12)
    assert model.estimate_mfu(1000.0, torch.device("cpu")) == pytest.approx(palm * 1000.0 / 1e12)


def test_palm_keeps_what_sparse_and_linear_variants_were_billed_before():
    """Without a causal saving: swa its full window, BigBird its most selected blocks, GLA its whole chunk."""
    T = 32
    swa = layer(attention="swa", sliding_window=8)
    assert swa.attn_flops_per_token_palm(T) == 3 * 4 * 8 * 4 * 8
    bigbird = layer(attention="bigbird", sparse_block=4, sparse_window=2, sparse_global=1, sparse_random=2)
    assert bigbird.attn_flops_per_token_palm(T) == 3 * 4 * 8 * 4 * (2 + 1 + 2) * 4
    gla = layer(attention="gla", gla_chunk=8, pos_encoding="none")
    assert gla.attn_flops_per_token_palm(T) == 3 * (4 * 4 * 8 * 8 + 2 * 8 * 8 * 8)


# ---- the budget tools count as computed ----
def test_match_flops_equalises_the_pairs_each_variant_computes():
    """budget.flops_ratio (sweep --match=flops) against 6N + the mask counts above, at equal tokens."""
    base = [os.path.join(ROOT, "config/base_shakespeare_char.py"), "--n_layer=2", "--n_head=4", "--n_embd=32",
            "--block_size=32"]
    keys = {"mha": parse_keys([*base, "--attention=mha"]),
            "gla": parse_keys([*base, "--attention=gla", "--gla_chunk=8"])}
    params = {a: budget.meta_model(k, 65).num_params() for a, k in keys.items()}
    T, H, D = 32, 4, 8
    attn = {"mha": softmax_flops(tril(T).sum(), T, H, D),
            "gla": softmax_flops(chunk_mask(T, 8).sum(), T, H, D) + 3 * 2 * (H + H) * D * D}
    total = {a: 6 * params[a] + 2 * attn[a] for a in keys}
    assert budget.flops_ratio(keys["gla"], keys["mha"], 65) == pytest.approx(total["mha"] / total["gla"])


def test_a_sweep_matched_under_the_old_flops_count_is_refused(tmp_path):
    """Its plan.json (no flops_count among the inputs) would resume with the old budgets: refused."""
    opts = {"match": ("params", "flops"), "lr_grid": None, "lr_fraction": 0.25, "probe_iters": 50, "lr_from": None}
    inputs = sweep.plan_inputs(["config/mha.py", "config/gla.py"], opts, [])
    assert inputs["flops_count"] == budget.FLOPS_COUNT
    old = {k: v for k, v in inputs.items() if k != "flops_count"}
    sweep.save_plan(str(tmp_path), {"inputs": old, "configs": {}})
    with pytest.raises(SystemExit):
        sweep.load_plan(str(tmp_path), inputs)
    assert sweep.load_plan(str(tmp_path / "new"), inputs)["configs"] == {}
