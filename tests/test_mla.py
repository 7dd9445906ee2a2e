"""MLA (attention/mla.py) against DeepSeek-V2's equations: the training forward equals a
per-head reference written here; absorbed decoding (latent cache) and expanded decoding
(per-head K/V cache) both equal a full forward; the cache holds kv_lora_rank + rope_head_dim
per token; sampling with and without the cache agrees; training lowers the loss; bad
values are refused in one line."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import train
from attention.cache import KVCache, LatentCache
from helpers import (
    POS_ENCODINGS,
    ROOT,
    assert_sampling_same_with_and_without_cache,
    decode_in_chunks,
    logits_and_grads,
    tiny_model_kwargs,
    train_args,
)
from model import GPT, GPTConfig

# tiny_model_kwargs: n_embd=32, n_head=4 -> d_h = 8; the paper's ratios give d_c = 32, d_r = 4


def make_model(pos_encoding, noise=0.05, **kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**tiny_model_kwargs(attention="mla", pos_encoding=pos_encoding, **kw))).eval()
    with torch.no_grad():  # larger weights than init so that positions and heads matter
        for p in model.parameters():
            p.add_(torch.randn_like(p) * noise)
    return model


def expanded_twin(model):
    """The same weights, decoding with per-head K/V (mla_decode changes no parameter)."""
    cfg = GPTConfig(**{**model.config.to_dict(), "mla_decode": "expanded"})
    twin = GPT(cfg).eval()
    twin.load_state_dict(model.state_dict())
    return twin


# ---------------------------------------------------------------- reference from the paper

def rms_norm(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x, base=10000.0):
    """Rotate pairs (x[2i], x[2i+1]) of the last dim by m * base^(-2i/d) at position m = 0..T-1."""
    T, d = x.size(-2), x.size(-1)
    ang = torch.arange(T)[:, None].double() * (base ** (-torch.arange(0, d, 2).double() / d))
    c, s = ang.cos().float(), ang.sin().float()
    e, o = x[..., 0::2], x[..., 1::2]
    return torch.stack((e * c - o * s, e * s + o * c), dim=-1).flatten(-2)


def reference_mla_layer(attn, x, pos_encoding):
    """DeepSeek-V2 eqs. 9-19, one head at a time (no biases: the layers under test have none).

    The module packs W_UQ/W_QR per head as [nope d_h | rope d_r] rows of one matrix, and
    W_DKV/W_KR as [d_c | d_r] rows of kv_down: only that layout is taken from it.
    """
    B, T, C = x.shape
    H, d_h, d_c, d_r = attn.n_head, attn.qk_nope_head_dim, attn.kv_lora_rank, attn.rope_head_dim
    d_v = attn.v_head_dim
    if attn.q_lora_rank:                                   # c_Q = W_DQ h, normalized (eq. 12)
        c_q, w_q = rms_norm(x @ attn.q_down.weight.T, attn.q_norm.weight), attn.q_up.weight
    else:
        c_q, w_q = x, attn.q_proj.weight
    w_q = w_q.view(H, d_h + d_r, -1)
    W_UQ, W_QR = w_q[:, :d_h], w_q[:, d_h:]                # (H, d_h, .), (H, d_r, .)
    W_DKV, W_KR = attn.kv_down.weight[:d_c], attn.kv_down.weight[d_c:]
    W_UK = attn.k_up.weight.view(H, d_h, d_c)
    W_UV = attn.v_up.weight.view(H, d_v, d_c)
    c_kv = x @ W_DKV.T                                     # eq. 9
    if isinstance(attn.kv_norm, torch.nn.RMSNorm):         # DeepSeek-V2's latent norm (mla_latent_norm)
        c_kv = rms_norm(c_kv, attn.kv_norm.weight)
    k_r = rope(x @ W_KR.T) if d_r else None                # eq. 15: one RoPE key for all heads
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    outs = []
    for h in range(H):
        q_c = c_q @ W_UQ[h].T                              # eq. 13
        k_c = c_kv @ W_UK[h].T                             # eq. 10
        v_c = c_kv @ W_UV[h].T                             # eq. 11
        scores = q_c @ k_c.transpose(-1, -2)
        if d_r:
            scores = scores + rope(c_q @ W_QR[h].T) @ k_r.transpose(-1, -2)   # eqs. 14, 16-17
        scores = scores / math.sqrt(d_h + d_r)             # eq. 18
        if pos_encoding == "alibi":
            slope = 2.0 ** (-2.0 * (h + 1))                # 4 heads: 1/4, 1/16, 1/64, 1/256
            i = torch.arange(T)
            scores = scores - slope * (i[:, None] - i[None, :]).float()
        outs.append(scores.masked_fill(causal, float("-inf")).softmax(-1) @ v_c)
    return torch.cat(outs, dim=-1) @ attn.c_proj.weight.T  # eq. 19


@pytest.mark.parametrize("pos_encoding,kw", [
    ("rope", {}),
    ("rope", dict(q_lora_rank=12, kv_lora_rank=20, rope_head_dim=6)),
    ("alibi", dict(q_lora_rank=12)),
    ("none", {}),
    # head dims free of n_embd (H * d_h = 48 != 32) and d_v != d_h; no latent norm
    ("rope", {"q_lora_rank": 12, "kv_lora_rank": 20, "rope_head_dim": 4, "qk_nope_head_dim": 12, "v_head_dim": 6}),
    ("none", {"v_head_dim": 10, "mla_latent_norm": False}),
])
def test_training_forward_matches_paper_reference(pos_encoding, kw):
    attn = make_model(pos_encoding, noise=0.2, **kw).h[0].attn
    x = torch.randn(2, 20, 32)
    with torch.no_grad():
        got = attn(x, torch.arange(20))
        want = reference_mla_layer(attn, x, pos_encoding)
    assert (got - want).abs().max().item() <= 1e-5


# ---------------------------------------------------------------- decoding

@pytest.mark.parametrize("pos_encoding,kw", [(p, {}) for p in POS_ENCODINGS] + [
    ("rope", dict(q_lora_rank=16, bias=True)),
    ("alibi", dict(kv_lora_rank=12, dropout=0.1)),   # dropout: eval() must switch it off
    ("rope", {"qk_nope_head_dim": 12, "v_head_dim": 6, "kv_lora_rank": 20, "q_lora_rank": 16, "bias": True}),
    ("learned", {"v_head_dim": 10, "mla_latent_norm": False, "bias": True}),
])
def test_absorbed_and_expanded_decoding_equal_full_forward(pos_encoding, kw):
    absorbed = make_model(pos_encoding, **kw)
    expanded = expanded_twin(absorbed)
    idx = torch.randint(0, 65, (2, 30))
    full, _ = absorbed(idx)
    got_a, caches_a = decode_in_chunks(absorbed, idx)
    got_e, caches_e = decode_in_chunks(expanded, idx)
    assert isinstance(caches_a[0], LatentCache) and isinstance(caches_e[0], KVCache)
    assert (got_a - got_e).abs().max().item() <= 1e-4
    assert (full - got_a).abs().max().item() <= 1e-4
    assert (full - got_e).abs().max().item() <= 1e-4


@pytest.mark.parametrize("mla_decode", ["absorbed", "expanded"])
def test_sliding_latent_cache_equals_windowed_recompute_for_one_layer(mla_decode):
    """Past max_context the cache slides; with one layer that must equal recomputing the window."""
    model = make_model("rope", n_layer=1, mla_decode=mla_decode)
    idx = torch.randint(0, 65, (1, 10))
    kw = dict(temperature=0, max_context=16)
    assert torch.equal(model.generate(idx, 40, use_cache=True, **kw), model.generate(idx, 40, use_cache=False, **kw))


def test_triton_kernel_runs_both_forms():
    """attn_impl=triton (interpreted on CPU): training form with Dqk = d_h + d_r != Dv = d_h, and
    the absorbed form with one shared KV head, both equal to the PyTorch path."""
    model = make_model("rope", n_layer=1)
    idx = torch.randint(0, 65, (1, 12))
    want, _ = model(idx)
    want_steps, _ = decode_in_chunks(model, idx)
    model.h[0].attn.attn_impl = "triton"
    got, _ = model(idx)
    got_steps, _ = decode_in_chunks(model, idx)
    assert (got - want).abs().max().item() <= 1e-4
    assert (got_steps - want_steps).abs().max().item() <= 1e-4


# ---------------------------------------------------------------- cache size

@pytest.mark.parametrize("pos_encoding,kw,d_c,d_r", [
    ("rope", {}, 4 * 8, 8 // 2),                        # the paper's ratios, d_h = 8
    ("rope", dict(kv_lora_rank=12, rope_head_dim=6), 12, 6),
    ("alibi", {}, 4 * 8, 0),                            # no RoPE key without RoPE
])
def test_cache_holds_only_the_latent(pos_encoding, kw, d_c, d_r):
    B, max_len, H, d_h = 3, 17, 4, 8
    for mode, per_token in (("absorbed", d_c + d_r), ("expanded", H * (2 * d_h + d_r))):
        model = make_model(pos_encoding, mla_decode=mode, **kw)
        caches = model.init_caches(B, max_len, dtype=torch.bfloat16)
        measured = sum(c.numel() for c in caches) / (B * max_len * len(caches))
        assert measured == per_token
        assert sum(c.nbytes() for c in caches) == per_token * 2 * B * max_len * len(caches)
        assert model.cache_elems_per_token() == per_token * len(caches)


def test_default_ratios_at_gpt2_small_width():
    """n_head=12, d_h=64: MHA caches 2*12*64 = 1536 per token per layer, MLA 4*64 + 32 = 288."""
    cfg = GPTConfig(**tiny_model_kwargs(attention="mla", n_head=12, n_embd=768, n_layer=1))
    assert (cfg.kv_lora_rank, cfg.rope_head_dim) == (256, 32)
    assert GPT(cfg).cache_elems_per_token() == 288


# ---------------------------------------------------------------- train.py and sample.py

def test_training_lowers_loss_and_sampling_with_cache_matches_without(data_root, tmp_path, capsys):
    """One tiny run (RoPE, absorbed cache); the other position encodings and the expanded cache
    are covered at the model level above, which is cheaper than training each."""
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=40", "--eval_interval=40", "--attention=mla"))
    with open(out / "log.jsonl") as f:
        log = [json.loads(line) for line in f]
    assert log[-1]["val_loss"] < log[0]["val_loss"] - 0.5
    d_c, d_r = 4 * 8, 8 // 2
    summary = json.load(open(out / "summary.json"))
    assert summary["kv_cache_bytes_per_token"] == 2 * (d_c + d_r) * 4        # 2 layers, fp32
    assert_sampling_same_with_and_without_cache(out, capsys)


# ---------------------------------------------------------------- configuration

def test_defaults_follow_the_papers_ratios():
    rope = GPTConfig(**tiny_model_kwargs(attention="mla"))
    assert (rope.kv_lora_rank, rope.rope_head_dim, rope.n_kv_head) == (32, 4, 4)
    alibi = GPTConfig(**tiny_model_kwargs(attention="mla", pos_encoding="alibi"))
    assert (alibi.kv_lora_rank, alibi.rope_head_dim) == (32, 0)
    # d_h = 12: d_h / 2 = 6; d_h = 4: 2 (one pair); round trip through a checkpoint's dict
    assert GPTConfig(**tiny_model_kwargs(attention="mla", n_embd=48)).rope_head_dim == 6
    assert GPTConfig(**tiny_model_kwargs(attention="mla", n_head=8)).rope_head_dim == 2
    assert GPTConfig.from_dict(rope.to_dict()) == rope


@pytest.mark.parametrize("kwargs,words", [
    (dict(kv_lora_rank=-1), "kv_lora_rank=-1 must be >= 0"),
    (dict(q_lora_rank=-3), "q_lora_rank=-3 must be >= 0"),
    (dict(rope_head_dim=3), "rope_head_dim=3 must be even"),
    (dict(rope_head_dim=0), "rope_head_dim=0 must be even and > 0 with pos_encoding=rope"),
    (dict(rope_head_dim=-2), "rope_head_dim=-2 must be -1"),
    (dict(rope_head_dim=4, pos_encoding="alibi"), "rope_head_dim=4 needs pos_encoding=rope"),
    (dict(mla_decode="fast"), "unknown mla_decode='fast'; choose one of absorbed, expanded"),
    (dict(n_kv_head=2), "has no KV heads to share"),
])
def test_config_rejects_bad_values(kwargs, words):
    with pytest.raises(ValueError, match=words) as err:
        GPTConfig(**tiny_model_kwargs(attention="mla", **kwargs))
    assert "\n" not in str(err.value)


def test_train_refuses_bad_mla_values_in_one_line(data_root, tmp_path):
    r = subprocess.run([sys.executable, "train.py", "config/mla.py", f"--data_dir={data_root}",
                        f"--out_dir={tmp_path}", "--rope_head_dim=5"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2
    assert "rope_head_dim=5" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "log.jsonl")


# ---------------------------------------------------------------- head dims free of n_embd

def test_training_forward_matches_transformers_deepseek_v2_attention():
    """Hugging Face's DeepseekV2Attention with d_h = 12, d_v = 6, d_r = 4 (H * d_h != n_embd and
    d_h + d_r != d_v), weights mapped onto ours; its kv_b_proj holds per head [W_UK_h ; W_UV_h]."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as ds
    H, d_h, d_v, d_r, d_c, d_q = 4, 12, 6, 4, 20, 16
    attn = make_model("rope", noise=0.2, qk_nope_head_dim=d_h, v_head_dim=d_v, rope_head_dim=d_r,
                      kv_lora_rank=d_c, q_lora_rank=d_q).h[0].attn
    cfg = transformers.DeepseekV2Config(hidden_size=32, num_attention_heads=H, num_key_value_heads=H,
                                        qk_nope_head_dim=d_h, qk_rope_head_dim=d_r, v_head_dim=d_v,
                                        kv_lora_rank=d_c, q_lora_rank=d_q, attention_bias=False)
    cfg._attn_implementation = "eager"
    ref = ds.DeepseekV2Attention(cfg, 0).eval()
    with torch.no_grad():
        ref.q_a_proj.weight.copy_(attn.q_down.weight)
        ref.q_a_layernorm.weight.copy_(attn.q_norm.weight)
        ref.q_b_proj.weight.copy_(attn.q_up.weight)
        ref.kv_a_proj_with_mqa.weight.copy_(attn.kv_down.weight)
        ref.kv_a_layernorm.weight.copy_(attn.kv_norm.weight)
        ref.kv_b_proj.weight.copy_(torch.cat([attn.k_up.weight.view(H, d_h, d_c),
                                              attn.v_up.weight.view(H, d_v, d_c)], dim=1).reshape(-1, d_c))
        ref.o_proj.weight.copy_(attn.c_proj.weight)
        T = 20
        x = torch.randn(2, T, 32)
        freqs = ds.DeepseekV2RotaryEmbedding(cfg)(x, torch.arange(T)[None])
        causal = torch.full((T, T), float("-inf")).triu(1)[None, None]
        want, _ = ref(x, attention_mask=causal, position_embeddings=freqs)
        got = attn(x, torch.arange(T))
    assert (got - want).abs().max().item() <= 1e-5


