"""Gated linear attention: the layer (attention/gla.py) and its PyTorch forms (attn_kernels/gla_chunked.py).

- chunk_gla, recurrent_gla_step (stepped over time) and naive_recurrent_gla each equal an
  independent reference written here (a float64 loop over heads and time): outputs, final
  state and gradients of q, k, v, g and the initial state, for several chunk sizes,
  lengths on and off the chunk grid, GQA, with and without decay and an initial state;
- the layer equals a from-the-weights reference; cached decoding equals the full forward;
- T = 8192 with strong, weak and no decay stays finite forward and backward and exact;
  GLA's own decays take the one-matmul path; the math stays fp32 under autocast;
- the decode state's size does not grow;
- train.py + sample.py: greedy and seeded sampling agree with and without the cache;
- config checks give one line.
"""
import json

import pytest
import torch
import torch.nn.functional as F

from attention.linear_family import GATE_NORMALIZER
from attn_kernels import gla_chunked
from attn_kernels.gla_chunked import chunk_gla, recurrent_gla_step
from attn_kernels.reference import naive_recurrent_gla
from helpers import (
    assert_sampling_same_with_and_without_cache,
    decode_in_chunks,
    perturbed_model,
    set_attn_impl,
    tiny_model_kwargs,
    train_args,
)
from model import GPT, GPTConfig

# ---------------------------------------------------------------- the three forms

def reference_gla(q, k, v, g, scale, s0):
    """S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t, o_t = scale * q_t S_t, written out per
    query head (reading KV head h // (H / Hkv)) and per token, in float64."""
    B, H, T, Dk = q.shape
    Hkv = k.size(1)
    q, k, v = q.double(), k.double(), v.double()
    outs, finals = [], {}
    for h in range(H):
        kv = h // (H // Hkv)
        S = s0[:, kv].double() if s0 is not None else torch.zeros(B, Dk, v.size(-1), dtype=torch.float64)
        o_h = []
        for t in range(T):
            alpha = g[:, kv, t].double().exp() if g is not None else torch.ones(B, Dk, dtype=torch.float64)
            S = alpha[:, :, None] * S + torch.einsum("bi,bj->bij", k[:, kv, t], v[:, kv, t])
            o_h.append(scale * torch.einsum("bi,bij->bj", q[:, h, t], S))
        outs.append(torch.stack(o_h, dim=1))
        finals[kv] = S  # every query head of a group sees the same state
    return torch.stack(outs, dim=1), torch.stack([finals[i] for i in range(Hkv)], dim=1)


def stepped(q, k, v, g, scale, s0):
    """recurrent_gla_step applied token by token, as decoding does."""
    B, _, T, Dk = q.shape
    S = s0 if s0 is not None else torch.zeros(B, k.size(1), Dk, v.size(-1))
    outs = []
    for t in range(T):
        o, S = recurrent_gla_step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1],
                                  None if g is None else g[:, :, t:t + 1], S, scale=scale)
        outs.append(o)
    return torch.cat(outs, dim=2), S


CHUNK = lambda C: lambda *a: chunk_gla(*a[:4], scale=a[4], initial_state=a[5], output_final_state=True,  # noqa: E731
                                        chunk_size=C)
FORMS = {  # chunk_subchunked, chunk_pairwise: chunk_gla forced onto its sub-chunked paths (see the test)
    "chunk": CHUNK, "chunk_subchunked": CHUNK, "chunk_pairwise": CHUNK,
    "recurrent": lambda C: stepped,
    "naive": lambda C: lambda *a: naive_recurrent_gla(*a[:4], scale=a[4], initial_state=a[5], output_final_state=True),
}


def make_inputs(B, H, Hkv, T, Dk, Dv, gate, with_state, seed=0):
    gen = torch.Generator().manual_seed(seed)
    def rnd(*s):
        return torch.randn(*s, generator=gen)
    q, k, v = rnd(B, H, T, Dk), rnd(B, Hkv, T, Dk), rnd(B, Hkv, T, Dv)
    if gate == "moderate":   # decays spread over (0, 1): every term of the sums matters
        g = F.logsigmoid(rnd(B, Hkv, T, Dk) * 2 + 2)
    elif gate == "strong":   # up to -30 nats a step: exp(-b) of a textbook chunk form overflows
        g = -30 * torch.rand(B, Hkv, T, Dk, generator=gen) ** 2
    else:
        g = None
    s0 = rnd(B, Hkv, Dk, Dv) if with_state else None
    return q, k, v, g, s0


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


