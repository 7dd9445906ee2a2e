"""Start from OpenAI's GPT-2: load its weights into GPT, optionally converting its MHA to GQA, MQA or MLA.

    from pretrained import from_pretrained
    from_pretrained("gpt2")                                    # 124M, from the Hugging Face hub
    from_pretrained("path/to/folder")                          # config.json + model.safetensors
    from_pretrained("gpt2", attention="gqa", n_kv_head=4)      # mean-pooled K/V heads
    from_pretrained("gpt2", attention="mla", kv_lora_rank=256) # K/V through an SVD latent

GPT-2 is this repo's GPT with pos_encoding=learned, bias=True, gelu_approximate=tanh and
LayerNorm eps 1e-5; its module names are ours too. Its Conv1D layers store weights as
(in, out), the transpose of nn.Linear's. Conversions (printed to stderr, one line per layer,
with the relative error they introduce in the stacked K/V map):

  GQA / MQA (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models
  from Multi-Head Checkpoints", section 2.1): each group of n_head / n_kv_head query heads
  shares one K and one V head, initialised to the mean of the group's K (and V) weights and
  biases. Exact when the heads of each group are equal.

  MLA (DeepSeek-V2's latent attention; the conversion follows the low-rank factorisation of
  MHA2MLA, Ji et al. 2025, arXiv:2502.14837, and TransMLA, Meng et al. 2025, arXiv:2502.07864):
  per layer, the K and V projections of all heads are stacked into one affine map
      A = [ W_k  b_k ]   (2 * n_embd rows, n_embd + 1 columns: the bias acts on a constant 1)
          [ W_v  b_v ]
  and A ~= U_r S_r V_r^T, its truncated SVD at r = kv_lora_rank (the best rank-r approximation
  in Frobenius norm, Eckart-Young). The down-projection kv_down gets sqrt(S_r) V_r^T (its last
  column becoming kv_down's bias), k_up and v_up the K and V rows of U_r sqrt(S_r). Queries,
  output and MLP are copied. Positions stay GPT-2's learned table, so MLA's decoupled RoPE key
  is absent (rope_head_dim = 0) and the cache holds r numbers per token per layer. The latent
  RMSNorm is off (mla_latent_norm=False) unless asked for: it rescales each token's K and V,
  which the source does not. Exact when rank(A) <= r.

Every problem (unknown name, missing files, a config that is not GPT-2's, an impossible
conversion) is a ValueError with one line; train.py and sample.py print it and exit 2.
"""
import json
import os
import sys
from dataclasses import fields

import torch

from attention import variant_class
from model import GPT, GPTConfig

HUB_REPOS = {name: f"openai-community/{name}" for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}
# Keys a caller may change from the pretrained model's; any other GPTConfig key must equal it.
OVERRIDABLE = ("attention", "n_kv_head", "kv_lora_rank", "mla_latent_norm", "mla_decode", "dropout",
               "block_size", "attn_impl")
CONVERTIBLE = ("mha", "gqa", "mqa", "mla")
GELU_APPROXIMATE = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}
CONV1D_LAYERS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")   # GPT-2's causal-mask buffers, not weights


def pretrained_file(name_or_dir, filename):
    """Local path of `filename` (config.json or model.safetensors) of a hub name or a folder."""
    if name_or_dir in HUB_REPOS:
        try:
            from huggingface_hub import hf_hub_download
            return hf_hub_download(HUB_REPOS[name_or_dir], filename)
        except Exception as e:  # noqa: BLE001 -- offline, hub down, no package: each says the same to the user
            raise ValueError(f"cannot download {name_or_dir}'s {filename} from the Hugging Face hub "
                             f"({type(e).__name__}); connect to the internet or pass a local folder holding "
                             f"config.json and model.safetensors") from None
    if not os.path.isdir(name_or_dir):
        raise ValueError(f"init_from={name_or_dir!r} is neither a GPT-2 name ({', '.join(HUB_REPOS)}) nor a "
                         f"folder; pass one of those names or a folder with config.json and model.safetensors")
    missing = [f for f in ("config.json", "model.safetensors") if not os.path.isfile(os.path.join(name_or_dir, f))]
    if missing:
        raise ValueError(f"folder {name_or_dir} lacks {' and '.join(missing)}; save the model there with "
                         f"save_pretrained(folder, safe_serialization=True)")
    return os.path.join(name_or_dir, filename)


