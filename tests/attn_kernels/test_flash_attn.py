"""Tests of the Triton FlashAttention-2 kernel against the independent fp32 reference.

On CPU the kernels run under the Triton interpreter (fp32, tiny shapes: the whole file stays
well under the 4-minute CI budget on 2 cores). On CUDA the same tests run natively, plus
bf16/fp16 tests whose error must stay within 2x that of torch's SDPA in the same precision.
"""
import os

import torch

if not torch.cuda.is_available():  # must precede the first import of triton / attn_kernels.flash_attn
    os.environ.setdefault("TRITON_INTERPRET", "1")

import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton.runtime.errors import OutOfResources  # noqa: E402

import attn_kernels.flash_attn as fa  # noqa: E402
from attn_kernels.env import available, interpreted  # noqa: E402
from attn_kernels.flash_attn import flash_attention  # noqa: E402
from attn_kernels.reference import attention_reference  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEVICE = "cuda" if available("cuda") else "cpu"
cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA (compiled Triton)")


def _inputs(B, H, Hkv, Tq, Tk, d, dv, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, H, Tq, d), (B, Hkv, Tk, d), (B, Hkv, Tk, dv), (B, H, Tq, dv)]
    q, k, v, do = (torch.randn(s, generator=g).to(DEVICE, dtype) for s in shapes)
    return q, k, v, do