CASES = [  # T, chunk, n_kv_head, gate, initial state ("strong" takes the sub-chunked path)
    (64, 16, 4, "moderate", False),   # T a multiple of the chunk (sub-chunks of 4)
    (50, 16, 2, "moderate", True),    # ragged tail, GQA
    (37, 64, 4, "moderate", True),    # shorter than one chunk (sub-chunks of 8)
    (70, 24, 1, "moderate", False),   # chunk not a power of two (sub-chunks of 4), MQA
    (45, 8, 2, "strong", True),       # strong decay, short chunks (sub-chunks of 2)
    (100, 64, 2, "strong", False),    # strong decay, long chunks
    (33, 1, 4, "moderate", True),     # one token per chunk: all state passing
    (41, 16, 2, None, True),          # plain linear attention (g = None)
]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("T,chunk,n_kv_head,gate,with_state", CASES)
def test_forms_match_reference_values_and_gradients(monkeypatch, form, T, chunk, n_kv_head, gate, with_state):
    if form in ("chunk_subchunked", "chunk_pairwise"):  # no chunk's decay is small enough to factor it whole
        monkeypatch.setattr(gla_chunked, "MAX_FACTORED_SPAN", -1.0)
    if form == "chunk_pairwise":  # nor any sub-chunk's: the diagonal blocks as the pairwise tensor
        monkeypatch.setattr(gla_chunked, "MAX_SUB_CHUNK_SPAN", -1.0)
    B, H, Dk, Dv = 2, 4, 8, 6
    inputs = make_inputs(B, H, n_kv_head, T, Dk, Dv, gate, with_state)
    leaves = [x.requires_grad_() for x in inputs if x is not None]
    scale = Dk ** -0.5
    gen = torch.Generator().manual_seed(1)
    do, dS = torch.randn(B, H, T, Dv, generator=gen), torch.randn(B, n_kv_head, Dk, Dv, generator=gen)

    results = {}
    for name, fn in (("ref", reference_gla), (form, FORMS[form](chunk))):
        o, S = fn(*inputs[:4], scale, inputs[4])
        grads = torch.autograd.grad((o * do).sum() + (S * dS).sum(), leaves)
        results[name] = (o, S, grads)
    (o, S, grads), (o_ref, S_ref, grads_ref) = results[form], results["ref"]
    assert o.dtype == torch.float32 and o.shape == (B, H, T, Dv) and S.shape == (B, n_kv_head, Dk, Dv)
    assert rel_err(o, o_ref) <= 1e-4
    assert rel_err(S, S_ref) <= 1e-4
    for got, want in zip(grads, grads_ref):
        assert rel_err(got, want) <= 1e-4


def test_plain_linear_attention_is_masked_q_kt_v():
    """g = None is softmax attention with the softmax removed: scale * tril(Q K^T) V."""
    q, k, v, _, _ = make_inputs(1, 2, 2, 40, 8, 8, None, False)
    o, _ = chunk_gla(q, k, v, None, scale=0.5, chunk_size=16)
    want = (q @ k.transpose(-1, -2) * 0.5).tril() @ v
    assert rel_err(o, want) <= 1e-5


@pytest.mark.parametrize("decay", ["strong", "weak", "none"])
def test_long_sequence_is_finite_and_exact(decay):
    """T = 8192. strong: decays of up to 60 nats a step (exp(-b) of a chunk would
    overflow, exp(b) underflows) next to channels that barely decay; weak: the factored
    path over a long sequence; none: plain linear attention, whose state only grows.
    Forward and backward stay finite and equal the step-by-step recurrence."""
    B, H, T, D = 1, 2, 8192, 4
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    rate = {"strong": [60.0, 30.0, 1e-3, 0.0], "weak": [0.05, 0.01, 1e-3, 0.0], "none": None}[decay]
    g = None if rate is None else -(torch.tensor(rate) * torch.rand(B, H, T, D, generator=gen))
    leaves = [x.requires_grad_() for x in (q, k, v, g) if x is not None]
    do = torch.randn(B, H, T, D, generator=gen)
    o, S = chunk_gla(q, k, v, g, output_final_state=True)
    grads = torch.autograd.grad((o * do).sum() + S.sum(), leaves)
    assert all(torch.isfinite(t).all() for t in (o, S, *grads))
    with torch.no_grad():
        o_rec, S_rec = stepped(q, k, v, g, D ** -0.5, None)
    assert rel_err(o, o_rec) <= 1e-4 and rel_err(S, S_rec) <= 1e-4