def deepseek_v2_attention_params(C, H, d_h, d_v, d_r, d_c, d_q):
    """Parameters of one DeepSeek-V2 attention layer from the paper's matrices (section 2.1, no biases):
    W_DQ, q norm, W_UQ, W_QR, W_DKV, W_KR, latent norm, W_UK, W_UV, W_O."""
    return (C * d_q + d_q + d_q * H * d_h + d_q * H * d_r + C * d_c + C * d_r + d_c
            + d_c * H * d_h + d_c * H * d_v + H * d_v * C)


@pytest.mark.parametrize("bias", [False, True])
def test_deepseek_v2_shapes_build_on_meta(bias):
    """DeepSeek-V2: 5120 wide, 128 heads of 128 (+ 64 RoPE dims), d_c = 512, q_lora_rank 1536:
    the cache holds d_c + d_R = 576 per token per layer, and the layer has the paper's parameters
    (with bias: DeepSeek-V2's attention_bias on W_DQ, W_DKV/W_KR and W_O, counted by transformers)."""
    shapes = {"C": 5120, "H": 128, "d_h": 128, "d_v": 128, "d_r": 64, "d_c": 512, "d_q": 1536}
    with torch.device("meta"):
        model = GPT(GPTConfig(attention="mla", n_layer=1, n_embd=5120, n_head=128, qk_nope_head_dim=128,
                              v_head_dim=128, rope_head_dim=64, kv_lora_rank=512, q_lora_rank=1536,
                              vocab_size=100, block_size=64, bias=bias))
    attn = model.h[0].attn
    n = sum(p.numel() for p in attn.parameters())
    want = deepseek_v2_attention_params(**shapes)
    if bias:
        want += shapes["d_q"] + shapes["d_c"] + shapes["d_r"] + shapes["C"]
    assert n == want
    assert model.cache_elems_per_token() == 576
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention
    cfg = transformers.DeepseekV2Config(hidden_size=5120, num_attention_heads=128, num_key_value_heads=128,
                                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                        kv_lora_rank=512, q_lora_rank=1536, attention_bias=bias)
    with torch.device("meta"):
        assert n == sum(p.numel() for p in DeepseekV2Attention(cfg, 0).parameters())


