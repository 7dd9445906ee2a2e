"""NSA (attention/nsa.py) against what it is defined to be: the paper's three branches as an fp64 loop over
heads and queries (blocks picked by sorting Python lists, keys counted one by one), and fla's naive
references for each branch (fla-core, a test-only requirement: naive_nsa_compression, naive_nsa_topk,
naive_nsa_selection), outputs and gradients."""
import json
import math

import pytest
import torch

from attention.base import attend
from helpers import assert_sampling_same_with_and_without_cache, perturbed_model, tiny_model_kwargs, train_args
from model import GPTConfig


@torch.no_grad()
def loop_reference(attn, x):
    """One NSA layer in fp64 (no positions) -> (output (B, T, C), keys read per query averaged over t)."""
    x = x.double()
    B, T, C = x.shape
    H, Hkv, D = attn.n_head, attn.n_kv_head, attn.head_dim
    G, L, d, S, w = H // Hkv, attn.length, attn.stride, attn.topk, attn.window
    W = attn.c_attn.weight.double()
    q = (x @ W[:H * D].T).view(B, T, H, D)
    k = (x @ W[H * D:(H + Hkv) * D].T).view(B, T, Hkv, D)
    v = (x @ W[(H + Hkv) * D:].T).view(B, T, Hkv, D)
    gates = torch.sigmoid(x @ attn.branch_gate.weight.double().T + attn.branch_gate.bias.double()).view(B, T, H, 3)
    starts = [i * d for i in range(T) if i * d + L <= T]              # compressed blocks of the whole sequence
    out, keys_read = torch.zeros(B, T, H, D, dtype=torch.float64), 0
    for b in range(B):
        for t in range(T):
            visible = [s for s in starts if s + L - 1 <= t]
            for g in range(Hkv):
                kc = [k[b, s:s + L, g].mean(0) for s in visible]
                vc = [v[b, s:s + L, g].mean(0) for s in visible]
                probs = {}
                for h in range(g * G, (g + 1) * G):
                    if visible:
                        p = torch.stack([q[b, t, h] @ kci / math.sqrt(D) for kci in kc]).softmax(0)
                        out[b, t, h] += gates[b, t, h, 0] * sum(pi * vci for pi, vci in zip(p, vc))
                        probs[h] = p
                own = t // L
                score = {}
                for j in range(own + 1):
                    overlap = [n for n, s in enumerate(visible) if s < (j + 1) * L and s + L > j * L]
                    mean_p = sum(sum(float(probs[h][n]) for n in overlap) for h in probs) / G
                    score[j] = 1.0 if j in (0, own, own - 1) else mean_p
                chosen = sorted(score, key=lambda j: (-score[j], j))[:S]
                selected = [s for s in range(t + 1) if s // L in chosen]
                window = list(range(max(0, t - w + 1), t + 1))
                for h in range(g * G, (g + 1) * G):
                    for branch, keys in ((1, selected), (2, window)):
                        p = torch.stack([q[b, t, h] @ k[b, s, g] / math.sqrt(D) for s in keys]).softmax(0)
                        out[b, t, h] += gates[b, t, h, branch] * sum(pi * v[b, s, g] for pi, s in zip(p, keys))
                if b == 0 and g == 0:
                    keys_read += len(visible) + len(selected) + len(window)
    return out.view(B, T, H * D) @ attn.c_proj.weight.double().T, keys_read / T


@pytest.mark.parametrize("n_kv_head,stride", [(4, 0), (2, 0), (1, 2)])
def test_the_layer_is_the_papers_branches(n_kv_head, stride):
    model = perturbed_model(attention="nsa", pos_encoding="none", n_kv_head=n_kv_head, sparse_block=4,
                            nsa_stride=stride, nsa_topk=4, sliding_window=5)
    attn = model.h[0].attn
    x = torch.randn(2, 23, 32, generator=torch.Generator().manual_seed(0))
    want, mean_keys = loop_reference(attn, x)
    for impl in ("sdpa", "naive"):
        attn.attn_impl = impl
        with torch.no_grad():
            got = attn(x, torch.arange(23))
        assert (got.double() - want).abs().max() < 1e-5, impl
    assert attn.mean_keys_per_query(23) == pytest.approx(mean_keys)   # the FLOPs count: the keys read


@pytest.mark.parametrize("stride", [0, 2])
def test_the_recorded_map_is_the_weight_each_value_gets(stride):
    """tools.analyze's record of an nsa layer, times the gates' sum and applied to the values, gives the
    layer's mixture of its three branches (the mean compressor: exact), computed here from the layer's own
    v (its c_attn rows) and its output before c_proj."""
    from attention.record import record_attention
    model = perturbed_model(attention="nsa", pos_encoding="none", n_kv_head=2, sparse_block=4,
                            nsa_stride=stride, nsa_topk=3, sliding_window=3)
    attn = model.h[0].attn
    x = torch.randn(1, 19, 32, generator=torch.Generator().manual_seed(2))
    seen = {}
    attn.output = lambda y, x_: seen.setdefault("y", y)
    with torch.no_grad(), record_attention() as records:
        attn(x, torch.arange(19))
    (record,) = records
    H, Hkv, D = attn.n_head, attn.n_kv_head, attn.head_dim
    v = (x @ attn.c_attn.weight[(H + Hkv) * D:].T).view(1, 19, Hkv, D).transpose(1, 2)
    gates = torch.sigmoid(attn.branch_gate(x)).view(1, 19, H, 3)
    gates[:, :attn.length - 1, :, 0] = 0                 # no compressed block complete yet: no o_cmp
    gate_sum = gates.sum(-1).transpose(1, 2)[..., None]  # (1, H, T, 1)
    mixed = (record["probs"] * gate_sum) @ v.repeat_interleave(H // Hkv, dim=1)       # (1, H, T, D)
    assert (mixed - seen["y"]).abs().max() < 1e-5
    assert not record["probs"].masked_select(~record["allowed"]).any()


def fla_layout(*ts):
    return [t.transpose(1, 2) for t in ts]   # (B, H, T, D) <-> fla's [B, T, H, D]


def test_each_branch_equals_flas_naive_references():
    """The compressed branch (mean-pooled blocks), the blocks chosen and the selected branch, against
    fla's references on the same q, k, v: outputs, the blocks as a token mask, gradients; GQA 4/2."""
    fla = pytest.importorskip("fla.ops.nsa.naive", reason="fla-core absent: pip install fla-core")
    attn = perturbed_model(attention="nsa", pos_encoding="none", n_kv_head=2, sparse_block=8, nsa_topk=4).h[0].attn
    gen = torch.Generator().manual_seed(0)
    B, H, Hkv, T, D, bs = 2, 4, 2, 48, 8, 8
    q, k, v = (torch.randn(B, h, T, D, generator=gen, requires_grad=True) for h in (H, Hkv, Hkv))
    do = torch.randn(B, H, T, D, generator=gen)
    pos = torch.arange(T)
    kc, vc = attn.compress(k, v, 0, T // bs)
    assert (kc - k.view(B, Hkv, T // bs, bs, D).mean(3)).abs().max() < 1e-6
    scale = D ** -0.5

    got_cmp, p_cmp = attn.attend_compressed(q, kc, vc, pos, "cpu")
    want_cmp, _ = fla.naive_nsa_compression(*fla_layout(q, kc, vc), block_size=bs, scale=scale)
    want_cmp = want_cmp.transpose(1, 2)
    assert (got_cmp - want_cmp).abs().max() < 1e-5
    for a, b in zip(torch.autograd.grad(got_cmp, (q, k, v), do), torch.autograd.grad(want_cmp, (q, k, v), do)):
        assert (a - b).abs().max() < 1e-5

    keep = attn.selected_tokens(p_cmp, pos, T) & (pos[None, :] <= pos[:, None])          # (B, H, T, T)
    index = fla.naive_nsa_topk(*fla_layout(q, kc.detach()), block_counts=4, block_size=bs, scale=scale)
    chosen = torch.zeros(B, T, Hkv, T // bs + 1, dtype=torch.bool).scatter_(-1, index.clamp(min=-1) % (T // bs + 1),
                                                                            index >= 0)[..., :T // bs]
    want_keep = chosen.repeat_interleave(bs, dim=-1).transpose(1, 2).repeat_interleave(2, dim=1)
    want_keep &= pos[None, :] <= pos[:, None]
    assert torch.equal(keep, want_keep)

    got_slc = attend(q, k, v, pos, pos, keep=keep)
    want_slc = fla.naive_nsa_selection(*fla_layout(q, k, v), index, block_size=bs, scale=scale).transpose(1, 2)
    assert (got_slc - want_slc).abs().max() < 1e-5
    for a, b in zip(torch.autograd.grad(got_slc, (q, k, v), do), torch.autograd.grad(want_slc, (q, k, v), do)):
        assert (a - b).abs().max() < 1e-5


def test_the_mlp_compressor_decodes_exactly_and_learns():
    """nsa_compress=mlp: the paper's learned map of a block's keys; cached decoding equals the full forward,
    overlapping blocks (stride 2 of 4) included, and the map gets a gradient."""
    from helpers import decode_in_chunks
    model = perturbed_model(attention="nsa", pos_encoding="rope", sparse_block=4, nsa_stride=2, nsa_topk=3,
                            sliding_window=3, nsa_compress="mlp")
    idx = torch.randint(0, 65, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(idx)
        stepped, _ = decode_in_chunks(model, idx)
    assert (full - stepped).abs().max() <= 1e-4
    model(idx, idx)[1].backward()
    assert model.h[0].attn.compress.k_mlp[0].weight.grad.abs().max() > 0


def test_decoding_past_a_full_cache_counts_blocks_from_the_oldest_key():
    """A cache that slides (sample.py past block_size) starts its compressed keys over: one token at a time
    through a cache of 8, the last step equals the layer over those 8 tokens from scratch."""
    attn = perturbed_model(attention="nsa", pos_encoding="none", sparse_block=2, nsa_topk=3,
                           sliding_window=3).h[0].attn
    x = torch.randn(1, 13, 32, generator=torch.Generator().manual_seed(2))
    cache = attn.init_cache(1, 8, "cpu", torch.float32)
    with torch.no_grad():
        for t in range(13):
            stepped = attn(x[:, t:t + 1], torch.arange(t, t + 1), cache)
        fresh = attn(x[:, 5:], torch.arange(8))
    assert cache.kv.length == 8 and (stepped[:, 0] - fresh[:, -1]).abs().max() < 1e-5


@pytest.mark.parametrize("bad,match", [(dict(nsa_topk=2), "nsa_topk=2 must be at least 3"),
                                       (dict(nsa_stride=3), "nsa_stride=3 must divide sparse_block=4"),
                                       (dict(nsa_compress="max"), "unknown nsa_compress='max'"),
                                       (dict(pos_encoding="alibi"), "cannot take pos_encoding=alibi"),
                                       (dict(n_kv_head=3), "n_kv_head dividing")])
def test_refuses_settings_it_cannot_take(bad, match):
    with pytest.raises(ValueError, match=match):
        GPTConfig(**tiny_model_kwargs(**{"attention": "nsa", "sparse_block": 4, **bad}))


def test_train_round_trip_and_sample_same_with_and_without_cache(data_root, tmp_path, capsys):
    import train
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=30", "--eval_interval=30", "--attention=nsa",
                          "--sparse_block=4", "--sliding_window=8"))
    log = [json.loads(line) for line in open(out / "log.jsonl")]
    assert log[-1]["val_loss"] < log[0]["val_loss"] - 0.3
    assert_sampling_same_with_and_without_cache(out, capsys)


def test_the_triton_path_equals_sdpa_in_outputs_gradients_and_decoding():
    """attn_impl=triton (interpreted on CPU): the window branch on the flash kernel, against the SDPA path in
    logits, every parameter's gradient and cached decoding, GQA on."""
    from helpers import decode_in_chunks, logits_and_grads
    model = perturbed_model(attention="nsa", pos_encoding="rope", n_kv_head=2, sparse_block=4, sliding_window=6)
    idx = torch.randint(0, 65, (2, 24), generator=torch.Generator().manual_seed(3))
    results = []
    for impl in ("sdpa", "triton"):
        logits, grads = logits_and_grads(model, idx, impl)
        with torch.no_grad():
            stepped, _ = decode_in_chunks(model, idx)
        results.append((logits, stepped, grads))
    assert model.attn_impl_report("cpu")["used"]["window_forward"] == "triton"
    (want, want_steps, want_grads), (got, got_steps, got_grads) = results
    assert (got - want).abs().max() <= 1e-4 and (got_steps - want_steps).abs().max() <= 1e-4
    assert all((got_grads[n] - g).abs().max() <= 1e-4 for n, g in want_grads.items())