def test_forms_compute_in_fp32_under_autocast():
    """Mixed-precision training must not push the state math into bf16."""
    q, k, v, g, s0 = make_inputs(1, 2, 2, 40, 8, 8, "moderate", True)
    for fn in (FORMS["chunk"](16), FORMS["naive"](16), stepped):
        want = fn(q, k, v, g, 0.3, s0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = fn(q, k, v, g, 0.3, s0)
        for a, b in zip(got, want):
            assert a.dtype == torch.float32 and rel_err(a, b) <= 1e-6


def test_typical_decays_take_the_factored_path(monkeypatch):
    """GLA's own decays (logsigmoid(.)/16) keep a 64-token chunk far below 40 nats, so
    training takes the one-matmul path; strong decays take the sub-chunked one."""
    calls = []
    real = gla_chunked._intra_chunk_scores
    monkeypatch.setattr(gla_chunked, "_intra_chunk_scores", lambda *a: calls.append(1) or real(*a))
    q, k, v, _, _ = make_inputs(1, 2, 2, 128, 8, 8, None, False)
    gen = torch.Generator().manual_seed(0)
    g = F.logsigmoid(torch.randn(1, 2, 128, 8, generator=gen) * 4) / GATE_NORMALIZER
    chunk_gla(q, k, v, g, chunk_size=64)
    assert calls == []
    chunk_gla(q, k, v, g * 100, chunk_size=64)
    assert calls == [1]


def largest_safe_sub_chunk(g, C, sizes=(32, 16, 8)):
    """The largest sub-chunk size whose every block decays by at most 40 nats from its first token
    to its last (the sum of -g over the block's tokens after the first), by a loop over blocks."""
    T = g.size(2)
    for size in sizes:
        spans = [-g[:, :, s + 1:s + size].sum(2) for c0 in range(0, T, C) for s in range(c0, c0 + C, size)]
        if max(span.max().item() for span in spans) <= 40:
            return size
    return None


@pytest.mark.parametrize("rate,size", [(1.5, 32), (3.0, 16), (5.0, 8), (30.0, None)])
def test_a_trained_gates_decay_picks_the_sub_chunk_path_that_stays_exact(monkeypatch, rate, size):
    """Decays of up to 1.5-5 nats a step take a 64-token chunk past the one-matmul form's 40 nats;
    chunk_gla then factors sub-chunks of the largest size (32, 16 or 8) that stays within 40, and
    at up to 30 a step none does (the pairwise tensor). Every path equals the float64 loop."""
    B, H, T, D = 2, 2, 128, 8
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    g = -rate * torch.rand(B, H, T, D, generator=gen)
    assert largest_safe_sub_chunk(g, 64) == size
    sizes = []
    real = gla_chunked._factored_through_sub_chunks
    monkeypatch.setattr(gla_chunked, "_factored_through_sub_chunks", lambda *a: sizes.append(a[-1]) or real(*a))
    o, S = chunk_gla(q, k, v, g, scale=D ** -0.5, output_final_state=True, chunk_size=64)
    assert sizes == ([] if size is None else [size])
    o_ref, S_ref = reference_gla(q, k, v, g, D ** -0.5, None)
    assert rel_err(o, o_ref) <= 1e-5 and rel_err(S, S_ref) <= 1e-5


def test_long_sequence_layer_forward_backward_finite():
    """The whole layer at T = 8192 with its gate biases pushed to strong decay (some
    channels forget almost everything every step) and to none at all."""
    torch.manual_seed(0)
    cfg = GPTConfig(**tiny_model_kwargs(attention="gla", n_layer=1, n_head=2, n_embd=16, block_size=8192))
    attn = GPT(cfg).h[0].attn
    with torch.no_grad():
        bias = attn.gk_proj[1].bias
        bias.copy_(torch.where(torch.arange(bias.numel()) % 2 == 0, -1000.0, 30.0))
    x = torch.randn(1, 8192, 16, requires_grad=True)
    y = attn(x, torch.arange(8192))
    y.square().mean().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


# ---------------------------------------------------------------- the layer and the model

def make_model(pos_encoding="rope", gla_gate="data", gla_feature_map="identity", n_kv_head=0, **kw):
    model = perturbed_model(attention="gla", pos_encoding=pos_encoding, gla_gate=gla_gate,
                            gla_feature_map=gla_feature_map, n_kv_head=n_kv_head, gla_chunk=8, **kw)
    with torch.no_grad():
        for block in model.h:
            if block.attn.gk_proj is not None:  # decays from ~0.6 to ~1 per step, per channel
                block.attn.gk_proj[1].bias.copy_(torch.randn_like(block.attn.gk_proj[1].bias) * 3)
    return model


MODEL_CASES = [  # pos_encoding, gla_gate, gla_feature_map, n_kv_head, gla_conv
    ("rope", "data", "identity", 4, 0),
    ("none", "data", "elu", 2, 0),
    ("rope", "none", "elu", 4, 0),
    ("none", "none", "identity", 1, 0),
    ("rope", "data", "elu", 2, 0),
    ("rope", "data", "identity", 4, 4),     # fla's use_short_conv
    ("none", "data", "elu", 2, 3),
]


def reference_layer(attn, x, pos_encoding, feature_map):
    """The layer from its weights, per head: the short convolution (F.conv1d over the left-padded
    sequence, then SiLU) on q, k and v if the layer has one, phi, RoPE by 2x2 rotations, the decay
    logsigmoid(W2 W1 x + b) / 16, the reference recurrence, RMSNorm, silu gate, c_proj."""
    B, T, _ = x.shape
    H, Hkv, D = attn.n_head, attn.n_kv_head, attn.head_dim
    W = attn.c_attn.weight
    proj = x @ W[:(H + 2 * Hkv) * D].T                                       # (B, T, (H + 2 Hkv) D)
    if attn.conv_weight is not None:
        K = attn.conv_weight.size(1)
        padded = F.pad(proj.transpose(1, 2), (K - 1, 0))                     # (B, channels, K - 1 + T)
        proj = F.silu(F.conv1d(padded, attn.conv_weight[:, None], groups=proj.size(-1))).transpose(1, 2)
    r_w = W[(H + 2 * Hkv) * D:]
    phi = (lambda t: F.elu(t) + 1) if feature_map == "elu" else (lambda t: t)
    ang = torch.arange(T)[:, None].double() * (10000.0 ** (-torch.arange(0, D, 2).double() / D))
    c, s = ang.cos().float(), ang.sin().float()

    def rot(t):
        if pos_encoding != "rope":
            return t
        e, o = t[..., 0::2], t[..., 1::2]
        return torch.stack((e * c - o * s, e * s + o * c), dim=-1).flatten(-2)

    def head(i):                                                             # (B, T, D)
        return proj[..., i * D:(i + 1) * D]

    q = torch.stack([rot(phi(head(h))) for h in range(H)], dim=1)            # (B, H, T, D)
    k = torch.stack([rot(phi(head(H + h))) for h in range(Hkv)], dim=1)
    v = torch.stack([head(H + Hkv + h) for h in range(Hkv)], dim=1)
    g = None
    if attn.gk_proj is not None:
        w1, w2, b2 = attn.gk_proj[0].weight, attn.gk_proj[1].weight, attn.gk_proj[1].bias
        g = (F.logsigmoid(x @ w1.T @ w2.T + b2) / 16).view(B, T, Hkv, D).transpose(1, 2)
    o, _ = reference_gla(q, k, v, g, D ** -0.5, None)
    o = o.float()
    o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + 1e-5) * attn.o_norm.weight
    o = o.transpose(1, 2) * F.silu(x @ r_w.T).view(B, T, H, D)
    return o.reshape(B, T, H * D) @ attn.c_proj.weight.T


