"""BigBird block-sparse attention (attention/bigbird.py) against independent references.

- the layout follows the window / global / random rules (checked row by row in plain
  Python), is reproducible, and survives a state_dict round trip into a model that drew
  a different layout;
- the gathered training path equals a per-head loop over full scores with the token mask
  written out as a double loop (forward and gradients), and its outputs depend exactly on
  the keys that mask allows (Jacobian probe: its own position, never a later one);
- a window covering every block is plain causal attention (the MHA class), a window of
  one block with nothing else is per-block causal attention;
- cached decoding equals the full forward; greedy and seeded sampling agree with and
  without the cache after a short training run; bad settings give one line.
"""
import io
import os
import subprocess
import sys

import pytest
import torch

from helpers import (
    POS_ENCODINGS,
    ROOT,
    assert_sampling_same_with_and_without_cache,
    decode_in_chunks,
    perturbed_model,
    reference_qkv_attention,
    set_attn_impl,
    tiny_model_kwargs,
    train_args,
)
from model import GPT, GPTConfig

# block_size 32 in blocks of 4: 8 blocks, each query block sees at most 2 + 1 + 2 of them
SPARSE = dict(attention="bigbird", sparse_block=4, sparse_window=2, sparse_global=1, sparse_random=2)


def make_model(pos_encoding="rope", seed=0, **kw):
    return perturbed_model(seed, **{**SPARSE, "pos_encoding": pos_encoding, **kw})


