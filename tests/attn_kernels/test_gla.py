"""Tests of the Triton chunked GLA kernel (attn_kernels/gla.py) against the loop reference.

On CPU the kernels run under the Triton interpreter (fp32, small shapes, the whole file well
under a minute on one core); the interpreter takes the diagonal blocks all at once, and one
test runs the compiled kernels' column-by-column path too. On CUDA the same tests run
natively, plus bf16/fp16 against the fp32 reference and T = 8192 with strong decay.
Errors are max abs differences, relative to max(1, max |reference|).
"""
import os

import torch

if not torch.cuda.is_available():  # must precede the first import of triton / attn_kernels.gla
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attn_kernels.gla as gla  # noqa: E402
from attn_kernels.env import available  # noqa: E402
from attn_kernels.gla import chunk_gla  # noqa: E402
from attn_kernels.reference import gla_reference  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

DEVICE = "cuda" if available("cuda") else "cpu"
cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA (compiled Triton)")


def make_inputs(B, H, Hkv, T, Dk, Dv, gate, with_state, dtype=torch.float32, seed=0):
    """q, k, v, g, initial_state, and the upstream gradients dO, dS_T."""
    gen = torch.Generator().manual_seed(seed)
    def rnd(*s):
        return torch.randn(*s, generator=gen)
    q, k, v = rnd(B, H, T, Dk), rnd(B, Hkv, T, Dk), rnd(B, Hkv, T, Dv)
    if gate == "moderate":  # decays spread over (0, 1): every term of the sums matters
        g = F.logsigmoid(rnd(B, Hkv, T, Dk) * 2 + 2)
    elif gate == "strong":  # 5-10 nats a step: a 64-token chunk decays by 320-640 nats
        g = -5 - 5 * torch.rand(B, Hkv, T, Dk, generator=gen)
    else:
        g = None
    s0 = rnd(B, Hkv, Dk, Dv) if with_state else None
    do, dst = rnd(B, H, T, Dv), rnd(B, Hkv, Dk, Dv)
    def to(x, dt=dtype):
        return None if x is None else x.to(DEVICE, dt)
    return to(q), to(k), to(v), to(g, torch.float32), to(s0, torch.float32), to(do), to(dst, torch.float32)


def run(fn, q, k, v, g, s0, do, dst, final=True, **kw):
    """Outputs and gradients of fn on fresh leaves: (o, S_T, dq, dk, dv, dg, ds0), None where absent."""
    leaves = [None if x is None else x.detach().clone().requires_grad_() for x in (q, k, v, g, s0)]
    o, st = fn(*leaves[:4], initial_state=leaves[4], output_final_state=final, **kw)
    loss = (o.float() * do.float()).sum() + (0 if st is None else (st * dst).sum())
    loss.backward()
    return (o, st, *(None if x is None else x.grad for x in leaves))


NAMES = ("o", "S_T", "dq", "dk", "dv", "dg", "ds0")


def assert_matches_reference(inputs, final=True, scale=None, chunk_size=64, tol_o=1e-4, tol_g=1e-3):
    ours = run(chunk_gla, *inputs, final=final, scale=scale, chunk_size=chunk_size)
    ref = run(gla_reference, *inputs, final=final, scale=scale)
    for name, a, b in zip(NAMES, ours, ref):
        assert (a is None) == (b is None), name
        if a is None:
            continue
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert torch.isfinite(a).all(), f"{name} is not finite"
        err = ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1.0)).item()
        tol = tol_o if name in ("o", "S_T") else tol_g
        assert err <= tol, f"{name}: error {err:.3g} > {tol}"


# (B, H, Hkv, T, Dk, Dv, chunk, gate, initial state, output_final_state): axes combined, not crossed
CASES = [
    (1, 2, 2, 64, 16, 16, 16, "moderate", False, True),   # MHA, T a multiple of the chunk
    (2, 4, 2, 80, 32, 16, 64, "moderate", True, True),    # batch 2, GQA, ragged tail, Dk > Dv, chunk 64
    (1, 4, 1, 90, 80, 32, 32, "strong", True, True),      # MQA, strong decay, Dk in 2 blocks of 64
    (1, 2, 2, 150, 16, 16, 64, "strong", False, False),   # strong decay over 3 chunks, no final state
    (1, 2, 1, 50, 16, 48, 16, None, True, True),          # plain linear attention, Dv padded to 64
    (1, 2, 2, 37, 24, 24, 64, "moderate", True, False),   # shorter than one chunk, padded dims
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}H{}kv{}T{}dk{}dv{}C{}-{}{}{}".format(
    *c[:8], "-h0" if c[8] else "", "-final" if c[9] else ""))