@pytest.mark.parametrize("pos_encoding,gla_gate,feature_map,n_kv_head,gla_conv", MODEL_CASES)
def test_layer_matches_reference(pos_encoding, gla_gate, feature_map, n_kv_head, gla_conv):
    assert GATE_NORMALIZER == 16
    attn = make_model(pos_encoding, gla_gate, feature_map, n_kv_head, gla_conv=gla_conv).h[0].attn
    x = torch.randn(2, 20, 32)
    with torch.no_grad():
        got = attn(x, torch.arange(20))
        want = reference_layer(attn, x, pos_encoding, feature_map)
    assert rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("pos_encoding,gla_gate,feature_map,n_kv_head,gla_conv", MODEL_CASES)
def test_cached_decoding_equals_full_forward(pos_encoding, gla_gate, feature_map, n_kv_head, gla_conv):
    model = make_model(pos_encoding, gla_gate, feature_map, n_kv_head, gla_conv=gla_conv)
    idx = torch.randint(0, 65, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full, _ = model(idx)
        for impl in ("auto", "naive"):  # the chunked and the naive loop for multi-token calls
            set_attn_impl(model, impl)
            # a prefill past one chunk (8), a second multi-token call, then single tokens
            stepped, caches = decode_in_chunks(model, idx, splits=(11, 16))
            assert (full - stepped).abs().max().item() <= 1e-4
            assert caches[0].pos == 30


@pytest.mark.parametrize("gla_conv", [0, 4])
def test_decode_state_does_not_grow(gla_conv):
    model = make_model("rope", "data", "identity", 2, gla_conv=gla_conv)
    assert model.cache_elems_per_token() == 0
    caches = model.init_caches(1, 8)

    def measured():
        return sum(c.numel() for c in caches), sum(c.nbytes() for c in caches)

    with torch.no_grad():
        model(torch.zeros(1, 5, dtype=torch.long), caches=caches)
        tok = torch.zeros(1, 1, dtype=torch.long)
        sizes = {}
        for n in range(1, 1001):
            logits, _ = model(tok, caches=caches)
            tok = logits[:, -1].argmax(-1, keepdim=True)
            if n in (10, 1000):
                sizes[n] = measured()
    # n_kv_head * head_dim * head_dim, and the conv's last 3 inputs of q (4 heads), k and v (2 each) of 8
    per_layer = 2 * 8 * 8 + (3 * (4 + 2 * 2) * 8 if gla_conv else 0)
    assert sizes[10] == sizes[1000] == (2 * per_layer, 2 * per_layer * 4)   # 2 layers, fp32
    assert all(b.attn.cache_state_elems() == per_layer for b in model.h)
    assert caches[0].pos == 1005 and torch.isfinite(logits).all()


@pytest.mark.parametrize("kwargs,words", [
    (dict(pos_encoding="alibi"), "attention=gla works with pos_encoding rope, sinusoidal or none"),
    (dict(pos_encoding="learned"), "attention=gla works with pos_encoding rope, sinusoidal or none"),
    (dict(gla_gate="sigmoid"), "unknown gla_gate='sigmoid'; choose one of data, fixed, none"),
    (dict(gla_feature_map="softplus"), "unknown gla_feature_map='softplus'; choose one of identity, elu, relu"),
    (dict(gla_chunk=0), "gla_chunk=0 must be at least 1"),
    (dict(gla_conv=-1), "gla_conv=-1 must be at least 0"),
    (dict(n_kv_head=3), "not divisible by n_kv_head"),
])
def test_config_rejects_bad_values_in_one_line(kwargs, words):
    with pytest.raises(ValueError, match=words) as e:
        GPTConfig(**tiny_model_kwargs(attention="gla", **kwargs))
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- train.py and sample.py

@pytest.mark.parametrize("pos_encoding,gla_gate", [("rope", "data"), ("none", "none")])
def test_train_and_sample_same_with_and_without_cache(data_root, tmp_path, capsys, pos_encoding, gla_gate):
    import train
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=40", "--eval_interval=40", "--attention=gla",
                          "--gla_chunk=16", f"--pos_encoding={pos_encoding}", f"--gla_gate={gla_gate}"))
    log = [json.loads(line) for line in open(out / "log.jsonl")]
    assert log[-1]["val_loss"] < log[0]["val_loss"] - 0.3
    assert json.load(open(out / "summary.json"))["kv_cache_bytes_per_token"] == 0
    assert_sampling_same_with_and_without_cache(out, capsys)