def _run(fn, q, k, v, do, **kw):
    """Output, lse and gradients of fn on fresh leaves."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o, lse = fn(q, k, v, return_lse=True, **kw)
    o.backward(do)
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def _assert_close_to_reference(q, k, v, do, tol_o=1e-4, tol_g=1e-3, **kw):
    ours = _run(flash_attention, q, k, v, do, **kw)
    ref = _run(attention_reference, q, k, v, do, **kw)
    names = ("o", "lse", "dq", "dk", "dv")
    for name, a, b, tol in zip(names, ours, ref, (tol_o, tol_o, tol_g, tol_g, tol_g)):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        if name == "lse":  # rows without a visible key: -inf in both
            assert torch.equal(torch.isinf(a), torch.isinf(b)), name
            a, b = a[torch.isfinite(b)], b[torch.isfinite(b)]
        err = (a.float() - b.float()).abs().max().item() if a.numel() else 0.0
        assert err <= tol, f"{name}: max abs err {err:.3g} > {tol}"


# (B, H, Hkv, Tq, Tk, d, dv, causal, alibi): axes combined rather than crossed. Interpreter block
# sizes are 32/16, so these lengths give full tiles, partial tiles and several loop steps.
CASES = [
    (1, 2, 2, 40, 40, 16, 16, True, False),     # MHA, d=16
    (2, 2, 2, 37, 37, 64, 64, False, False),    # non-causal, T not a multiple of the block
    (1, 4, 2, 29, 53, 64, 64, True, True),      # GQA, Tq < Tk, ALiBi
    (1, 4, 1, 70, 30, 96, 96, True, False),     # MQA, Tq > Tk: rows with no visible key, d=96
    (1, 2, 1, 45, 20, 128, 128, False, True),   # MQA non-causal Tq > Tk, ALiBi, d=128
    (2, 6, 3, 50, 50, 64, 32, True, True),      # GQA group 2 with H=6, dv < dqk
    (1, 2, 2, 33, 47, 96, 128, False, False),   # dv > dqk
    (1, 2, 1, 1, 50, 64, 64, True, True),       # a single query (decode-like)
    (1, 2, 2, 24, 24, 192, 160, True, False),   # d=192 (padded to 256), dv=160
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}H{}kv{}Tq{}Tk{}d{}dv{}{}{}".format(
    *c[:7], "-causal" if c[7] else "", "-alibi" if c[8] else ""))
def test_fp32_matches_reference(case):
    B, H, Hkv, Tq, Tk, d, dv, causal, alibi = case
    q, k, v, do = _inputs(B, H, Hkv, Tq, Tk, d, dv)
    slopes = torch.linspace(0.05, 0.6, H, device=DEVICE) if alibi else None
    _assert_close_to_reference(q, k, v, do, causal=causal, alibi_slopes=slopes)


def test_softmax_scale():
    q, k, v, do = _inputs(1, 2, 2, 35, 35, 32, 32)
    _assert_close_to_reference(q, k, v, do, causal=True, softmax_scale=0.37)


def test_strided_inputs():
    # (B, T, H, D) storage viewed as (B, H, T, D), as the model produces them; dO non-contiguous too
    q, k, v, do = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in _inputs(2, 4, 2, 30, 30, 32, 32))
    assert not q.is_contiguous()
    _assert_close_to_reference(q, k, v, do, causal=True)


FORGET_CASES = [  # (B, H, Hkv, Tq, Tk, d, alibi, window): FoX's bias c_q[i] - c_k[j] from per-token vectors
    (1, 2, 2, 40, 40, 16, False, None),   # MHA, several tiles each way
    (2, 4, 2, 29, 53, 32, True, None),    # GQA (dc_k per query head of a group), Tq < Tk, with ALiBi
    (1, 2, 1, 1, 50, 32, False, None),    # one query against a cache (decoding)
    (1, 2, 2, 45, 45, 32, False, 20),     # a sliding window
]


@pytest.mark.parametrize("case", FORGET_CASES, ids=lambda c: "B{}H{}kv{}Tq{}Tk{}d{}".format(*c[:6])
                         + ("-alibi" if c[6] else "") + (f"-w{c[7]}" if c[7] else ""))
def test_the_forget_bias_matches_reference_with_its_gradients(case):
    B, H, Hkv, Tq, Tk, d, alibi, window = case
    q, k, v, do = _inputs(B, H, Hkv, Tq, Tk, d, d)
    g = torch.Generator().manual_seed(3)   # cumulative log gates: decreasing, as FoX's are
    c = torch.nn.functional.logsigmoid(torch.randn(B, H, Tk, generator=g) + 1).cumsum(-1).to(DEVICE)
    slopes = torch.linspace(0.05, 0.6, H, device=DEVICE) if alibi else None
    results = []
    for fn in (flash_attention, attention_reference):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, c[..., -Tq:], c)]
        o = fn(*leaves[:3], causal=True, alibi_slopes=slopes, window=window, forget=tuple(leaves[3:]))
        o.backward(do)
        results.append([o.detach(), *(t.grad for t in leaves)])
    for name, a, b in zip(("o", "dq", "dk", "dv", "dc_q", "dc_k"), *results):
        err = (a - b).abs().max().item()
        assert err <= (1e-4 if name == "o" else 1e-3), f"{name}: max abs err {err:.3g}"
    # a row's constant c_q[i] cancels in its softmax (dc_q = 0 to rounding); c_k's gradient is not zero
    assert results[0][5].abs().max() > 1e-3


LAYOUT_CASES = [  # (B, H, Hkv, Tq, Tk, causal, alibi, per_head_layout, block_size)
    (1, 2, 2, 60, 60, True, False, False, 16),
    (1, 4, 2, 40, 70, False, True, True, 16),   # per-head layout, GQA, Tq < Tk
    (1, 2, 1, 64, 40, True, True, True, 32),    # Tq > Tk, MQA, block 32
]


@pytest.mark.parametrize("case", LAYOUT_CASES)
def test_block_layout_matches_reference(case):
    B, H, Hkv, Tq, Tk, causal, alibi, per_head, bs = case
    q, k, v, do = _inputs(B, H, Hkv, Tq, Tk, 32, 32, seed=1)
    nq, nk = -(-Tq // bs), -(-Tk // bs)
    g = torch.Generator().manual_seed(2)
    layout = torch.rand((H if per_head else 1, nq + 1, nk + 2), generator=g) < 0.5  # larger: cropped
    layout[..., 0, 0] = False  # at least one query block with an empty row of blocks
    layout[..., 0, 1:] = False
    layout = layout if per_head else layout[0]
    slopes = torch.linspace(0.1, 0.5, H, device=DEVICE) if alibi else None
    _assert_close_to_reference(q, k, v, do, causal=causal, alibi_slopes=slopes, block_layout=layout,
                               block_size=bs)


WINDOW_CASES = [  # (B, H, Hkv, Tq, Tk, window, alibi): windows below, across and above the tile sizes
    (1, 2, 2, 70, 70, 5, False),
    (2, 2, 2, 64, 64, 1, True),     # each query sees only itself
    (1, 4, 2, 29, 53, 20, True),    # GQA, Tq < Tk (bottom-right aligned), ALiBi
    (1, 2, 2, 45, 45, 33, False),   # a window longer than a tile
    (1, 2, 1, 1, 50, 16, False),    # one query (decode-like), MQA
    (1, 2, 2, 40, 40, 100, False),  # a window longer than the sequence: plain causal
]


@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: "B{}H{}kv{}Tq{}Tk{}w{}{}".format(
    *c[:6], "-alibi" if c[6] else ""))
def test_sliding_window_matches_reference(case):
    B, H, Hkv, Tq, Tk, window, alibi = case
    q, k, v, do = _inputs(B, H, Hkv, Tq, Tk, 32, 32, seed=3)
    slopes = torch.linspace(0.05, 0.6, H, device=DEVICE) if alibi else None
    _assert_close_to_reference(q, k, v, do, causal=True, alibi_slopes=slopes, window=window)


def test_window_reference_is_the_band_mask():
    """The reference's window, against scores masked by an explicit double loop over (i, j)."""
    q, k, v, _ = _inputs(1, 1, 1, 9, 12, 8, 8, seed=4)
    W, diag = 3, 12 - 9
    scores = (q[0, 0] @ k[0, 0].T) / 8 ** 0.5
    for i in range(9):
        for j in range(12):
            if not i + diag - W < j <= i + diag:
                scores[i, j] = float("-inf")
    expected = scores.softmax(-1) @ v[0, 0]
    got = attention_reference(q, k, v, causal=True, window=W)[0, 0]
    assert (got - expected).abs().max().item() <= 1e-6


