"""Sample from a trained model, with a KV cache (or --no_cache to recompute every step).

    python sample.py --out_dir=out-shakespeare-char --start="ROMEO:" --max_new_tokens=500
    python sample.py --out_dir=... --temperature=0 --no_cache     # greedy, no cache
    python sample.py --init_from=gpt2 --start="Hello, I'm a language model,"   # OpenAI's GPT-2 weights
    python sample.py --init_from=gpt2 --attention=gqa --n_kv_head=4   # ... converted on load (pretrained.py)

Samples stream to stdout, separated by a line of dashes; timing goes to stderr.
"""
import os
import sys
import time

import torch

from attention import check_impl_runs_on
from pretrained import from_pretrained
from tokenizer import TokenizerError, load_tokenizer
from trainer.checkpoint import (
    CheckpointError,
    load_checkpoint,
    model_config_from_checkpoint,
    model_from_checkpoint,
    run_checkpoint_path,
)
from trainer.cli import OneLineParser, fail
from trainer.settings import resolve_device
from trainer.threads import use_cpu_threads


def parse_args(argv=None):
    ap = OneLineParser(prog="python sample.py", description=__doc__.splitlines()[0])
    ap.add_argument("--out_dir", default="out", help="folder holding best.pt / ckpt.pt")
    ap.add_argument("--init_from", default="",
                    help="gpt2 | gpt2-medium | gpt2-large | gpt2-xl | a folder with config.json and "
                         "model.safetensors: sample GPT-2's weights instead of a run in --out_dir")
    ap.add_argument("--attention", help="with --init_from: convert GPT-2's MHA to gqa, mqa or mla")
    ap.add_argument("--n_kv_head", type=int, help="with --init_from and --attention=gqa: K/V heads")
    ap.add_argument("--kv_lora_rank", type=int, help="with --init_from and --attention=mla: latent rank")
    ap.add_argument("--ckpt", default="best", choices=("best", "last"),
                    help="best: best.pt (the best validation loss) when it exists, else ckpt.pt; last: ckpt.pt")
    ap.add_argument("--start", default="\n", help="prompt text, or FILE:path to read it from a file")
    ap.add_argument("--num_samples", type=int, default=1)
    ap.add_argument("--max_new_tokens", type=int, default=500)
    ap.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    ap.add_argument("--top_k", type=int, default=200, help="0 = no top-k")
    ap.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling; 1 = off")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads; 0 = the visible cores less the processes running now (OMP_NUM_THREADS kept)")
    ap.add_argument("--attn_impl", default=None, help="override the checkpoint's attn_impl")
    ap.add_argument("--max_context", type=int, default=0,
                    help="tokens kept while decoding (RoPE/ALiBi/none slide past it; linear "
                         "attention's state keeps everything, so it only crops the prompt); 0 = block_size")
    ap.add_argument("--no_cache", action="store_true", help="recompute the whole context every step")
    ap.add_argument("--compile", action="store_true",
                    help="decoding steps through torch.compile: fewer ms per token after a first step that compiles "
                         "(tens of seconds; needs a C++ compiler on CPU)")
    args = ap.parse_args(argv)
    if args.threads < 0:
        ap.error("--threads must be at least 0 (0 = choose from the free cores)")
    if args.num_samples < 1 or args.max_new_tokens < 1:
        ap.error("--num_samples and --max_new_tokens must be at least 1")
    if not 0 <= args.seed < 2**63:  # torch.Generator.manual_seed's range
        ap.error(f"--seed={args.seed} must be in [0, 2**63)")
    if not 0 <= args.temperature < float("inf") or not 0 < args.top_p <= 1 or args.top_k < 0 or args.max_context < 0:
        ap.error("need a finite --temperature >= 0, 0 < --top_p <= 1, --top_k >= 0, --max_context >= 0")
    if not args.init_from and any(v is not None for v in (args.attention, args.n_kv_head, args.kv_lora_rank)):
        ap.error("--attention, --n_kv_head and --kv_lora_rank convert pretrained weights; use them with --init_from")
    if args.compile and args.no_cache:
        ap.error("--compile compiles the cached decoding step; drop it or --no_cache")
    return args


def load_pretrained(args, device):
    """(GPT-2 model, its tokenizer), converted as the flags ask; ValueError with one line."""
    check_impl_runs_on(args.attn_impl or "auto", torch.device(device).type)
    asked = {"attention": args.attention, "n_kv_head": args.n_kv_head, "kv_lora_rank": args.kv_lora_rank,
             "attn_impl": args.attn_impl}
    model = from_pretrained(args.init_from, **{k: v for k, v in asked.items() if v is not None})
    tokenizer = load_tokenizer({"tokenizer": "tiktoken:gpt2"})
    if model.config.vocab_size < tokenizer.enc.n_vocab:
        raise ValueError(f"{args.init_from} has vocab_size={model.config.vocab_size}, fewer than the "
                         f"{tokenizer.enc.n_vocab} tokens of GPT-2's tokenizer that sample.py uses")
    return model.eval().to(device), tokenizer