def test_expanded_cache_holds_both_head_dims():
    model = make_model("rope", mla_decode="expanded", qk_nope_head_dim=12, v_head_dim=6, rope_head_dim=4)
    caches = model.init_caches(2, 9)
    assert sum(c.numel() for c in caches) / (2 * 9 * len(caches)) == 4 * (12 + 4 + 6)
    assert model.cache_elems_per_token() == 4 * (12 + 4 + 6) * len(caches)


@pytest.mark.parametrize("kwargs,words", [
    ({"qk_nope_head_dim": -1}, "qk_nope_head_dim=-1 must be >= 0"),
    ({"attention": "gqa", "n_kv_head": 2, "v_head_dim": 8}, "v_head_dim=8 is set but no variant of attention=gqa"),
])
def test_head_dim_keys_refuse_bad_values(kwargs, words):
    with pytest.raises(ValueError, match=words) as err:
        GPTConfig(**tiny_model_kwargs(**{"attention": "mla", **kwargs}))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("kw", [{}, {"qk_nope_head_dim": 6, "v_head_dim": 12, "rope_head_dim": 2}])
def test_sdpa_training_path_equals_naive_attention_with_gradients(kw):
    """The SDPA path pads q/k or v to one head dim (to stay on PyTorch's fused kernels); outputs and
    gradients must equal the explicit-softmax path, which attends with the unpadded dims."""
    model = make_model("rope", dropout=0.0, **kw).train()
    idx = torch.randint(0, 65, (2, 30))
    (got, got_grads), (want, want_grads) = (logits_and_grads(model, idx, impl) for impl in ("sdpa", "naive"))
    assert (got - want).abs().max().item() <= 1e-5
    assert max((got_grads[n] - g).abs().max().item() for n, g in want_grads.items()) <= 1e-5
