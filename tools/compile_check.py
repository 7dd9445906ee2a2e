"""Compile every kernel launch of flash_attention and chunk_gla for a GPU that is not there
(sm_90, H100/H200).

    python -m tools.compile_check [final|main|quick|fp32|gla]     (gla: only the GLA kernels)

Triton's interpreter runs the kernels on CPU but never compiles them, so it misses what only
the compiler rejects (non-constexpr globals, dot shapes, shared-memory overflow). This replaces
JITFunction.run with a hook that compiles each launch's specialisation with triton.compile for
sm_90, and prints registers/shared memory per kernel (cuobjdump) and a final problem count.
No GPU or CUDA driver needed: only Triton's bundled ptxas. Run it in its own process: it drops
TRITON_INTERPRET before Triton and the kernels are imported.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch

from trainer.cli import OneLineParser, fail

CASE_SETS = {"final": "every specialisation a release needs (bf16/fp16 head dims, layouts, fp32, GLA)",
             "main": "GLA, then flash attention in bf16 and fp16 (the default)",
             "quick": "one shape of each kernel", "fp32": "flash attention in fp32", "gla": "only the GLA kernels"}
SM90 = ("cuda", 90, 32)   # GPUTarget(backend, arch, warp size)
DT = {
    torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
    torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8", torch.bool: "i1",
}


def compile_launch(seen, self, *args, grid, warmup, **kwargs):
    """JITFunction.run's stand-in: compile this launch's specialisation for sm_90 once (seen: key -> line)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    num_warps = kwargs.pop("num_warps", 4)
    num_stages = kwargs.pop("num_stages", 3)
    names = self.arg_names
    sig, consts, attrs = {}, {}, {}
    allargs = dict(zip(names, args))
    allargs.update(kwargs)
    for i, n in enumerate(names):
        a = allargs[n]
        if self.params[i].is_constexpr:
            sig[n] = "constexpr"
            consts[n] = a
            continue
        if isinstance(a, torch.Tensor):
            sig[n] = "*" + DT[a.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, bool):
            sig[n] = "i1"
        elif isinstance(a, int):
            if a == 1:
                sig[n] = "constexpr"
                consts[n] = 1
                continue
            sig[n] = "i32" if abs(a) < 2**31 else "i64"
            if a % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, float):
            sig[n] = "fp32"
        else:
            raise TypeError((n, type(a)))
    key = (
        self.fn.__name__,
        tuple(sorted(sig.items())),
        tuple(sorted((k, str(v)) for k, v in consts.items())),
        tuple(sorted(attrs)),
        num_warps,
        num_stages,
    )
    if key in seen:
        return
    src = ASTSource(self, sig, consts, attrs)
    tag = f"{self.fn.__name__} w{num_warps} s{num_stages} " + " ".join(
        f"{k}={v}" for k, v in consts.items() if k.isupper()
    )
    try:
        c = triton.compile(src, target=GPUTarget(*SM90), options=dict(num_warps=num_warps, num_stages=num_stages))
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(c.asm["cubin"])
            path = f.name
        cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
        ru = subprocess.run([cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True).stdout
        ru = " ".join(line.strip() for line in ru.splitlines() if "REG" in line)
        msg = f"OK   {tag} shared={c.metadata.shared} | {ru}"
        if c.metadata.shared > 232448:
            msg = "SMEM " + msg
    except Exception as e:
        msg = f"FAIL {tag}: {type(e).__name__}: {str(e)[:2000]}"
    seen[key] = msg
    print(msg, flush=True)


def go_gla(dtype, B, H, Hkv, T, dk, dv, use_g, chunk=64, h0=True, dht=True):
    """Every GLA kernel (forward and backward) at one shape; outputs are not computed."""
    import attn_kernels.gla as gla
    q = torch.randn(B, H, T, dk, dtype=dtype)
    k = torch.randn(B, Hkv, T, dk, dtype=dtype)
    v = torch.randn(B, Hkv, T, dv, dtype=dtype)
    g = -torch.rand(B, Hkv, T, dk) if use_g else None
    s0 = torch.randn(B, Hkv, dk, dv) if h0 else None
    o, bc, ht = gla._gla_fwd(q, k, v, g, s0, dk ** -0.5, chunk, store_ht=dht)
    gla._gla_bwd(torch.randn_like(o), torch.randn(B, Hkv, dk, dv) if dht else None, q, k, v, bc, s0, dk ** -0.5, chunk)


def gla_cases(quick=False):
    if quick:
        go_gla(torch.bfloat16, 2, 8, 8, 300, 64, 64, True)
        return
    for dtype in (torch.bfloat16, torch.float32):
        for d, dv in [(64, 64), (128, 128), (128, 64), (64, 128), (256, 256)]:
            for use_g in (True, False):
                go_gla(dtype, 2, 8, 2, 300, d, dv, use_g)
    go_gla(torch.float16, 2, 8, 8, 300, 128, 128, True, h0=False, dht=False)
    for chunk in (16, 32, 128):
        go_gla(torch.bfloat16, 2, 8, 8, 300, 128, 128, True, chunk=chunk)


def go(dtype, B, H, Hkv, Tq, Tk, d, dv, causal, alibi, layout=False, bs=64, window=None, forget=False):
    """Both flash kernels at one shape; without a window, one longer than any distance (as flash_attention)."""
    import attn_kernels.flash_attn as fa
    window = window or Tq + Tk + 1
    q = torch.randn(B, H, Tq, d, dtype=dtype)
    k = torch.randn(B, Hkv, Tk, d, dtype=dtype)
    v = torch.randn(B, Hkv, Tk, dv, dtype=dtype)
    sl = torch.rand(H) if alibi else None
    lists = (
        fa._layout_lists(torch.ones(H, -(-Tq // bs), -(-Tk // bs), dtype=torch.bool), H, Tq, Tk, bs, causal, "cpu")
        if layout
        else None
    )
    c = torch.randn(B, H, Tk).cumsum(-1) if forget else None   # FoX's cumulative log gates
    gates = (c[..., -Tq:].contiguous(), c) if forget else None
    o, lse = fa._flash_fwd(q, k, v, causal, 0.125, sl, lists, bs, window, gates)
    fa._flash_bwd(torch.randn_like(o), q, k, v, o, lse, causal, 0.125, sl, lists, bs, window, gates)


def run_cases(cases):
    """Launch every kernel of the case set (each launch only compiled, through compile_launch)."""
    if cases == "final":
        for d, dv in [(64, 64), (128, 128), (96, 96), (256, 256), (64, 32)]:
            for causal in (True, False):
                go(torch.bfloat16, 2, 8, 2, 300, 300, d, dv, causal, alibi=(d == 64))
        go(torch.bfloat16, 1, 4, 4, 1, 50, 64, 64, True, False)
        go(torch.bfloat16, 1, 4, 2, 128, 130, 128, 128, True, True, layout=True)
        go(torch.float16, 1, 4, 2, 128, 130, 64, 64, False, False, layout=True)
        go(torch.bfloat16, 1, 4, 2, 100, 100, 64, 64, True, True, layout=True, bs=16)  # BigBird's small blocks
        go(torch.float32, 1, 4, 2, 100, 100, 64, 64, True, True)
        go(torch.float32, 1, 4, 2, 100, 100, 192, 160, False, False)
        go(torch.bfloat16, 1, 4, 2, 300, 300, 64, 64, True, False, window=128)  # swa's sliding window
        go(torch.bfloat16, 1, 4, 2, 300, 300, 64, 64, True, False, forget=True)  # fox's gates
        cases = "none"
        gla_cases()
    elif cases == "gla":
        gla_cases()
        cases = "none"
    elif cases in ("main", "quick"):
        gla_cases(quick=cases == "quick")

    dtypes = [] if cases == "none" else [torch.bfloat16, torch.float16] if cases != "fp32" else [torch.float32]
    for dtype in dtypes:
        for d, dv in [(64, 64), (128, 128), (96, 96), (256, 256), (64, 32)] if cases != "quick" else [(64, 64)]:
            for causal in (True, False):
                go(dtype, 2, 8, 2, 300, 300, d, dv, causal, alibi=(d == 64))
        if cases != "quick":
            go(dtype, 1, 4, 4, 1, 50, 64, 64, True, False)  # Tq == 1 specialisation
            go(dtype, 1, 4, 4, 128, 128, 128, 128, True, True, layout=True)
            go(dtype, 1, 4, 4, 128, 128, 256, 256, False, False, layout=True)
            go(dtype, 1, 4, 2, 300, 300, 64, 64, True, False, window=128)  # swa's sliding window
            go(dtype, 1, 4, 2, 300, 300, 64, 64, True, False, forget=True)  # fox's gates


def main(argv=None):
    ap = OneLineParser(prog="python -m tools.compile_check", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="?", default="main", choices=CASE_SETS,
                    help="; ".join(f"{k}: {v}" for k, v in CASE_SETS.items()))
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.pop("TRITON_INTERPRET", None)   # before Triton and the kernels are imported: compiled, not interpreted
    from triton.runtime.jit import JITFunction

    import attn_kernels.flash_attn as fa
    import attn_kernels.gla as gla
    if fa.interpreted() or not gla.DIAG_LOOP:
        fail("the kernels were imported under TRITON_INTERPRET=1 before this ran; run python -m tools.compile_check "
             "in its own process")
    seen = {}
    JITFunction.run = lambda self, *a, **kw: compile_launch(seen, self, *a, **kw)
    run_cases(args.cases)
    bad = [m for m in seen.values() if not m.startswith("OK")]
    print(f"\n{len(seen)} compiled, {len(bad)} problems")


if __name__ == "__main__":
    main()