def test_fp32_matches_reference(case):
    B, H, Hkv, T, Dk, Dv, chunk, gate, with_state, final = case
    assert_matches_reference(make_inputs(B, H, Hkv, T, Dk, Dv, gate, with_state), final=final, chunk_size=chunk)


def test_column_loop_diagonal_matches_reference(monkeypatch):
    """The compiled kernels' diagonal path (column by column), run under the interpreter too."""
    monkeypatch.setattr(gla, "DIAG_LOOP", True)
    assert_matches_reference(make_inputs(1, 2, 1, 40, 16, 16, "moderate", True), chunk_size=32)


def test_scale_and_strided_inputs():
    # (B, T, H, D) storage viewed as (B, H, T, D), as the layer produces them
    q, k, v, g, s0, do, dst = make_inputs(1, 2, 2, 40, 16, 16, "moderate", True)
    q, k, v, g, do = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v, g, do))
    assert not q.is_contiguous()
    assert_matches_reference((q, k, v, g, s0, do, dst), scale=0.37, chunk_size=16)


def test_extreme_decay_stays_finite():
    """g = -1000 (forget everything at once) next to g = 0 (forget nothing): any exp of a
    positive exponent would overflow here."""
    q, k, v, g, s0, do, dst = make_inputs(1, 2, 2, 70, 16, 16, "moderate", True)
    g = torch.where(torch.arange(16, device=g.device) % 2 == 0, -1000.0, 0.0).expand_as(g).contiguous()
    assert_matches_reference((q, k, v, g, s0, do, dst), chunk_size=32)


def test_results_follow_input_dtypes_and_final_state_flag():
    q, k, v, g, s0, _, _ = make_inputs(1, 2, 2, 20, 16, 16, "moderate", True)
    o, st = chunk_gla(q, k, v, g, chunk_size=16)
    assert st is None and o.dtype == torch.float32 and o.shape == (1, 2, 20, 16)
    o, st = chunk_gla(q, k, v, g, initial_state=s0, output_final_state=True, chunk_size=16)
    assert st.dtype == torch.float32 and st.shape == (1, 2, 16, 16)


@pytest.mark.parametrize("change,match", [
    (dict(q=(1, 3, 20, 16)), "incompatible shapes"),          # 3 query heads, 2 KV heads
    (dict(v=(1, 2, 19, 16)), "incompatible shapes"),
    (dict(g=(1, 2, 20, 8)), "g must have k's shape"),
    (dict(s0=(1, 2, 16, 8)), "initial_state must be"),
    (dict(q=(1, 2, 20, 512), k=(1, 2, 20, 512), g=None, s0=None), "head dims <= 256"),
    (dict(chunk_size=24), "chunk_size must be a power of two >= 16"),
    (dict(chunk_size=8), "chunk_size must be a power of two >= 16"),
    (dict(dtype=torch.float64), "fp16, bf16 or fp32"),
], ids=["heads", "v-length", "g-shape", "state-shape", "head-dim", "chunk-24", "chunk-8", "float64"])
def test_rejects_bad_inputs(change, match):
    shapes = dict(q=(1, 2, 20, 16), k=(1, 2, 20, 16), v=(1, 2, 20, 16), g=(1, 2, 20, 16), s0=(1, 2, 16, 16))
    shapes.update({n: s for n, s in change.items() if n in shapes})
    dtype = change.get("dtype", torch.float32)
    x = {n: None if s is None else torch.zeros(s, dtype=dtype, device=DEVICE) for n, s in shapes.items()}
    with pytest.raises(ValueError, match=match):
        chunk_gla(x["q"], x["k"], x["v"], x["g"], initial_state=x["s0"], chunk_size=change.get("chunk_size", 16))


# ----------------------------------------------------------------------------- the layer

def _gla_layer(attn_impl, gla_chunk=16):
    torch.manual_seed(0)
    cfg = GPTConfig(block_size=32, vocab_size=65, n_layer=1, n_head=4, n_kv_head=2, n_embd=64,
                    attention="gla", pos_encoding="rope", gla_chunk=gla_chunk, attn_impl=attn_impl)
    return GPT(cfg).to(DEVICE).h[0].attn


@pytest.mark.parametrize("attn_impl,gla_chunk,uses_kernel", [
    ("triton", 16, True), ("triton", 8, False), ("sdpa", 16, False), ("naive", 16, False)])
