"""FoX (attention/fox.py) against what it is defined to be: the paper's equations as an fp64 loop over
heads and key positions (the forget bias summed term by term, not by a cumulative sum), fla's naive
forgetting attention (fla-core, a test-only requirement), and ALiBi when the gate is fixed at exp(-m)."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from attention.base import attend
from attention.positional import alibi_slopes
from helpers import assert_sampling_same_with_and_without_cache, perturbed_model, tiny_model_kwargs, train_args
from model import GPT, GPTConfig


def loop_reference(attn, x):
    """One FoX layer in fp64 from the paper (no positions): per head h, q = x W_q^h, k, v likewise (GQA by
    head groups), log f_t = log sigmoid(x_t w_f^h + b_f^h), score(i, j) = q_i . k_j / sqrt(D) +
    sum_{l=j+1..i} log f_l for j <= i, softmax, times v; fox_pro: RMSNorm on q and k, the sigmoid gate."""
    x = x.double()
    B, T, C = x.shape
    H, Hkv, D = attn.n_head, attn.n_kv_head, attn.head_dim
    W = attn.c_attn.weight.double()
    Wq, Wk, Wv = W[:H * D], W[H * D:(H + Hkv) * D], W[(H + Hkv) * D:]
    log_f = F.logsigmoid(x @ attn.fgate.weight.double().T + attn.fgate.bias.double())   # (B, T, H)

    def rms(t, norm):
        return t if norm is None else t / (t.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt() * norm.weight.double()

    out = torch.zeros(B, T, H * D, dtype=torch.float64)
    for h in range(H):
        g = h // (H // Hkv)
        q = rms(x @ Wq[h * D:(h + 1) * D].T, attn.q_norm)
        k = rms(x @ Wk[g * D:(g + 1) * D].T, attn.k_norm)
        v = x @ Wv[g * D:(g + 1) * D].T
        for i in range(T):
            scores = torch.full((B, T), -math.inf, dtype=torch.float64)
            for j in range(i + 1):
                forget = sum((log_f[:, m, h] for m in range(j + 1, i + 1)), torch.zeros(B, dtype=torch.float64))
                scores[:, j] = (q[:, i] * k[:, j]).sum(-1) / math.sqrt(D) + forget
            out[:, i, h * D:(h + 1) * D] = torch.einsum("bj,bjd->bd", scores.softmax(-1), v)
    if attn.gate_proj is not None:
        out = out * torch.sigmoid(x @ attn.gate_proj.weight.double().T)
    return out @ attn.c_proj.weight.double().T


@pytest.mark.parametrize("n_kv_head,fox_pro", [(4, False), (2, False), (1, True)])
def test_the_layer_is_the_papers_equations(n_kv_head, fox_pro):
    model = perturbed_model(attention="fox", pos_encoding="none", n_kv_head=n_kv_head, fox_pro=fox_pro)
    attn = model.h[0].attn
    with torch.no_grad():   # gates away from 0.5, some near 1 (long memory), some near 0
        attn.fgate.bias.copy_(torch.tensor([3.0, 0.0, -2.0, 1.0]))
    x = torch.randn(2, 9, 32, generator=torch.Generator().manual_seed(0))
    want = loop_reference(attn, x)
    for impl in ("sdpa", "naive"):
        attn.attn_impl = impl
        with torch.no_grad():
            got = attn(x, torch.arange(9))
        assert (got.double() - want).abs().max() < 1e-5, impl


def test_a_fixed_gate_is_alibi():
    """f_t = exp(-m_h) for every token (gate weights 0, bias logit(exp(-m_h))): c_i - c_j = -m_h (i - j),
    ALiBi's bias with slope m_h, so FoX without positions = MHA with ALiBi on the same weights."""
    alibi = perturbed_model(attention="mha", pos_encoding="alibi")
    fox = GPT(GPTConfig(**tiny_model_kwargs(attention="fox", pos_encoding="none"))).eval()
    missing = fox.load_state_dict(alibi.state_dict(), strict=False).missing_keys
    assert sorted(missing) == [f"h.{i}.attn.fgate.{p}" for i in range(2) for p in ("bias", "weight")]
    m = alibi_slopes(4).double()
    for block in fox.h:
        with torch.no_grad():
            block.attn.fgate.weight.zero_()
            block.attn.fgate.bias.copy_(torch.log(torch.exp(-m) / (1 - torch.exp(-m))))   # sigmoid(b) = exp(-m)
    idx = torch.randint(0, 65, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (fox(idx)[0] - alibi(idx)[0]).abs().max() < 1e-5
        fox.h[0].attn.fgate.bias.add_(0.5)   # another slope: the comparison can fail
        assert (fox(idx)[0] - alibi(idx)[0]).abs().max() > 1e-3


def test_attend_with_the_forget_bias_equals_flas_naive_forgetting_attention():
    """Outputs and gradients (q, k, v and the log gates) against fla's naive_forgetting_attn, GQA included."""
    fla = pytest.importorskip("fla.ops.forgetting_attn.naive", reason="fla-core absent: pip install fla-core")
    gen = torch.Generator().manual_seed(0)
    B, H, Hkv, T, D = 2, 4, 2, 20, 16
    q, k, v = (torch.randn(B, h, T, D, generator=gen, requires_grad=True) for h in (H, Hkv, Hkv))
    g = F.logsigmoid(torch.randn(B, H, T, generator=gen) + 2).requires_grad_()
    do = torch.randn(B, H, T, D, generator=gen)
    want = fla.naive_forgetting_attn(*(t.transpose(1, 2) for t in (q, k, v, g))).transpose(1, 2)   # [B, T, H, D]
    want_grads = torch.autograd.grad(want, (q, k, v, g), do)
    pos = torch.arange(T)
    for impl in ("sdpa", "naive"):
        c = g.cumsum(-1)
        got = attend(q, k, v, pos, pos, forget=(c, c), impl=impl)
        grads = torch.autograd.grad(got, (q, k, v, g), do)
        assert (got - want).abs().max() < 1e-5, impl
        for a, b in zip(grads, want_grads):
            assert (a - b).abs().max() < 1e-4, impl


def test_decoding_past_a_full_cache_keeps_the_differences():
    """A cache that slides (sample.py past block_size) restarts c from its oldest key: one token at a time
    through a cache of 8, the last step equals the layer over those 8 tokens from scratch."""
    attn = perturbed_model(attention="fox", pos_encoding="none").h[0].attn
    x = torch.randn(1, 12, 32, generator=torch.Generator().manual_seed(2))
    cache = attn.init_cache(1, 8, "cpu", torch.float32)
    with torch.no_grad():
        for t in range(12):
            stepped = attn(x[:, t:t + 1], torch.arange(t, t + 1), cache)
        fresh = attn(x[:, 4:], torch.arange(8))
    assert cache.length == 8 and (stepped[:, 0] - fresh[:, -1]).abs().max() < 1e-5


def test_refuses_heads_it_cannot_group():
    with pytest.raises(ValueError, match="n_kv_head dividing"):
        GPTConfig(**tiny_model_kwargs(attention="fox", n_kv_head=3))


def test_train_round_trip_and_sample_same_with_and_without_cache(data_root, tmp_path, capsys):
    import train
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=30", "--eval_interval=30", "--attention=fox",
                          "--pos_encoding=none"))
    log = [json.loads(line) for line in open(out / "log.jsonl")]
    assert log[-1]["val_loss"] < log[0]["val_loss"] - 0.3
    summary = json.load(open(out / "summary.json"))
    assert summary["kv_cache_bytes_per_token"] == 2 * (2 * 4 * 8 + 4) * 4   # 2 layers, fp32 on CPU
    assert_sampling_same_with_and_without_cache(out, capsys)


def test_the_triton_path_equals_sdpa_in_outputs_gradients_and_decoding():
    """attn_impl=triton (interpreted on CPU): the flash kernel with the gates read per tile, against the SDPA
    path in logits, every parameter's gradient (the gate's through dc) and cached decoding, GQA and ALiBi on."""
    from helpers import decode_in_chunks, logits_and_grads
    model = perturbed_model(attention="fox", pos_encoding="alibi", n_kv_head=2)
    idx = torch.randint(0, 65, (2, 24), generator=torch.Generator().manual_seed(3))
    results = []
    for impl in ("sdpa", "triton"):
        logits, grads = logits_and_grads(model, idx, impl)
        with torch.no_grad():
            stepped, _ = decode_in_chunks(model, idx)
        results.append((logits, stepped, grads))
        assert model.attn_impl_report("cpu")["used"] == impl
    (want, want_steps, want_grads), (got, got_steps, got_grads) = results
    assert (got - want).abs().max() <= 1e-4 and (got_steps - want_steps).abs().max() <= 1e-4
    assert all((got_grads[n] - g).abs().max() <= 1e-4 for n, g in want_grads.items())
    assert want_grads["h.0.attn.fgate.weight"].abs().max() > 1e-4