def naive_token_mask(layout, blk, T):
    """keep[i][j]: j <= i and j's block is selected for i's block; a plain double loop."""
    rows = layout.tolist()
    return torch.tensor([[j <= i and rows[i // blk][j // blk] for j in range(T)] for i in range(T)])


# ---- the layout ----

@pytest.mark.parametrize("n_blocks,window,n_global,n_random", [
    (8, 2, 1, 2), (16, 3, 1, 1), (16, 1, 0, 3), (16, 1, 2, 15), (5, 9, 0, 0), (8, 2, 8, 1)])
def test_layout_follows_the_rules(n_blocks, window, n_global, n_random):
    blk = 4
    model = make_model(block_size=n_blocks * blk, sparse_block=blk, sparse_window=window,
                       sparse_global=n_global, sparse_random=n_random, n_layer=1)
    attn = model.h[0].attn
    rows = attn.layout.tolist()
    assert len(rows) == n_blocks
    for i, row in enumerate(rows):
        chosen = {j for j, on in enumerate(row) if on}
        fixed = {j for j in range(n_blocks) if i - window < j <= i or j < min(n_global, i + 1)}
        assert i in chosen and max(chosen) <= i                    # the diagonal, nothing later
        assert fixed <= chosen                                     # window and global blocks
        left = (i + 1) - len(fixed)                                # earlier blocks not yet chosen
        assert len(chosen - fixed) == min(n_random, left)          # random blocks, all earlier
        count = attn.block_count[i].item()
        assert count == len(chosen)
        assert sorted(attn.block_idx[i, :count].tolist()) == sorted(chosen)
        assert all(0 <= j <= i for j in attn.block_idx[i].tolist())  # padding gathers a real block


def test_layout_is_seeded_per_layer_and_seed():
    kw = dict(block_size=64, sparse_block=4, sparse_window=2, sparse_random=2, n_layer=2)
    a, b, c = make_model(**kw), make_model(**kw, seed=1), make_model(**kw, sparse_seed=3)
    assert torch.equal(a.h[0].attn.layout, b.h[0].attn.layout)       # weights' seed: no effect
    assert not torch.equal(a.h[0].attn.layout, a.h[1].attn.layout)   # each layer its own draw
    assert not torch.equal(a.h[0].attn.layout, c.h[0].attn.layout)


def test_layout_survives_state_dict_round_trip():
    src, dst = make_model(sparse_seed=0), make_model(sparse_seed=7)
    assert not torch.equal(src.h[0].attn.layout, dst.h[0].attn.layout)
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    dst.load_state_dict(torch.load(buf, weights_only=True))
    idx = torch.randint(0, 65, (2, 30))
    for a, b in zip(src.h, dst.h):
        assert torch.equal(a.attn.layout, b.attn.layout)
        assert torch.equal(a.attn.block_idx, b.attn.block_idx)       # derived lists refreshed
    assert torch.equal(src(idx)[0], dst(idx)[0])


# ---- the training path ----

@pytest.mark.parametrize("pos_encoding,n_kv_head,T", [  # T: whole blocks, a partial last block, < 1 block
    *[(p, 2, T) for p in ("rope", "alibi", "none") for T in (32, 29, 3)], ("rope", 4, 29), ("alibi", 1, 29)])
def test_sparse_path_matches_reference_forward_and_grad(pos_encoding, n_kv_head, T):
    model = make_model(pos_encoding, n_kv_head=n_kv_head)
    attn = model.h[0].attn
    x = torch.randn(2, T, 32, requires_grad=True)
    mask = naive_token_mask(attn.layout, 4, T)
    dy = torch.randn(2, T, 32)
    grads = []
    for fn in (lambda: attn(x, torch.arange(T)), lambda: reference_qkv_attention(attn, x, pos_encoding, mask)):
        y = fn()
        gx, gw = torch.autograd.grad(y, (x, attn.c_attn.weight), dy)
        grads.append((y, gx, gw))
    for got, want in zip(*grads):
        assert (got - want).abs().max().item() <= 1e-4


def test_outputs_depend_exactly_on_the_allowed_keys():
    """One layer, no positions: output i depends on input j iff the mask keeps (i, j), so
    the nonzero pattern of the Jacobian shows what the gathered path really attends to."""
    model = make_model("none", n_layer=1, sparse_random=1)
    attn = model.h[0].attn
    T = 30
    x = torch.randn(1, T, 32, requires_grad=True)
    y = attn(x, torch.arange(T))
    seen = torch.stack([torch.autograd.grad(y[0, i].sum(), x, retain_graph=True)[0][0].abs().sum(-1) > 0
                        for i in range(T)])                                  # (T queries, T inputs)
    want = naive_token_mask(attn.layout, 4, T)
    assert torch.equal(seen, want)
    assert seen.diagonal().all() and not seen.triu(1).any()
    assert want.sum() < 0.8 * T * (T + 1) / 2                                # it is sparse


@pytest.mark.parametrize("pos_encoding", ["rope", "alibi", "learned", "none"])
@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_window_over_every_block_is_causal_attention(pos_encoding, n_kv_head):
    sparse = make_model(pos_encoding, n_kv_head=n_kv_head, sparse_window=8, sparse_random=0)
    dense = GPT(GPTConfig(**tiny_model_kwargs(attention="mha" if n_kv_head == 4 else "gqa",
                                              n_kv_head=n_kv_head, pos_encoding=pos_encoding))).eval()
    missing, unexpected = dense.load_state_dict(sparse.state_dict(), strict=False)
    assert not missing and all(k.endswith("attn.layout") for k in unexpected)
    idx = torch.randint(0, 65, (2, 27))
    assert (sparse(idx)[0] - dense(idx)[0]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("pos_encoding", ["rope", "alibi"])
def test_window_of_one_block_is_per_block_causal_attention(pos_encoding):
    sparse = make_model(pos_encoding, n_kv_head=2, sparse_window=1, sparse_global=0, sparse_random=0)
    dense = GPT(GPTConfig(**tiny_model_kwargs(attention="gqa", n_kv_head=2, pos_encoding=pos_encoding))).eval()
    dense.load_state_dict(sparse.state_dict(), strict=False)
    x = torch.randn(2, 30, 32)
    with torch.no_grad():
        got = sparse.h[0].attn(x, torch.arange(30))
        want = torch.cat([dense.h[0].attn(x[:, s:s + 4], torch.arange(s, min(s + 4, 30)))
                          for s in range(0, 30, 4)], dim=1)
    assert (got - want).abs().max().item() <= 1e-5


def test_attention_dropout_trains():
    model = make_model("alibi", dropout=0.3).train()
    idx = torch.randint(0, 65, (2, 30))
    logits, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())
    with torch.no_grad():
        assert not torch.allclose(logits, model.eval()(idx)[0])


def test_naive_impl_is_the_dense_masked_path():
    model = make_model("alibi", n_kv_head=2)
    idx = torch.randint(0, 65, (2, 30))
    sparse, _ = model(idx)
    set_attn_impl(model, "naive")
    naive, _ = model(idx)
    assert (sparse - naive).abs().max().item() <= 1e-5


# ---- decoding ----

@pytest.mark.parametrize("pos_encoding", POS_ENCODINGS)
@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_cached_decoding_equals_full_forward(pos_encoding, n_kv_head):
    model = make_model(pos_encoding, n_kv_head=n_kv_head)
    idx = torch.randint(0, 65, (2, 30))
    full, _ = model(idx)
    stepped, _ = decode_in_chunks(model, idx)                  # prefill 7, then 5, then single tokens
    assert (full - stepped).abs().max().item() <= 1e-4


@pytest.mark.parametrize("pos_encoding", ["rope", "alibi", "none"])
def test_sliding_cache_equals_windowed_recompute_for_one_layer(pos_encoding):
    """Past block_size the layout is anchored at the oldest cached key, which is what a
    recompute of the last block_size tokens sees; with one layer they agree exactly."""
    model = make_model(pos_encoding, n_layer=1)
    idx = torch.randint(0, 65, (1, 10))
    with_cache = model.generate(idx, 40, temperature=0, use_cache=True)
    without = model.generate(idx, 40, temperature=0, use_cache=False)
    assert torch.equal(with_cache, without)


@pytest.mark.parametrize("pos_encoding", ["rope", "learned"])  # sliding cache / recompute past block_size
def test_generate_past_block_size(pos_encoding):
    model = make_model(pos_encoding)
    out = model.generate(torch.zeros(2, 5, dtype=torch.long), 40, temperature=1.0, top_k=10,
                         generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 45) and out.max() < 65


def test_context_longer_than_the_layout_is_refused():
    model = make_model("rope")
    with pytest.raises(ValueError, match="max_context"):
        model.generate(torch.zeros(1, 5, dtype=torch.long), 60, max_context=48)
    with pytest.raises(ValueError, match="block_size=32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_cache_size_matches_formula():
    model = make_model(n_kv_head=2)
    caches = model.init_caches(3, 17)
    assert sum(c.numel() for c in caches) == 3 * 17 * model.cache_elems_per_token()
    assert model.cache_elems_per_token() == 2 * (2 * 2 * 8)     # layers * K and V * Hkv * D


# ---- end to end and config checks ----

def test_greedy_and_seeded_sample_same_with_and_without_cache(data_root, tmp_path, capsys):
    """One short run (RoPE, the config's choice); every position encoding is covered by
    test_cached_decoding_equals_full_forward."""
    import train
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=20", "--eval_interval=20", "--attention=bigbird",
                          "--sparse_block=4", "--sparse_window=2", "--sparse_random=2",
                          "--pos_encoding=rope"))
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["model"]["h.1.attn.layout"].shape == (8, 8)
    assert_sampling_same_with_and_without_cache(out, capsys)


@pytest.mark.parametrize("kwargs,words", [
    (dict(sparse_block=6), "sparse_block=6 must be a power of two"),
    (dict(sparse_block=64), "no larger than block_size"),
    (dict(sparse_window=0), "sparse_window=0 must be at least 1"),
    (dict(sparse_global=-1), "sparse_global=-1"),
    (dict(sparse_global=9), "sparse_global=9"),
    (dict(sparse_random=-1), "sparse_random=-1"),
    (dict(sparse_random=8), "between 0 and 7"),
])
def test_config_rejects_bad_values(kwargs, words):
    with pytest.raises(ValueError, match=words) as e:
        GPTConfig(**tiny_model_kwargs(**{**SPARSE, **kwargs}))
    assert "\n" not in str(e.value)


def test_train_refuses_bad_layout_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "train.py", "config/bigbird.py", f"--out_dir={tmp_path}",
                        "--sparse_block=12"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "sparse_block=12" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "log.jsonl")
