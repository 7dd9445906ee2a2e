"""Per-layer attention plans (attention="swa,swa,swa,mha"): each layer built from its own variant,
cached decoding equal to the full forward, cache bytes the per-layer sum of formulas written here,
a checkpoint round trip, sample.py the same with and without its cache, and one-line refusals."""
import pytest
import torch

import train
from helpers import POS_ENCODINGS, accepts, decode_in_chunks, perturbed_model, tiny_model_kwargs, train_args
from helpers import assert_sampling_same_with_and_without_cache as assert_same_samples
from model import GPT, GPTConfig

PLANS = {"swa,mha": dict(sliding_window=8), "gla,mha": dict(gla_chunk=8),
         "moba,bigbird": dict(sparse_block=4, moba_topk=1, sparse_window=2), "mla,gqa": dict(n_kv_head=2)}


def make(plan, pos_encoding="rope"):
    return perturbed_model(attention=plan, pos_encoding=pos_encoding, **PLANS[plan])


@pytest.mark.parametrize("plan,pos", [(a, p) for a in PLANS for p in POS_ENCODINGS
                                      if accepts(attention=a, pos_encoding=p, **PLANS[a])])
def test_cached_decoding_equals_the_full_forward(plan, pos):
    model = make(plan, pos)
    assert [type(b.attn).__name__ for b in model.h] == [
        {"swa": "SlidingWindowAttention", "mha": "MultiHeadAttention", "gqa": "MultiHeadAttention",
         "gla": "GatedLinearAttention", "moba": "MixtureOfBlockAttention", "bigbird": "BlockSparseAttention",
         "mla": "MultiHeadLatentAttention"}[a] for a in plan.split(",")]
    idx = torch.randint(0, 65, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(idx)
        stepped, _ = decode_in_chunks(model, idx)
    assert (full - stepped).abs().max().item() <= 1e-4


def test_each_layer_fills_its_own_defaults():
    model = GPT(GPTConfig(**tiny_model_kwargs(attention="mqa,mha")))
    assert [b.attn.n_kv_head for b in model.h] == [1, 4]


def test_cache_bytes_are_the_per_layer_sum():
    """swa: 2 x Hkv x D per token up to its 8-token window; mha: 2 x H x D per token; gla: a
    (Hkv, D, D) fp32 state and nothing per token. Tiny models: H = Hkv = 4, D = 8, bf16."""
    swa_mha, gla_mha = make("swa,mha"), make("gla,mha")
    for n in (4, 8, 24):
        assert sum(c.nbytes() for c in swa_mha.init_caches(1, n, dtype=torch.bfloat16)) == \
            2 * 4 * 8 * 2 * (min(n, 8) + n)
        assert sum(c.nbytes() for c in gla_mha.init_caches(1, n, dtype=torch.bfloat16)) == \
            2 * 4 * 8 * 2 * n + 4 * 8 * 8 * 4
    assert swa_mha.cache_elems_per_seq(24) == 2 * 4 * 8 * (8 + 24)


@pytest.mark.parametrize("kw,label", [
    (dict(attention="gla", pos_encoding="none"), "constant state of 512 elements"),   # 2 layers x (4, 8, 8)
    (dict(), "kv cache of 128 elements/token"),                                        # 2 layers x 2 x 4 x 8
    (dict(attention="swa", sliding_window=8), "kv cache of 128 elements/token up to 8 tokens"),
    (dict(attention="swa,mha", sliding_window=8), "kv cache of 128 elements/token"),   # the mha layer grows
    (dict(attention="gla,mha", pos_encoding="none"), "kv cache of 64 elements/token + constant state of 256 elements"),
])
def test_sample_labels_decoding_by_what_the_model_keeps(kw, label):
    """sample.py called GLA's constant state a "kv cache": the label now says what is kept."""
    import sample
    assert sample.cache_label(GPT(GPTConfig(**tiny_model_kwargs(**kw)))) == label


def test_a_checkpoint_round_trip_rebuilds_the_plan():
    model = make("moba,bigbird")
    again = GPT(GPTConfig.from_dict(model.config.to_dict())).eval()
    again.load_state_dict(model.state_dict())
    idx = torch.randint(0, 65, (1, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(model(idx)[0], again(idx)[0])


def test_a_trained_hybrid_samples_the_same_with_and_without_cache(data_root, tmp_path, capsys):
    """sample.py on a gla,mha checkpoint: a state for one layer, a K/V cache for the other."""
    out = tmp_path / "run"
    train.main(train_args(data_root, out, "--max_iters=60", "--eval_interval=60", "--attention=gla,mha",
                          "--gla_chunk=8"))
    assert_same_samples(out, capsys)


@pytest.mark.parametrize("kw,words", [
    (dict(attention="swa,mha,mha"), "plans 3 layers but n_layer=2"),
    (dict(attention="swa,lstm"), "unknown attention='lstm' in the plan"),
    (dict(attention="gla,mha", pos_encoding="alibi"), "its gla layers: attention=gla works with"),
    (dict(attention="mha,gqa", sliding_window=4), "sliding_window=4 is set but no variant of attention=mha,gqa"),
])
def test_bad_plans_are_one_line(kw, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        GPTConfig(**tiny_model_kwargs(**kw))