def test_window_needs_causal_and_no_layout():
    q, k, v, _ = _inputs(1, 2, 2, 16, 16, 16, 16)
    for kw in (dict(causal=False, window=4), dict(window=0),
               dict(window=4, block_layout=torch.ones(1, 1, dtype=torch.bool), block_size=16)):
        with pytest.raises(ValueError, match="window"):
            flash_attention(q, k, v, **kw)


def test_dense_layout_equals_dense():
    q, k, v, do = _inputs(1, 2, 2, 40, 40, 32, 32)
    dense = flash_attention(q, k, v, causal=True)
    full = flash_attention(q, k, v, causal=True, block_layout=torch.ones(3, 3, dtype=torch.int32),
                           block_size=16)
    assert (dense - full).abs().max().item() <= 1e-5


def test_fp16_close_to_reference():
    q, k, v, do = _inputs(1, 2, 1, 40, 40, 64, 64, dtype=torch.float16)
    # fp32 reference on the same fp16 inputs; fp16 rounding of o and the gradients dominates
    _assert_close_to_reference(q, k, v, do, tol_o=3e-3, tol_g=2e-2, causal=True)


def test_backward_is_deterministic():
    q, k, v, do = _inputs(1, 4, 2, 45, 45, 32, 32)
    first, second = _run(flash_attention, q, k, v, do), _run(flash_attention, q, k, v, do)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_rejects_bad_inputs():
    q, k, v, _ = _inputs(1, 3, 2, 8, 8, 16, 16)
    with pytest.raises(ValueError):
        flash_attention(q, k, v)  # 3 query heads, 2 KV heads
    q, k, v, _ = _inputs(1, 2, 2, 40, 40, 16, 16)
    with pytest.raises(ValueError):
        flash_attention(q, k, v, block_layout=torch.ones(2, 2), block_size=16)  # needs 3x3


