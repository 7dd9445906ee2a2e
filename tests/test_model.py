"""The GPT with the MHA family: cached decoding == full forward, GQA == MHA with shared
K/V, cache sizes from the tensors, an independent attention reference, config checks."""
import itertools

import pytest
import torch

from helpers import (
    ATTENTIONS,
    POS_ENCODINGS,
    decode_in_chunks,
    perturbed_model,
    reference_qkv_attention,
    set_attn_impl,
    tiny_model_kwargs,
)
from model import GPT, GPTConfig

COMBOS = list(itertools.product(ATTENTIONS, POS_ENCODINGS))


def make_model(attention, pos_encoding, **kw):
    return perturbed_model(attention=attention, n_kv_head=ATTENTIONS.get(attention, 0), pos_encoding=pos_encoding, **kw)


@pytest.mark.parametrize("attention,pos_encoding", COMBOS)
def test_cached_decoding_equals_full_forward(attention, pos_encoding):
    model = make_model(attention, pos_encoding)
    idx = torch.randint(0, 65, (2, 30))
    full, _ = model(idx)
    stepped, _ = decode_in_chunks(model, idx)                  # prefill 7, then 5, then single tokens
    assert (full - stepped).abs().max().item() <= 1e-4


@pytest.mark.parametrize("attention,pos_encoding", COMBOS)
def test_attn_impls_agree(attention, pos_encoding):
    model = make_model(attention, pos_encoding)
    idx = torch.randint(0, 65, (2, 30))
    sdpa, _ = model(idx)
    set_attn_impl(model, "naive")
    naive, _ = model(idx)
    assert (sdpa - naive).abs().max().item() <= 1e-5


@pytest.mark.parametrize("attention,pos_encoding", [(a, p) for a, p in COMBOS if p != "learned"])
def test_attention_layer_matches_reference(attention, pos_encoding):
    model = make_model(attention, pos_encoding)
    attn = model.h[0].attn
    x = torch.randn(2, 20, 32)
    with torch.no_grad():
        got = attn(x, torch.arange(20))
        want = reference_qkv_attention(attn, x, pos_encoding)
    assert (got - want).abs().max().item() <= 1e-5