def read_prompt(start):
    """--start as text, or FILE:path; one-line error when missing or empty."""
    if start.startswith("FILE:"):
        path = start[5:]
        if os.path.isdir(path):
            fail(f"prompt file {path} is a folder; give a text file")
        if not os.path.isfile(path):  # /dev/zero and other devices too: only a regular file is read
            fail(f"prompt file {path} not found" if not os.path.exists(path) else
                 f"prompt file {path} is not a regular file; give a text file")
        try:
            with open(path, encoding="utf-8") as f:
                start = f.read()
        except UnicodeDecodeError as e:
            fail(f"prompt file {path} is not UTF-8 text (byte {e.object[e.start]:#04x}); convert it to UTF-8")
        except OSError as e:
            fail(f"cannot read prompt file {path} ({e.strerror})")
        if "\x00" in start:
            fail(f"prompt file {path} holds NUL bytes (a binary file); give a text file")
    if not start:
        fail("the prompt is empty; pass --start with at least one token")
    return start


def load_for_sampling(args, ckpt_path, device):
    """(model, tokenizer) from a checkpoint or pretrained weights; ValueError with one line."""
    if args.init_from:
        return load_pretrained(args, device)
    overrides = {"attn_impl": args.attn_impl} if args.attn_impl else {}
    ckpt = load_checkpoint(ckpt_path, device)
    config = model_config_from_checkpoint(ckpt, ckpt_path, **overrides)
    check_impl_runs_on(config.attn_impl, torch.device(device).type)  # the checkpoint's, or --attn_impl
    model = model_from_checkpoint(ckpt, config, ckpt_path, device)
    if "meta" not in ckpt:
        raise CheckpointError(f"{ckpt_path} lacks meta (the tokenizer); it was not written by train.py")
    return model, load_tokenizer(ckpt["meta"])


def stream_sample(model, tokenizer, x, args, generator):
    """Print one sample as it is generated; returns (new tokens, the text printed after the prompt)."""
    pending, printed, n_new = [], [], 0  # pending: ids not printed yet
    for next_id in model.generate_stream(x, args.max_new_tokens, temperature=args.temperature,
                                         top_k=args.top_k or None, top_p=args.top_p, generator=generator,
                                         use_cache=not args.no_cache, max_context=args.max_context or None,
                                         compile=args.compile):
        pending.append(next_id.item())
        n_new += 1
        text = tokenizer.decode(pending)
        if not text.endswith("\ufffd"):  # else wait for the rest of a multi-byte character
            sys.stdout.write(text)
            sys.stdout.flush()
            printed.append(text)
            pending = []
    printed.append(tokenizer.decode(pending))
    sys.stdout.write(printed[-1] + "\n---------------\n")
    return n_new, "".join(printed)


def main(argv=None):
    args = parse_args(argv)
    start = read_prompt(args.start)
    ckpt_path = run_checkpoint_path(args.out_dir, args.ckpt)
    if not args.init_from and not os.path.exists(ckpt_path):
        fail(f"{ckpt_path} not found; pass the out_dir you trained into (python train.py config/gqa.py "
             f"writes out-gqa: --out_dir=out-gqa)")
    try:  # every problem with the device, checkpoint, prompt or flags: one line, before any work
        device = resolve_device(args.device)
        model, tokenizer = load_for_sampling(args, ckpt_path, device)
        prompt = tokenizer.encode(start)
    except (TokenizerError, ValueError) as e:  # ConfigError and CheckpointError are ValueErrors
        fail(str(e))
    try:
        model.context_window(args.max_context or None)
    except ValueError as e:
        fail(f"{e} (--max_context)")

    threads, why = use_cpu_threads(args.threads, device)
    if device.startswith("cpu"):
        print(f"cpu threads: {threads} ({why})", file=sys.stderr)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    x = torch.tensor(prompt, dtype=torch.long, device=device)[None, :]
    for s in range(args.num_samples):
        sys.stdout.write(start)
        t0 = time.time()
        n_new, text = stream_sample(model, tokenizer, x, args, generator)
        if args.temperature == 0 and not text.strip():
            print("note: greedy decoding from this prompt gives only whitespace (a character model's most likely "
                  "token after a newline is often another); pass text with --start, e.g. --start='ROMEO:'",
                  file=sys.stderr)
        dt = time.time() - t0
        print(f"sample {s + 1}: {n_new} tokens in {dt:.2f}s ({n_new / dt:.1f} tokens/s, "
              f"{'no cache' if args.no_cache else cache_label(model)})", file=sys.stderr)


def cache_label(model):
    """What decoding keeps, by the model's own counts: a cache growing per token (up to a window),
    a constant state (linear attention), or both (a hybrid plan). GLA keeps no K/V cache."""
    per_token, state = model.cache_elems_per_token(), model.cache_state_elems()
    caps = [b.attn.cache_max_tokens() for b in model.h if b.attn.cache_elems_per_token()]
    capped = caps and None not in caps  # every growing layer stops at a window (swa): else it grows
    kept = []
    if per_token:
        kept.append(f"kv cache of {per_token:,} elements/token" + (f" up to {max(caps)} tokens" if capped else ""))
    if state:
        kept.append(f"constant state of {state:,} elements")
    return " + ".join(kept) or "no cache"


if __name__ == "__main__":
    main()
