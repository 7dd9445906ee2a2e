"""RoPE scaling (pi, ntk, yarn) and partial RoPE (rope_fraction), against independent references:
Hugging Face's rope-initialisation functions, the NTK closed form written out, a per-pair loop,
the model without positions; then the contract (cached decoding, shift invariance), the
refusals, eval.py's stretching of a trained run and train.py's fine-tune from a run folder."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import train
from attention.positional import RoPE, apply_rope
from helpers import ROOT, accepts, decode_in_chunks, reference_qkv_attention, tiny_model_kwargs, train_args
from model import GPT, GPTConfig
from test_contract import VARIANT_KWARGS
from tools import analyze
from tools import eval as length_eval

SCALINGS = [dict(rope_scaling="pi", rope_factor=4.0), dict(rope_scaling="ntk", rope_factor=4.0),
            dict(rope_scaling="yarn", rope_factor=4.0, rope_original_context=8),
            dict(rope_scaling="yarn", rope_factor=2.0, rope_fraction=0.5, rope_original_context=8)]


def hf_inv_freq(rope_type, head_dim, **params):
    """(inv_freq, attention factor) from transformers' own rope initialisation."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = transformers.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                                      max_position_embeddings=4096, rope_parameters={"rope_type": rope_type, **params})
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")


@pytest.mark.parametrize("head_dim,base,factor,fraction", [(16, 10000.0, 4.0, 1.0), (64, 500000.0, 8.0, 1.0),
                                                          (32, 10000.0, 2.0, 0.5)])
def test_pi_equals_hugging_face_linear(head_dim, base, factor, fraction):
    want, scale = hf_inv_freq("linear", head_dim, rope_theta=base, factor=factor, partial_rotary_factor=fraction)
    rope = RoPE(base, "pi", factor, fraction=fraction)
    assert torch.allclose(rope.inv_freq(head_dim).float(), want, rtol=1e-6, atol=0)
    assert rope.attention_factor() == scale == 1.0


@pytest.mark.parametrize("head_dim,base,factor,context,betas,fraction", [
    (16, 10000.0, 4.0, 64, (32.0, 1.0), 1.0), (64, 10000.0, 16.0, 2048, (32.0, 1.0), 1.0),
    (128, 500000.0, 8.0, 8192, (64.0, 2.0), 1.0), (32, 10000.0, 4.0, 256, (16.0, 1.0), 0.5),
    (16, 100.0, 2.0, 32, (32.0, 1.0), 1.0)])
def test_yarn_equals_hugging_face(head_dim, base, factor, context, betas, fraction):
    want, scale = hf_inv_freq("yarn", head_dim, rope_theta=base, factor=factor,
                              original_max_position_embeddings=context, beta_fast=betas[0], beta_slow=betas[1],
                              partial_rotary_factor=fraction)
    rope = RoPE(base, "yarn", factor, context, *betas, fraction=fraction)
    assert torch.allclose(rope.inv_freq(head_dim).float(), want, rtol=1e-6, atol=0)
    assert rope.attention_factor() == pytest.approx(scale, rel=1e-12)
    assert 1 < scale < 1.3


@pytest.mark.parametrize("head_dim,factor", [(16, 4.0), (64, 8.0), (8, 2.0)])
def test_ntk_equals_its_closed_form(head_dim, factor):
    """theta_i = (base * s^(d/(d-2)))^(-2i/d): the highest frequency kept, the lowest divided by s."""
    base = 10000.0
    new_base = base * factor ** (head_dim / (head_dim - 2))
    want = [new_base ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    got = RoPE(base, "ntk", factor).inv_freq(head_dim).tolist()
    assert got == pytest.approx(want, rel=1e-12)
    plain = [base ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    assert got[0] == 1.0 and got[-1] == pytest.approx(plain[-1] / factor, rel=1e-12)


def test_no_scaling_is_bit_identical_to_plain_rope():
    """The rotation before scaling existed: fp64 angles m * base^(-2i/d), cos/sin to fp32."""
    x = torch.randn(2, 3, 40, 16)
    pos = torch.arange(100, 140)
    angles = pos.double()[:, None] * 500.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)[None, :]
    want = apply_rope(x, angles.cos().float(), angles.sin().float())
    got, = RoPE(500.0)(pos, x)
    assert torch.equal(got, want)


def test_partial_scaled_rotation_against_a_per_pair_loop():
    rope = RoPE(10000.0, "yarn", 4.0, 16, fraction=0.5)
    x = torch.randn(1, 2, 5, 12, dtype=torch.float64)
    pos = torch.tensor([0, 3, 17, 64, 1000])
    got, = rope(pos, x.float())
    theta, a = rope.inv_freq(12).tolist(), rope.attention_factor()
    want = x.clone()
    for t, m in enumerate(pos.tolist()):
        for i in range(3):  # int(0.5 * 12) = 6 dims = 3 pairs turn, the other 6 pass through
            c, s = a * math.cos(m * theta[i]), a * math.sin(m * theta[i])
            e, o = x[..., t, 2 * i], x[..., t, 2 * i + 1]
            want[..., t, 2 * i], want[..., t, 2 * i + 1] = e * c - o * s, e * s + o * c
    assert torch.allclose(got.double(), want, atol=1e-5)


@pytest.mark.parametrize("scaling", [SCALINGS[2], SCALINGS[3]], ids=["yarn", "yarn-half"])
def test_mha_layer_with_yarn_equals_reference_on_hugging_face_frequencies(scaling):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**tiny_model_kwargs(**scaling))).eval()
    attn = model.h[0].attn
    with torch.no_grad():
        attn.c_attn.weight.normal_(0, 0.5)  # scores of order 1, so a wrong angle or factor shows
    want_freq, factor = hf_inv_freq("yarn", 8, rope_theta=10000.0, factor=scaling["rope_factor"],
                                    original_max_position_embeddings=8,
                                    partial_rotary_factor=scaling.get("rope_fraction", 1.0))
    x = torch.randn(2, 20, 32)
    with torch.no_grad():
        got = attn(x, torch.arange(20))
        want = reference_qkv_attention(attn, x, "rope", rope=(want_freq, factor))
    assert torch.allclose(got, want, atol=1e-5)


