"""The linear-attention family in attention/gla.py (decay x feature map x normaliser) against the
quadratic form written here: the T x T matrix of phi(q_i) . phi(k_j) with the decays between j and i,
masked causally, normalised by its row sums for gla_norm=sum; outputs and gradients, for the chunked
PyTorch form and the token-by-token reference; decoding equal to the full forward."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import decode_in_chunks, set_attn_impl, tiny_model_kwargs
from model import GPT, GPTConfig

MAPS = {"identity": lambda t: t, "elu": lambda t: F.elu(t) + 1, "relu": F.relu, "softmax": None}
COMBOS = [c for c in itertools.product(("none", "fixed", "data"), MAPS, ("rms", "sum", "none"))
          if not (c[1] in ("identity", "softmax") and c[2] == "sum")]   # refused: see test_bad_combinations


def layer_kwargs(decay, fmap, norm, **kw):
    return tiny_model_kwargs(attention="gla", pos_encoding="none", gla_gate=decay, gla_feature_map=fmap,
                             gla_norm=norm, gla_chunk=8, n_kv_head=2, **kw)


def quadratic_reference(layer, x, decay, fmap, norm, gated=True):
    """The layer's output from its weights, by the T x T form (no recurrence, no chunks); gated:
    the swish output gate (its r projection after v in c_attn)."""
    B, T, _ = x.shape
    H, Hkv, D = layer.n_head, layer.n_kv_head, layer.head_dim
    q, k, v, *r = layer.c_attn(x).split([H * D, Hkv * D, Hkv * D] + [H * D] * gated, dim=-1)
    q, k, v = q.view(B, T, H, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
    if fmap != "softmax":
        q, k = MAPS[fmap](q), MAPS[fmap](k)
    if decay == "data":                                          # GLA: logsigmoid(W2 W1 x) / 16
        g = (F.logsigmoid(layer.gk_proj(x)) / 16).view(B, T, Hkv, D)
    elif decay == "fixed":                                       # RetNet: log(1 - 2^(-5-h)) per KV head
        g = torch.log(1 - 2.0 ** (-5 - torch.arange(Hkv, dtype=torch.float32))).view(1, 1, Hkv, 1)
        g = g.expand(B, T, Hkv, D)
    else:
        g = torch.zeros(B, T, Hkv, D)
    G = g.cumsum(dim=1)                                          # (B, T, Hkv, D) decay from 0 to t
    kv_head = torch.arange(H) // (H // Hkv)
    decays = torch.exp(G[:, :, None, kv_head] - G[:, None, :, kv_head])   # (B, i, j, H, D): exp(G_i - G_j)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    if fmap == "softmax":  # Efficient Attention: per feature d, key j weighs exp(k_jd) exp(G_id - G_jd)
        w = (k[:, None, :, kv_head].double().exp() * decays.double()).masked_fill(~causal[None, :, :, None, None], 0)
        rows = torch.einsum("bijhd,bjhe->bihde", w, v[:, :, kv_head].double()) / w.sum(2)[..., None]
        o = torch.einsum("bihd,bihde->bhie", q.double().softmax(-1), rows).float()
        return finish(layer, o, r[0] if gated else None, norm, B, T, H, D)
    A = torch.einsum("bihd,bijhd,bjhd->bhij", q, decays.masked_fill(~causal[None, :, :, None, None], 0.0),
                     k[:, :, kv_head]) / math.sqrt(D)                         # (B, H, T, T)
    o = A @ v[:, :, kv_head].transpose(1, 2)                                  # (B, H, T, D)
    if norm == "sum":
        o = o / (A.sum(-1, keepdim=True) + 1e-6)
    return finish(layer, o, r[0] if gated else None, norm, B, T, H, D)


def finish(layer, o, r, norm, B, T, H, D):
    """o (B, H, T, D) through the per-head RMSNorm (norm=rms), the swish gate (r, or None) and c_proj."""
    if norm == "rms":
        o = F.rms_norm(o, (D,), layer.o_norm.weight, eps=1e-5)
    o = o.transpose(1, 2)
    if r is not None:
        o = o * F.silu(r.view(B, T, H, D))
    return layer.c_proj(o.reshape(B, T, H * D))


@pytest.mark.parametrize("impl", ["sdpa", "naive"])
@pytest.mark.parametrize("decay,fmap,norm", COMBOS)
def test_chunked_and_recurrent_equal_the_quadratic_form(decay, fmap, norm, impl):
    torch.manual_seed(0)
    layer = GPT(GPTConfig(**layer_kwargs(decay, fmap, norm))).h[0].attn
    layer.attn_impl = impl
    x = torch.randn(2, 21, 32, requires_grad=True)                  # 21: chunks of 8, the last ragged
    out = layer(x, torch.arange(21))
    ref = quadratic_reference(layer, x, decay, fmap, norm)
    assert (out - ref).abs().max().item() <= 1e-5
    g = torch.randn_like(out)
    params = [x, layer.c_attn.weight] + ([layer.gk_proj[0].weight] if decay == "data" else [])
    for a, b in zip(torch.autograd.grad(out, params, g), torch.autograd.grad(ref, params, g)):
        assert (a - b).abs().max().item() <= 1e-4


@pytest.mark.parametrize("decay,fmap,norm", COMBOS)
def test_decoding_equals_the_full_forward(decay, fmap, norm):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**layer_kwargs(decay, fmap, norm))).eval()
    idx = torch.randint(0, 65, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(idx)
        stepped, caches = decode_in_chunks(model, idx)
        set_attn_impl(model, "naive")
        naive, _ = model(idx)
    assert (full - stepped).abs().max().item() <= 1e-4 and (full - naive).abs().max().item() <= 1e-4
    assert caches[0].state.shape[-1] == 8 + (norm == "sum") + 3 * (fmap == "softmax")   # normalisers' columns


def test_one_token_steps_go_through_recur():
    """A member that overrides recur (the README's way to change the recurrence) is used by decoding's
    one-token steps too (LinearFamilyAttention.step), not only by the full forward and the prefill."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**layer_kwargs("data", "identity", "rms"))).eval()
    seen, layer = [], model.h[0].attn
    recur = layer.recur
    layer.recur = lambda q, *args: seen.append(q.size(2)) or recur(q, *args)
    with torch.no_grad():
        decode_in_chunks(model, torch.randint(0, 65, (1, 5)), splits=(2, 3))
    assert seen == [2, 1, 1, 1]


@pytest.mark.parametrize("decay", [False, True])
def test_the_softmax_pair_is_finite_and_exact_for_keys_of_magnitude_50(decay):
    """The pair against float64 math without any rescaling (exp(50) fits float64), with its
    gradients finite: the running max keeps every exponent <= 0 in fp32."""
    from attn_kernels.gla_chunked import chunk_gla, softmax_pair_gla
    from attn_kernels.reference import naive_recurrent_gla
    g = torch.Generator().manual_seed(0)
    q, v = torch.randn(1, 2, 40, 8, generator=g), torch.randn(1, 1, 40, 8, generator=g)
    k = (50 * torch.randn(1, 1, 40, 8, generator=g)).requires_grad_()
    gate = -torch.rand(1, 1, 40, 8, generator=g) if decay else None
    S, Z, expected = torch.zeros(8, 8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64), []
    for t in range(40):
        e = torch.ones(8, dtype=torch.float64) if gate is None else gate[0, 0, t].double().exp()
        S = e[:, None] * S + k[0, 0, t].double().exp()[:, None] * v[0, 0, t].double()[None]
        Z = e * Z + k[0, 0, t].double().exp()
        expected.append(q[0, :, t].double().softmax(-1) @ (S / Z[:, None]))
    expected = torch.stack(expected, dim=1)                               # (2, 40, 8)
    for gla in (chunk_gla, naive_recurrent_gla):
        o, _ = softmax_pair_gla(q, k, v, gate, gla=gla)
        assert (o[0].double() - expected).abs().max().item() <= 1e-5
        (grad,) = torch.autograd.grad(o.sum(), [k])
        assert torch.isfinite(grad).all()


def test_gla_defaults_keep_their_weights_and_buffers():
    """Old GLA checkpoints load: the family's knobs add no parameter or saved buffer by default."""
    model = GPT(GPTConfig(**tiny_model_kwargs(attention="gla")))
    assert not any("fixed_log_decay" in k for k in model.state_dict())
    assert model.h[0].attn.value_dim == model.h[0].attn.head_dim


@pytest.mark.parametrize("kw,words", [
    (dict(gla_norm="sum", gla_feature_map="identity", pos_encoding="none"), "use gla_feature_map=elu or relu"),
    (dict(gla_norm="sum", gla_feature_map="elu", pos_encoding="rope"), "use pos_encoding sinusoidal or none"),
    (dict(gla_feature_map="tanh"), "unknown gla_feature_map='tanh'"),
    (dict(gla_feature_map="softmax", pos_encoding="none", gla_norm="sum"), "softmax normalises itself"),
    (dict(gla_feature_map="softmax", pos_encoding="rope"), "softmax normalises itself"),
    (dict(gla_gate="learned"), "unknown gla_gate='learned'"),
    (dict(pos_encoding="alibi"), "attention=gla works with pos_encoding"),
])
def test_bad_combinations(kw, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        GPTConfig(**tiny_model_kwargs(attention="gla", **kw))
