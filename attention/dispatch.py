"""Which implementation runs: the one place that turns attn_impl into what a layer computes with.

    attn_impl  auto    the Triton kernel on CUDA when it takes the case, PyTorch elsewhere
               triton  the Triton kernel (on CPU under the interpreter); a case it cannot take
                       runs PyTorch instead, said once on stderr
               sdpa    PyTorch (SDPA for the softmax variants, the chunked form for GLA)
               naive   the plain reference math

A layer names every path its forward runs (training, prefill, one-token decoding, a masked
form...) with the kernel module that path would call and the case it would hand it
(`Attention.kernel_cases`); `choose_impl` asks attn_kernels/env.py whether the kernels run on the
device and the kernel module's `supports(...)` whether it takes the case. A path no kernel
serves names None as its module and may say why ({"why": ...}). Layers keep the answer per
device and path (`Attention.impl(device, path)`) and forward bodies only look it up, so nothing
re-decides on every forward; `impl_report` sums the layers' answers up for logs and summary.json.
"""
import importlib
import sys
from dataclasses import dataclass

import torch

from attn_kernels.env import why_unavailable

ATTN_IMPLS = ("auto", "triton", "sdpa", "naive")
_said = set()  # the stderr notes already printed: each once per process


@dataclass(frozen=True)
class ImplChoice:
    requested: str    # attn_impl as configured
    used: str         # triton | sdpa | naive
    why: str | None   # why `used` differs from `requested`; None when it is what was asked


def _say_once(message: str):
    if message not in _said:
        _said.add(message)
        print(message, file=sys.stderr)


def choose_impl(requested: str, device, kernel_module: str | None, case: dict) -> ImplChoice:
    """What runs for one path of one layer on `device`: `kernel_module` (e.g. "attn_kernels.flash_attn")
    is imported only when Triton can run here, then its supports(**case) decides. None: a path
    no kernel serves, PyTorch runs it, for the reason case["why"] (a generic one without it)."""
    device = torch.device(device)
    if requested in ("sdpa", "naive"):
        return ImplChoice(requested, requested, None)
    if requested == "auto" and device.type != "cuda":
        return ImplChoice(requested, "sdpa", "auto runs PyTorch off CUDA")
    why_not = why_unavailable(device) or (case.get("why", "no Triton kernel for this path") if kernel_module is None
                                          else importlib.import_module(kernel_module).supports(**case))
    if why_not is None:
        if device.type == "cpu":
            _say_once("note: attn_impl=triton on CPU runs the kernel under Triton's interpreter "
                      "(TRITON_INTERPRET=1): correct but slow")
        return ImplChoice(requested, "triton", None if requested == "triton" else "auto runs Triton on CUDA")
    if requested == "triton":
        _say_once(f"note: attn_impl=triton falls back to PyTorch ({kernel_module or 'no kernel'}): {why_not}")
    return ImplChoice(requested, "sdpa", why_not)


def impl_report(per_layer: list) -> dict:
    """{"requested", "used", "why"} over the layers' choices (one {path: ImplChoice} per layer):
    `used` is one name when every layer and path agrees, else {path: name} when the layers agree,
    else one such entry per layer; `why` joins the distinct reasons (None when there are none)."""
    def used_of(choices):
        names = {c.used for c in choices.values()}
        return names.pop() if len(names) == 1 else {path: c.used for path, c in choices.items()}

    used = [used_of(choices) for choices in per_layer]
    requested = list(dict.fromkeys(c.requested for choices in per_layer for c in choices.values()))
    reasons = list(dict.fromkeys(c.why for choices in per_layer for c in choices.values() if c.why))
    return {"requested": requested[0] if len(requested) == 1 else requested,
            "used": used[0] if all(u == used[0] for u in used) else used,
            "why": "; ".join(reasons) or None}


def why_impl_cannot_run(impl: str, device) -> str | None:
    """Why attn_impl=triton cannot run on `device` at all (no case of any layer), or None."""
    return why_unavailable(device) if impl == "triton" else None


def check_impl_runs_on(impl: str, device_type: str):
    """One-line ValueError, before any work, when attn_impl=triton cannot run on this device."""
    why_not = why_impl_cannot_run(impl, device_type)
    if why_not:
        raise ValueError(f"attn_impl=triton cannot run on {device_type}: {why_not}; or use attn_impl=sdpa")