# every variant that takes rope (MLA on its decoupled key; linear and efficient refuse it)
ROPE_VARIANTS = [a for a in VARIANT_KWARGS if accepts(attention=a, pos_encoding="rope", **VARIANT_KWARGS[a])]


@pytest.mark.parametrize("scaling", SCALINGS, ids=["pi", "ntk", "yarn", "yarn-half"])
@pytest.mark.parametrize("attention", ROPE_VARIANTS)
def test_cached_decoding_with_a_scaling_equals_full_forward(attention, scaling):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**tiny_model_kwargs(attention=attention, **VARIANT_KWARGS[attention], **scaling))).eval()
    idx = torch.randint(0, 65, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full, _ = model(idx)
        stepped, _ = decode_in_chunks(model, idx)
    assert (full - stepped).abs().max().item() <= 1e-4


@pytest.mark.parametrize("scaling", SCALINGS, ids=["pi", "ntk", "yarn", "yarn-half"])
def test_shift_invariance_holds_with_a_scaling(scaling):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**tiny_model_kwargs(**scaling))).eval()
    tokens = np.random.default_rng(0).integers(0, 65, 2000).astype(np.uint16)
    change, _ = analyze.shift_invariance(model, tokens, np.arange(0, 400, 50), 32)
    assert change <= 1e-5