def test_config_picker_takes_the_fastest_that_fits():
    """_launch's tuning: configs that overflow shared memory are skipped, the fastest wins;
    untimed, the first that fits."""
    seconds = {"a": 3.0, "b": 1.0, "c": 2.0}
    ran = []

    def run(cfg):
        ran.append(cfg)
        if cfg == "big":
            raise OutOfResources(300_000, 232_448, "shared memory")

    def timer(fn):
        fn()
        return seconds[ran[-1]]
    assert fa._pick_config(["big", "a", "b", "c"], run, timer) == "b"
    assert fa._pick_config(["big", "c", "a"], run, None) == "c"
    with pytest.raises(OutOfResources):
        fa._pick_config(["big"], run, timer)


def test_tuned_launch_matches_reference(monkeypatch):
    """The timing path of _launch (taken on GPUs) with three tile configs: every one is run,
    one is kept, and the results are those of a correct launch."""
    tiles = [(16, 16, 4, 1), (32, 32, 4, 1), (16, 32, 4, 1)]
    monkeypatch.setattr(fa, "_candidates", lambda *_: (tiles, []))
    monkeypatch.setattr(fa, "_CHOSEN", {})
    timed = []
    monkeypatch.setattr(fa, "_median_time", lambda fn, device: (fn(), timed.append(1), len(timed) % 3)[-1])
    q, k, v, do = _inputs(1, 2, 1, 40, 40, 16, 16)
    _assert_close_to_reference(q, k, v, do, tol_o=1e-4, tol_g=1e-3, causal=True)
    assert len(timed) == 9  # 3 configs x (forward, dK/dV, dQ)
    assert list(fa._CHOSEN.values()) == [tiles[2]] * 3  # the third of each kernel timed 0 (len % 3)


@pytest.mark.skipif(DEVICE == "cuda", reason="checks the CPU path without the interpreter")
def test_cpu_without_interpreter_says_what_to_do():
    code = ("import torch; from attn_kernels.flash_attn import flash_attention\n"
            "x = torch.randn(1, 1, 4, 16)\n"
            "try:\n    flash_attention(x, x, x)\nexcept RuntimeError as e:\n    print(e)\n")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert "TRITON_INTERPRET=1" in out.stdout and "sdpa" in out.stdout, out.stdout + out.stderr
    assert interpreted()


# ----------------------------------------------------------------------------- CUDA, low precision

def _sdpa(q, k, v, causal=True, alibi_slopes=None, return_lse=False, window=None):
    """torch SDPA in the inputs' precision, same conventions (repeated KV heads, explicit bias)."""
    H, Tq, Tk = q.shape[1], q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // v.shape[1], 1)
    if alibi_slopes is None and window is None and (not causal or Tq == Tk):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    else:
        rel = (torch.arange(Tk, device=q.device)[None, :] - torch.arange(Tq, device=q.device)[:, None]
               - (Tk - Tq)).float()
        bias = torch.zeros(H, Tq, Tk, device=q.device)
        if alibi_slopes is not None:
            bias = bias + alibi_slopes.view(H, 1, 1) * rel
        if causal:
            bias = bias.masked_fill(rel > 0, float("-inf"))
        if window is not None:
            bias = bias.masked_fill(rel <= -window, float("-inf"))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None].to(q.dtype))
    return o, torch.zeros(())