def test_layer_dispatch(monkeypatch, attn_impl, gla_chunk, uses_kernel):
    """attn_impl=triton runs the kernel (a chunk it cannot take falls back to PyTorch's chunk_gla),
    and matches the reference; decoding one token keeps the recurrent step."""
    calls = []
    monkeypatch.setattr(gla, "chunk_gla", lambda *a, **kw: calls.append(kw) or chunk_gla(*a, **kw))
    attn = _gla_layer(attn_impl, gla_chunk)
    x = torch.randn(2, 20, 64, device=DEVICE)
    y = attn(x, torch.arange(20, device=DEVICE))
    assert len(calls) == uses_kernel and (not calls or calls[0]["chunk_size"] == gla_chunk)
    attn.attn_impl = "naive"
    assert (y - attn(x, torch.arange(20, device=DEVICE))).abs().max().item() <= 1e-5
    attn.attn_impl = attn_impl
    cache = attn.init_cache(2, 32, DEVICE, torch.float32)
    attn(x[:, :19], torch.arange(19, device=DEVICE), cache)  # prefill: the kernel again
    calls.clear()
    y_last = attn(x[:, 19:], torch.arange(19, 20, device=DEVICE), cache)
    assert calls == [] and (y_last - y[:, 19:]).abs().max().item() <= 1e-5


def test_model_training_matches_sdpa():
    """A tiny GLA model (GQA, RoPE, 2 chunks with a ragged tail) trained with attn_impl=triton
    follows attn_impl=sdpa (PyTorch's chunk_gla) loss for loss."""
    def losses(attn_impl, steps=2):
        torch.manual_seed(0)
        cfg = GPTConfig(block_size=24, vocab_size=65, n_layer=2, n_head=4, n_kv_head=2, n_embd=64,
                        attention="gla", pos_encoding="rope", gla_chunk=16, attn_impl=attn_impl)
        model = GPT(cfg).to(DEVICE)
        opt = model.configure_optimizers(0.1, 1e-2, (0.9, 0.99), "cpu")
        gen = torch.Generator().manual_seed(1)
        out = []
        for _ in range(steps):
            x = torch.randint(0, 65, (2, 24), generator=gen).to(DEVICE)
            _, loss = model(x[:, :-1], x[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append(loss.item())
        return out
    ours, want = losses("triton"), losses("sdpa")
    assert max(abs(a - b) for a, b in zip(ours, want)) <= 1e-4
    assert abs(ours[-1] - ours[0]) > 1e-3  # the steps change the loss: equal losses mean equal gradients


# ----------------------------------------------------------------------------- CUDA only

@cuda_only
@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 2e-2), (torch.float16, 1e-2)], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", [(2, 8, 2, 1000, 64, 64, 64, "moderate"), (1, 4, 4, 600, 128, 128, 64, "strong"),
                                  (1, 4, 1, 700, 128, 64, 32, None), (1, 2, 2, 300, 256, 256, 64, "moderate")],
                         ids=["gqa-d64", "mha-d128-strong", "mqa-dk128-dv64-nodecay", "d256"])
def test_low_precision_close_to_reference(case, dtype, tol):
    """Half-precision inputs against the fp32 reference on the same (rounded) inputs: the kernel
    computes in fp32 with TF32 dots, so the error is that of TF32 and of rounding the outputs."""
    B, H, Hkv, T, Dk, Dv, chunk, gate = case
    inputs = make_inputs(B, H, Hkv, T, Dk, Dv, gate, True, dtype=dtype)
    ours = run(chunk_gla, *inputs, chunk_size=chunk)
    ref = run(gla_reference, *(None if x is None else x.float() for x in inputs))
    for name, a, b in zip(NAMES, ours, ref):
        if a is None:
            continue
        assert a.dtype == (torch.float32 if name in ("S_T", "dg", "ds0") else dtype), name
        err = ((a.float() - b).norm() / b.norm()).item()
        assert err <= tol, f"{name}: relative error {err:.3g} > {tol}"


@cuda_only
@pytest.mark.parametrize("gate", ["strong", None])
def test_long_sequence_finite(gate):
    """T = 8192: strong decay (chunks decay by hundreds of nats) and none (the state only grows)."""
    inputs = make_inputs(1, 4, 2, 8192, 128, 128, gate, True, dtype=torch.bfloat16)
    results = run(chunk_gla, *inputs)
    assert all(torch.isfinite(x).all() for x in results if x is not None)
    if gate == "strong":  # memory is short: the end of the output depends on the last tokens only
        tail = [x[:, :, -200:] for x in inputs[:4]]
        o_tail, _ = gla_reference(*(x.float() for x in tail))
        assert ((results[0][:, :, -100:].float() - o_tail[:, :, -100:]).norm() / o_tail[:, :, -100:].norm()) <= 2e-2
