"""Each variant declares the keys it owns (owned_keys in its own file); GPTConfig refuses, in one
line naming the key, its value, the plan, the owners and the fix, a key set away from its default
that no variant of the plan owns, and accepts it where one does:

- every declared key x every variant that does not own it: refused; x every owner: accepted;
- the declarations cover what each variant's files read (config.<key>, scanned here);
- the fix the message names (--key=default) parses back to the default through the settings
  loader, and resets a key a config file set (config/swa_mha.py under a plan without swa);
- a saved config (checkpoint) that holds such a key, ignored when it was trained, still loads.
"""
import inspect
import re
import sys

import pytest
import torch

from attention import VARIANTS, key_owners, variant_class
from helpers import ROOT, tiny_model_kwargs, train_args
from model import GPT, GPTConfig
from trainer.checkpoint import model_config_from_checkpoint, model_from_checkpoint

# A value away from the default for each variant-owned key, valid for every owner at tiny sizes
# (block_size 32, 4 heads of 8). A key declared later needs a row here (test_table_covers_the_keys).
NON_DEFAULT = {"q_lora_rank": 8, "kv_lora_rank": 16, "rope_head_dim": 4, "qk_nope_head_dim": 8, "v_head_dim": 4,
               "mla_latent_norm": False, "mla_decode": "expanded", "sparse_block": 8, "sparse_window": 2,
               "sparse_global": 0, "sparse_random": 0, "sparse_seed": 3, "sliding_window": 8, "moba_topk": 1,
               "gla_gate": "none", "gla_feature_map": "relu", "gla_chunk": 8, "gla_output_gate": "none",
               "gla_norm": "none", "gla_conv": 2, "delta_conv": 2, "delta_chunk": 8, "delta_beta": "sigmoid2",
               "conv_taps": 2, "fox_pro": True, "nsa_stride": 4, "nsa_topk": 5, "nsa_compress": "mlp"}
# What each variant needs besides the key to be valid at all (sum/softmax linear members: no RoPE)
BASE = {"gqa": dict(n_kv_head=2), "linear": dict(pos_encoding="none"), "efficient": dict(pos_encoding="none"),
        "deltanet": dict(pos_encoding="none"), "gated_deltanet": dict(pos_encoding="none")}
# Keys every variant may read (the model's shape, positions, dispatch): not owned by any one
SHARED = {"attention", "attn_impl", "attn_output_gate", "bias", "block_size", "dropout", "n_embd", "n_head",
          "n_kv_head", "pos_encoding"}
OWNERS = key_owners()
CASES = [(key, name) for key in sorted(OWNERS) for name in VARIANTS]


def config(name, **kw):
    return GPTConfig(**tiny_model_kwargs(attention=name, **{**BASE.get(name, {}), **kw}))


def test_table_covers_the_keys():
    assert set(NON_DEFAULT) == set(OWNERS)
    assert all(NON_DEFAULT[k] != getattr(GPTConfig, k) for k in NON_DEFAULT)


@pytest.mark.parametrize("key,name", CASES, ids=[f"{k}-{n}" for k, n in CASES])
def test_a_key_is_refused_unless_a_variant_of_the_plan_owns_it(key, name):
    value = NON_DEFAULT[key]
    if name in OWNERS[key]:
        assert getattr(config(name, **{key: value}), key) == value
        return
    with pytest.raises(ValueError) as e:
        config(name, **{key: value})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{key}={value!r} is set but no variant of attention={name} ")
    assert f"owned by attention={', '.join(OWNERS[key])}" in msg
    assert msg.endswith(f"--{key}={getattr(GPTConfig, key)}")


@pytest.mark.parametrize("key", sorted(OWNERS))
def test_a_plan_takes_a_key_that_one_of_its_variants_owns(key):
    owner = OWNERS[key][0]
    other = "mha" if owner != "mha" else "gla"
    kw = {**BASE.get(owner, {}), key: NON_DEFAULT[key]}
    cfg = GPTConfig(**tiny_model_kwargs(attention=f"{owner},{other}", **kw))
    assert getattr(cfg.layer_config(0), key) == NON_DEFAULT[key]          # the owner's layers read it
    assert getattr(cfg.layer_config(1), key) == getattr(GPTConfig, key)   # the others see the default
    with pytest.raises(ValueError, match=f"no variant of attention={other},{other} reads it"):
        GPTConfig(**tiny_model_kwargs(attention=f"{other},{other}", **kw))


def keys_read(cls):
    """GPTConfig fields a variant's own files (its class and its bases in attention/, not base.py) read."""
    fields = set(GPTConfig.__dataclass_fields__)
    files = {inspect.getsourcefile(c) for c in cls.__mro__ if c.__module__.startswith("attention.")
             and c.__module__ != "attention.base"}
    return {k for f in files for k in re.findall(r"config\.(\w+)", open(f).read()) if k in fields}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_declarations_cover_what_each_variant_reads(name):
    cls = variant_class(name)
    assert keys_read(cls) - SHARED <= set(cls.owned_keys)


def test_the_fix_in_the_message_parses_back_to_the_default():
    from trainer.settings import parse_keys
    for key in OWNERS:
        name = next(n for n in VARIANTS if n not in OWNERS[key])
        with pytest.raises(ValueError) as e:
            config(name, **{key: NON_DEFAULT[key]})
        flag = re.search(r"(--\w+=\S*)$", str(e.value)).group(1)
        assert parse_keys([f"--{key}={NON_DEFAULT[key]}", flag])[key] == getattr(GPTConfig, key)


def test_a_config_files_key_is_reset_from_the_command_line(data_root, tmp_path):
    """config/swa_mha.py sets sliding_window=32: under a plan without swa it is refused, and the
    message's flag makes the same command line work, through train.py's settings loader."""
    sys.path.insert(0, ROOT)
    import train
    argv = [f"{ROOT}/config/swa_mha.py", "--attention=gla,gla,gla,mha",
            *train_args(data_root, tmp_path / "run")[1:], "--n_layer=4"]
    with pytest.raises(ValueError) as e:
        train.load_settings(argv)
    flag = re.search(r"(--\w+=\S*)$", str(e.value)).group(1)
    assert flag == "--sliding_window=256"
    _, gptconf, *_ = train.load_settings(argv + [flag])
    assert gptconf.attention == "gla,gla,gla,mha" and gptconf.sliding_window == 256


def test_a_checkpoint_with_an_ignored_key_still_loads():
    """Before owned keys were checked, attention=mha with gla_gate=fixed trained (the key ignored) and
    was saved with every key: the checkpoint loads, the key reset, and its weights fit."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**tiny_model_kwargs()))
    args = {**model.config.to_dict(), "gla_gate": "fixed", "sparse_block": 8, "mla_decode": "expanded"}
    ckpt = {"model": model.state_dict(), "model_args": args}
    cfg = model_config_from_checkpoint(ckpt)
    assert (cfg.gla_gate, cfg.sparse_block, cfg.mla_decode) == ("data", 16, "absorbed")
    loaded = model_from_checkpoint(ckpt, cfg)
    idx = torch.randint(0, 65, (1, 9))
    assert torch.equal(loaded(idx)[0], model.eval()(idx)[0])
    # a key its variant owns stays as saved
    gla_args = {**GPTConfig(**tiny_model_kwargs(attention="gla", gla_gate="none")).to_dict()}
    assert model_config_from_checkpoint({"model_args": gla_args}).gla_gate == "none"