def gpt2_config(path) -> dict:
    """GPTConfig keys of the GPT-2 described by a Hugging Face config.json; ValueError if it is not one."""
    try:
        with open(path) as f:
            hf = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not readable JSON ({type(e).__name__}); save the model again") from None
    if not isinstance(hf, dict) or hf.get("model_type") != "gpt2":
        kind = hf.get("model_type") if isinstance(hf, dict) else type(hf).__name__
        raise ValueError(f"{path} describes model_type={kind!r}, not gpt2; only GPT-2 checkpoints load here")
    act = hf.get("activation_function", "gelu_new")
    unsupported = [(act not in GELU_APPROXIMATE, f"activation_function={act!r}"),
                   (hf.get("n_inner") not in (None, 4 * hf.get("n_embd", 0)), f"n_inner={hf.get('n_inner')}"),
                   (not hf.get("scale_attn_weights", True), "scale_attn_weights=false"),
                   (hf.get("scale_attn_by_inverse_layer_idx", False), "scale_attn_by_inverse_layer_idx=true"),
                   (not hf.get("tie_word_embeddings", True), "tie_word_embeddings=false")]
    bad = [what for cond, what in unsupported if cond]
    if bad:
        raise ValueError(f"{path}: GPT-2 variant with {', '.join(bad)} is not supported; use a standard GPT-2")
    try:
        return {"block_size": hf["n_positions"], "vocab_size": hf["vocab_size"], "n_layer": hf["n_layer"],
                "n_head": hf["n_head"], "n_embd": hf["n_embd"], "layer_norm_eps": hf.get("layer_norm_epsilon", 1e-5),
                "gelu_approximate": GELU_APPROXIMATE[act], "bias": True, "pos_encoding": "learned",
                "attention": "mha"}
    except KeyError as e:
        raise ValueError(f"{path} lacks {e.args[0]!r}; it is not a complete GPT-2 config") from None