@pytest.mark.parametrize("attention", ["mha", "gqa", "bigbird", "gla"])
def test_rope_fraction_zero_equals_no_positions(attention):
    torch.manual_seed(0)
    kw = tiny_model_kwargs(attention=attention, **VARIANT_KWARGS[attention])
    zero = GPT(GPTConfig(**kw, rope_fraction=0.0)).eval()
    none = GPT(GPTConfig(**{**kw, "pos_encoding": "none"})).eval()
    none.load_state_dict(zero.state_dict())
    idx = torch.randint(0, 65, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(zero(idx)[0], none(idx)[0])


@pytest.mark.parametrize("bad,words", [
    (dict(rope_scaling="dynamic"), "unknown rope_scaling"),
    (dict(rope_scaling="yarn", rope_factor=0.5), "rope_factor=0.5 must be >= 1"),
    (dict(rope_factor=2.0), "needs rope_scaling"),
    (dict(rope_scaling="yarn", rope_factor=2.0, rope_beta_fast=1.0, rope_beta_slow=2.0), "rope_beta_fast"),
    (dict(rope_fraction=1.5), "must be in [0, 1]"),
    (dict(rope_scaling="pi", rope_factor=2.0, rope_beta_fast=16.0), "are yarn's"),
    (dict(rope_fraction=0.3), "odd number"),
    (dict(rope_base=0.0), "rope_base"),
    (dict(rope_base=float("nan")), "rope_base"),
    (dict(pos_encoding="alibi", rope_scaling="pi"), "needs pos_encoding=rope"),
])
def test_bad_rope_settings_are_refused_in_one_line(bad, words):
    kw = tiny_model_kwargs(**bad)
    if bad.get("rope_fraction") == 0.3:
        kw["n_head"] = 8                 # head dim 4: int(0.3 * 4) = 1 dim
    with pytest.raises(ValueError) as e:
        GPTConfig(**kw)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_train_refuses_a_bad_scaling_with_exit_2(data_root, tmp_path):
    r = subprocess.run([sys.executable, "train.py", *train_args(data_root, tmp_path / "o", "--rope_scaling=yarn",
                                                                 "--rope_factor=0.5")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "rope_factor" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def rope_run(data_root, tmp_path_factory):
    """A tiny RoPE run at block_size 32, and its fine-tune at 64 with yarn (learning rate 0, so the
    weights must come through unchanged)."""
    root = tmp_path_factory.mktemp("rope")
    train.main(train_args(data_root, root / "src", "--max_iters=10", "--eval_interval=10"))
    train.main(train_args(data_root, root / "ft", f"--init_from={root / 'src'}", "--block_size=64",
                          "--rope_scaling=yarn", "--rope_factor=2", "--max_iters=2", "--eval_interval=2",
                          "--learning_rate=0", "--min_lr=0", "--warmup_iters=0"))
    return root


def test_eval_stretches_a_trained_run_per_scaling(rope_run, data_root, tmp_path):
    out = tmp_path / "eval.json"
    length_eval.main([str(rope_run / "src"), "--lengths=32,128", "--rope_scaling=none,yarn", "--rope_factor=4",
                      "--json", str(out), "--plot", str(tmp_path / "e.png"), "--ckpt=last", "--max_tokens=3000",
                      f"--data_dir={data_root}"])
    rows = json.loads(out.read_text())
    assert [(r["rope_scaling"], r["rope_factor"], r["length"]) for r in rows] == [
        ("none", 1.0, 32), ("none", 1.0, 128), ("yarn", 4.0, 32), ("yarn", 4.0, 128)]
    ckpt = torch.load(rope_run / "src" / "ckpt.pt", map_location="cpu", weights_only=True)
    tokens = np.fromfile(os.path.join(data_root, "shakespeare_char", "val.bin"), dtype=np.uint16)[:3000]
    for row in rows:
        model = GPT(GPTConfig(**{**ckpt["model_args"], "rope_scaling": row["rope_scaling"],
                                 "rope_factor": row["rope_factor"]}))
        model.load_state_dict(ckpt["model"])
        n = (len(tokens) - 1) // row["length"] * row["length"]
        x = torch.from_numpy(tokens[:n + 1].astype(np.int64))
        with torch.no_grad():
            logits, _ = model.eval()(x[:-1].view(-1, row["length"]))
        want = torch.nn.functional.cross_entropy(logits.double().flatten(0, 1), x[1:]).item()
        assert row["val_loss"] == pytest.approx(want, abs=1e-5)
    assert rows[2]["val_loss"] != rows[0]["val_loss"]


def test_finetune_from_a_run_folder_keeps_the_weights_and_stretches_rope(rope_run):
    src = torch.load(rope_run / "src" / "ckpt.pt", map_location="cpu", weights_only=True)
    ft = torch.load(rope_run / "ft" / "ckpt.pt", map_location="cpu", weights_only=True)
    args = ft["model_args"]
    assert (args["block_size"], args["rope_scaling"], args["rope_factor"], args["rope_original_context"]) == \
        (64, "yarn", 2.0, 32)
    assert ft["iter_num"] == 2 and json.loads((rope_run / "ft" / "summary.json").read_text())["finished"]
    assert src["model"].keys() == ft["model"].keys()
    assert all(torch.equal(src["model"][k], ft["model"][k]) for k in src["model"])


@pytest.mark.parametrize("extra,words", [(["--n_layer=3"], "may change only"),
                                         (["--block_size=64", "--pos_encoding=none"], "may change only")])
def test_finetune_refuses_other_model_changes(rope_run, data_root, tmp_path, extra, words):
    r = subprocess.run([sys.executable, "train.py", *train_args(data_root, tmp_path / "o",
                                                                 f"--init_from={rope_run / 'src'}", *extra)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr


@pytest.mark.parametrize("head_dim,context", [(32, 64), (32, 256), (16, 128)])
def test_base_lower_bound_is_the_first_base_keeping_every_distance_nonnegative(head_dim, context):
    """Men et al.'s condition written out: B(m) = sum_i cos(m base^(-2i/d)) >= 0 for m = 0..L."""
    def holds(base):
        return all(sum(math.cos(m * base ** (-2 * i / head_dim)) for i in range(head_dim // 2)) >= 0
                   for m in range(context + 1))
    bound = analyze.rope_base_lower_bound(head_dim, context, per_decade=50)
    assert holds(bound) and not holds(bound / 10 ** (1 / 50))
    assert analyze.rope_base_lower_bound(head_dim, 4 * context, per_decade=50) > bound


@pytest.mark.parametrize("source,words", [(["--pos_encoding=learned"], "learned positions for 32 tokens only"),
                                          (["--attention=bigbird", "--sparse_block=8", "--sparse_window=2"],
                                           "pattern is drawn for block_size=32")])
def test_finetune_refuses_a_longer_context_the_source_cannot_take(data_root, tmp_path, source, words):
    train.main(train_args(data_root, tmp_path / "src", "--max_iters=2", "--eval_interval=2", *source))
    r = subprocess.run([sys.executable, "train.py", *train_args(data_root, tmp_path / "o", *source,
                                                                 f"--init_from={tmp_path / 'src'}", "--block_size=64")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and words in r.stderr, r.stderr