def test_mha_class_with_all_kv_heads_equals_gqa_with_repeated_kv():
    """GQA's grouped computation equals MHA whose K/V weights repeat each KV head."""
    gqa = make_model("gqa", "rope")
    mha = make_model("mha", "rope")
    H, Hkv, D = 4, 2, 8
    with torch.no_grad():
        for bg, bm in zip(gqa.h, mha.h):
            Wg = bg.attn.c_attn.weight
            q_w, k_w, v_w = Wg[:H * D], Wg[H * D:(H + Hkv) * D], Wg[(H + Hkv) * D:]
            def rep(w):
                return w.view(Hkv, D, -1).repeat_interleave(H // Hkv, dim=0).reshape(H * D, -1)
            bm.attn.c_attn.weight.copy_(torch.cat([q_w, rep(k_w), rep(v_w)]))
            for name in ("c_proj", ):
                getattr(bm.attn, name).weight.copy_(getattr(bg.attn, name).weight)
            bm.mlp.load_state_dict(bg.mlp.state_dict())
            bm.ln_1.load_state_dict(bg.ln_1.state_dict())
            bm.ln_2.load_state_dict(bg.ln_2.state_dict())
        mha.wte.weight.copy_(gqa.wte.weight)
        mha.ln_f.load_state_dict(gqa.ln_f.state_dict())
    idx = torch.randint(0, 65, (2, 24))
    assert (gqa(idx)[0] - mha(idx)[0]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_cache_size_matches_formula(attention):
    model = make_model(attention, "rope")
    B, max_len = 3, 17
    caches = model.init_caches(B, max_len, dtype=torch.bfloat16)
    measured = sum(c.numel() for c in caches) / (B * max_len * len(caches))
    n_kv = {"mha": 4, "gqa": 2, "mqa": 1}[attention]
    assert measured == 2 * n_kv * (32 // 4)
    assert sum(c.nbytes() for c in caches) == measured * 2 * B * max_len * len(caches)
    assert model.cache_elems_per_token() == measured * len(caches)


@pytest.mark.parametrize("pos_encoding", ["rope", "alibi", "none"])
def test_sliding_cache_equals_windowed_recompute_for_one_layer(pos_encoding):
    """Past max_context the cache slides. With one layer a token's K/V depend only on that
    token, so sliding must equal recomputing the last max_context tokens from scratch."""
    model = make_model("gqa", pos_encoding, n_layer=1)
    idx = torch.randint(0, 65, (1, 10))
    kw = dict(temperature=0, max_context=16)
    with_cache = model.generate(idx, 40, use_cache=True, **kw)
    without = model.generate(idx, 40, use_cache=False, **kw)
    assert torch.equal(with_cache, without)


@pytest.mark.parametrize("pos_encoding", POS_ENCODINGS)
def test_generate_past_block_size(pos_encoding):
    model = make_model("mqa", pos_encoding)
    out = model.generate(torch.zeros(2, 5, dtype=torch.long), 60, temperature=1.0, top_k=10, top_p=0.9,
                         generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 65) and out.max() < 65


def test_top_k_and_top_p_restrict_the_choice():
    from model import sample_next
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).repeat(200, 1)
    g = torch.Generator().manual_seed(0)
    assert set(sample_next(logits, 1.0, top_k=2, generator=g).tolist()) == {2, 3}
    # probs 0.032, 0.087, 0.237, 0.644: top_p=0.8 keeps {3, 2}, top_p=0.5 keeps {3}
    assert set(sample_next(logits, 1.0, top_p=0.8, generator=g).tolist()) == {2, 3}
    assert set(sample_next(logits, 1.0, top_p=0.5, generator=g).tolist()) == {3}
    assert sample_next(logits[:1], 0).item() == 3


@pytest.mark.parametrize("kwargs,words", [
    (dict(attention="xyz"), "unknown attention"),
    (dict(pos_encoding="sinusoid"), "unknown pos_encoding"),
    (dict(attention="gqa", n_kv_head=3), "gqa needs"),
    (dict(attention="mqa", n_kv_head=2), "mqa means"),
    (dict(n_embd=30), "not divisible by n_head"),
    (dict(attn_impl="cuda"), "unknown attn_impl"),
])
def test_config_rejects_bad_values(kwargs, words):
    with pytest.raises(ValueError, match=words):
        GPTConfig(**tiny_model_kwargs(**kwargs))


def test_flops_per_token_counts_the_causal_half_and_mfu_follows_palm():
    kw = tiny_model_kwargs(block_size=256)
    mha = GPT(GPTConfig(attention="mha", **kw))
    L, C, T = kw["n_layer"], kw["n_embd"], kw["block_size"]
    assert mha.flops_per_token_palm() == 6 * mha.num_params() + 12 * L * C * T   # PaLM appendix B
    assert mha.flops_per_token() == 6 * mha.num_params() + 12 * L * C * (T * (T + 1) // 2) / T  # tril pairs
    sparse = GPT(GPTConfig(attention="bigbird", sparse_block=16, sparse_window=2, sparse_random=1, **kw))
    linear = GPT(GPTConfig(attention="gla", gla_chunk=16, **kw))
    for model in (sparse, linear):  # their attention terms: a fraction of dense causal softmax's
        assert 0 < model.flops_per_token() - 6 * model.num_params() < 12 * L * C * (T + 1) / 2 / 2


def test_counted_only_gives_the_loss_and_gradients_of_the_counted_positions():
    """The head only where a target counts (datasets of examples): its logits are the full forward's rows
    there, and loss and gradients equal the cross-entropy written out over those rows of the full logits."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16))
    x = torch.randint(0, 50, (3, 16))
    marked = torch.rand(3, 16) < 0.25
    y = torch.full((3, 16), -1).masked_scatter(marked, torch.randint(0, 50, (int(marked.sum()),)))
    params = list(model.parameters())
    full, _ = model(x)                                                       # (B, T, V), no targets
    want = -full.double().log_softmax(-1)[marked].gather(-1, y[marked][:, None]).mean()
    want_grads = torch.autograd.grad(want, params)
    logits, loss = model(x, y, counted_only=True)
    assert 0 < marked.sum() < marked.numel() and logits.shape == (int(marked.sum()), 50)
    torch.testing.assert_close(logits, full[marked].detach())
    torch.testing.assert_close(loss.double(), want.detach(), rtol=1e-6, atol=1e-6)
    for g, w in zip(torch.autograd.grad(loss, params), want_grads):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