def _assert_within_2x_of_sdpa(ours, base, ref, label=""):
    """Each of o, dq, dk, dv off the fp32 reference by at most twice SDPA's error (plus 1e-5)."""
    for name, i in (("o", 0), ("dq", 2), ("dk", 3), ("dv", 4)):
        err = (ours[i].float() - ref[i]).abs().max().item()
        err_sdpa = (base[i].float() - ref[i]).abs().max().item()
        assert err <= 2 * err_sdpa + 1e-5, f"{label}{name}: err {err:.3g} vs SDPA {err_sdpa:.3g}"


CUDA_CASES = [  # (B, H, Hkv, Tq, Tk, d, causal, alibi)
    (2, 8, 8, 512, 512, 64, True, False),
    (2, 8, 8, 512, 512, 64, False, False),
    (2, 8, 2, 1000, 1000, 96, True, False),    # GQA, ragged length, d=96
    (1, 8, 1, 256, 640, 128, True, False),     # MQA, Tq < Tk
    (1, 4, 4, 300, 300, 256, True, False),     # d=256
    # ALiBi: slopes 2^-1..2^-8 and |i - j| < 256 keep SDPA's low-precision bias exact, so that
    # SDPA's error is a fair yardstick
    (2, 8, 2, 256, 256, 128, False, True),     # GQA
    (2, 8, 8, 250, 250, 64, True, True),
]


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", CUDA_CASES, ids=lambda c: "B{}H{}kv{}Tq{}Tk{}d{}{}{}".format(
    *c[:6], "-causal" if c[6] else "", "-alibi" if c[7] else ""))
def test_low_precision_within_2x_of_sdpa(case, dtype):
    B, H, Hkv, Tq, Tk, d, causal, alibi = case
    q, k, v, do = _inputs(B, H, Hkv, Tq, Tk, d, d, dtype=dtype)
    slopes = 2.0 ** -torch.arange(1.0, H + 1, device=DEVICE) if alibi else None
    ref = _run(attention_reference, *(t.float() for t in (q, k, v, do)), causal=causal, alibi_slopes=slopes)
    ours = _run(flash_attention, q, k, v, do, causal=causal, alibi_slopes=slopes)
    base = _run(_sdpa, q, k, v, do, causal=causal, alibi_slopes=slopes)
    _assert_within_2x_of_sdpa(ours, base, ref)


@cuda_only
@pytest.mark.parametrize("window", [1, 100, 256, 700])
def test_sliding_window_bf16_within_2x_of_sdpa(window):
    """Windows below, at and across the GPU tiles (64-128), GQA, a ragged length."""
    q, k, v, do = _inputs(2, 8, 2, 1000, 1000, 64, 64, dtype=torch.bfloat16)
    ref = _run(attention_reference, *(t.float() for t in (q, k, v, do)), causal=True, window=window)
    ours = _run(flash_attention, q, k, v, do, causal=True, window=window)
    base = _run(_sdpa, q, k, v, do, causal=True, window=window)
    _assert_within_2x_of_sdpa(ours, base, ref)


@cuda_only
@pytest.mark.parametrize("d", [64, 128, 256])
def test_every_gpu_config_within_2x_of_sdpa(d, monkeypatch):
    """Whichever candidate config the timing in _launch picks must be right: run each alone."""
    q, k, v, do = _inputs(2, 8, 2, 300, 300, d, d, dtype=torch.bfloat16)
    ref = _run(attention_reference, *(t.float() for t in (q, k, v, do)), causal=True)
    base = _run(_sdpa, q, k, v, do, causal=True)
    configs = {kind: fa._GPU_CONFIGS[kind][d] for kind in fa._GPU_CONFIGS}
    for i in range(max(map(len, configs.values()))):
        monkeypatch.setattr(fa, "_candidates",
                            lambda kind, *_, i=i: ([configs[kind][min(i, len(configs[kind]) - 1)]], []))
        fa._CHOSEN.clear()
        ours = _run(flash_attention, q, k, v, do, causal=True)
        _assert_within_2x_of_sdpa(ours, base, ref, f"config #{i} ")
    fa._CHOSEN.clear()
