"""The contract every registered variant keeps, whatever its attention: for each variant in
attention.VARIANTS and each position encoding it accepts, cached decoding equals the full
forward, and the cache measured from its tensors grows by exactly the formula per token.
A new variant is covered as soon as it is registered (and must be listed here)."""
import pytest
import torch

from attention import VARIANTS
from helpers import POS_ENCODINGS, accepts, decode_in_chunks, perturbed_model, tiny_model_kwargs
from model import GPT, GPTConfig

VARIANT_KWARGS = {"mha": {}, "gqa": dict(n_kv_head=2), "mqa": {}, "mla": {},
                  "bigbird": dict(sparse_block=4, sparse_window=2), "gla": dict(gla_chunk=8),
                  "linear": dict(gla_chunk=8), "retnet": dict(gla_chunk=8), "efficient": dict(gla_chunk=8),
                  "swa": dict(sliding_window=8), "moba": dict(sparse_block=4, moba_topk=2),
                  "deltanet": dict(delta_chunk=8), "gated_deltanet": dict(delta_chunk=8), "conv": {},
                  "fox": {}, "nsa": dict(sparse_block=4, nsa_topk=4, sliding_window=8)}


CASES = [(a, p) for a in VARIANT_KWARGS for p in POS_ENCODINGS
         if accepts(attention=a, pos_encoding=p, **VARIANT_KWARGS[a])]


def a_position(attention):
    """rope, else the first position encoding the variant takes (linear and efficient refuse rope)."""
    return next(p for p in POS_ENCODINGS if accepts(attention=attention, pos_encoding=p, **VARIANT_KWARGS[attention]))


def make_model(attention, pos_encoding):
    return perturbed_model(attention=attention, pos_encoding=pos_encoding, **VARIANT_KWARGS[attention])


def test_every_registered_variant_is_checked():
    assert set(VARIANTS) == set(VARIANT_KWARGS)
    assert len(CASES) >= 36  # gla refuses alibi and learned, swa learned; the others take all five


@pytest.mark.parametrize("attention,pos_encoding", CASES)
def test_cached_decoding_equals_full_forward(attention, pos_encoding):
    model = make_model(attention, pos_encoding)
    idx = torch.randint(0, 65, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(idx)
        stepped, caches = decode_in_chunks(model, idx)
    assert (full - stepped).abs().max().item() <= 1e-4
    assert all(c.pos == 30 for c in caches)


# a state, not a K/V cache, and no attn_output_gate (their own output gate; conv: no attention output)
CONSTANT_STATE = ("gla", "linear", "retnet", "efficient", "deltanet", "gated_deltanet", "conv")
GATED_CASES = [(a, p) for a, p in CASES if a not in CONSTANT_STATE]


@pytest.mark.parametrize("attention,pos_encoding", GATED_CASES)
def test_cached_decoding_with_the_output_gate_equals_full_forward(attention, pos_encoding):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**tiny_model_kwargs(attention=attention, pos_encoding=pos_encoding,
                                              attn_output_gate="sigmoid", **VARIANT_KWARGS[attention]))).eval()
    idx = torch.randint(0, 65, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(idx)
        stepped, _ = decode_in_chunks(model, idx)
    assert (full - stepped).abs().max().item() <= 1e-4


@pytest.mark.parametrize("attention", VARIANT_KWARGS)
def test_measured_cache_growth_equals_formula(attention):
    """Bytes of the allocated caches for n tokens = per-token formula x min(n, the most tokens the
    cache keeps) + the constant state: a cache that grows grows by the formula, a window's ring
    stops at its window (swa: 8 tokens here), a recurrent state does not grow; nsa adds one compressed
    K/V (the size of a token's) per complete block of 4."""
    model = make_model(attention, a_position(attention))
    cap = {"swa": 8}.get(attention)  # written here, not read from the model: the test must be able to fail
    blocks = (lambda n: n // 4) if attention == "nsa" else (lambda n: 0)
    per_token = model.cache_elems_per_token() * 2                      # bf16
    state = model.cache_state_elems() * 4                              # fp32 states (GLA), else 0
    for n in (4, 8, 24):
        measured = sum(c.nbytes() for c in model.init_caches(1, n, dtype=torch.bfloat16))
        assert measured == per_token * (min(n, cap or n) + blocks(n)) + state
        assert model.cache_elems_per_seq(n) * 2 + state == measured
    if attention in CONSTANT_STATE:  # a constant state, nothing per token
        assert per_token == 0 and state > 0
    else:
        assert per_token > 0


ONE_HEAD = [a for a in VARIANT_KWARGS if accepts(attention=a, pos_encoding="none", n_head=1,
                                                 **{**VARIANT_KWARGS[a], "n_kv_head": 0})]


def test_one_head_models_are_built_by_every_variant_but_gqa():
    """The recall anchor's shape (Zoology's: one head): every variant takes n_head=1 except gqa, which
    needs fewer KV heads than query heads."""
    assert set(VARIANT_KWARGS) - set(ONE_HEAD) == {"gqa"}


@pytest.mark.parametrize("attention", ONE_HEAD)
def test_one_head_decoding_equals_full_forward(attention):
    model = perturbed_model(attention=attention, pos_encoding="none", n_head=1,
                            **{**VARIANT_KWARGS[attention], "n_kv_head": 0})
    idx = torch.randint(0, 65, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(idx)
        stepped, _ = decode_in_chunks(model, idx)
    assert (full - stepped).abs().max().item() <= 1e-4