def gpt2_state_dict(path, config: GPTConfig) -> dict:
    """GPT-2's weights under this repo's names (the MHA model of `config`), Conv1D weights transposed."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:
        raw = load_file(path)
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{path} is not a readable safetensors file ({str(e).splitlines()[0][:100]})") from None
    state = {}
    for name, tensor in raw.items():
        name = name.removeprefix("transformer.")
        if name.endswith(IGNORED_SUFFIXES) or name == "lm_head.weight":   # lm_head is tied to wte
            continue
        if name.endswith(".weight") and name.removesuffix(".weight").endswith(CONV1D_LAYERS):
            tensor = tensor.t()
        state[name] = tensor.float().contiguous()
    with torch.device("meta"):  # shapes only, nothing allocated
        expected = {k: v.shape for k, v in GPT(config).state_dict().items() if k != "lm_head.weight"}
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(expected) & set(state) if state[k].shape != expected[k])
    if missing:
        raise ValueError(f"{path} does not match its config.json: it lacks {missing[0]}")
    if unexpected:
        raise ValueError(f"{path} does not match its config.json: it has an unexpected {unexpected[0]}")
    if wrong:
        raise ValueError(f"{path} does not match its config.json: {wrong[0]} has shape "
                         f"{tuple(state[wrong[0]].shape)}, expected {tuple(expected[wrong[0]])}")
    return state


def convert_layer(state, prefix, config: GPTConfig):
    """Rewrite one layer's attention weights in `state` (MHA names) for config.attention; returns the
    error. The variant converts itself (Attention.convert_from_mha: attention/mha.py, attention/mla.py)."""
    return variant_class(config.attention).convert_from_mha(state, prefix, config)


def target_config(source: dict, overrides: dict) -> GPTConfig:
    """The converted model's config: the source's keys plus the allowed overrides (one-line errors)."""
    defaults = {f.name: f.default for f in fields(GPTConfig)}
    for key, value in overrides.items():
        if key not in defaults:
            raise ValueError(f"unknown model key {key}=; a pretrained model takes {', '.join(OVERRIDABLE)}")
        fixed = source.get(key, defaults[key])
        if key not in OVERRIDABLE and value != fixed:
            raise ValueError(f"{key}={value!r} cannot change in a pretrained model (it has {key}={fixed!r}); "
                             f"drop it, or change only {', '.join(OVERRIDABLE)}")
    attention = overrides.get("attention", "mha")
    if attention not in CONVERTIBLE:
        raise ValueError(f"attention={attention} cannot be converted from GPT-2's MHA weights; "
                         f"choose one of {', '.join(CONVERTIBLE)}")
    if overrides.get("block_size", source["block_size"]) > source["block_size"]:
        raise ValueError(f"block_size={overrides['block_size']} exceeds the model's {source['block_size']} "
                         f"learned positions; use at most {source['block_size']}")
    latent_norm = {"mla_latent_norm": False} if attention == "mla" else {}
    config = GPTConfig(**{**source, **latent_norm, **overrides})
    if attention == "mla" and config.kv_lora_rank > 2 * config.n_embd:
        raise ValueError(f"kv_lora_rank={config.kv_lora_rank} is larger than the K/V width 2 * n_embd = "
                         f"{2 * config.n_embd} it compresses; choose at most that (MHA caches as much)")
    return config


def overrides_from_keys(keys: dict, explicit=None) -> dict:
    """The model keys a parsed run asks of the pretrained model. keys: settings.parse_keys(argv, explicit)
    (every key, defaults included); explicit: the keys the user set there. Without explicit, the
    model keys that differ from GPTConfig's defaults. from_pretrained refuses, in one line, those that
    would change anything but OVERRIDABLE."""
    defaults = {f.name: f.default for f in fields(GPTConfig)}
    if explicit is not None:
        return {k: keys[k] for k in explicit if k in defaults}
    return {k: v for k, v in keys.items() if k in defaults and v != defaults[k]}


def pretrained_config(name_or_dir, **overrides) -> GPTConfig:
    """The (converted) model's GPTConfig from config.json alone: for checking a run's settings
    before the weights are fetched (train.py's settings step); the same refusals as from_pretrained."""
    return target_config(gpt2_config(pretrained_file(name_or_dir, "config.json")), overrides)


def from_pretrained(name_or_dir, **overrides) -> GPT:
    """GPT with GPT-2's weights, converted to overrides['attention'] when asked (see the module docstring)."""
    source = gpt2_config(pretrained_file(name_or_dir, "config.json"))
    config = target_config(source, overrides)   # every refusal before the weights are fetched
    state = gpt2_state_dict(pretrained_file(name_or_dir, "model.safetensors"), GPTConfig(**source))
    state["wpe.weight"] = state["wpe.weight"][:config.block_size]
    if config.attention != "mha":
        how = f"n_kv_head={config.n_kv_head}" if config.attention != "mla" else f"kv_lora_rank={config.kv_lora_rank}"
        for i in range(config.n_layer):
            err = convert_layer(state, f"h.{i}.attn.", config)
            print(f"{name_or_dir}: layer {i + 1}/{config.n_layer} MHA -> {config.attention} ({how}): "
                  f"relative K/V error {err:.6g}", file=sys.stderr)
        if config.attention == "mla" and config.mla_latent_norm:
            print("note: mla_latent_norm=True rescales each token's latent, which the source does not; the "
                  "errors above cover the linear factorisation only", file=sys.stderr)
    model = GPT(config)
    model.load_state_dict({**state, "lm_head.weight": state["wte.weight"]})
    return model
