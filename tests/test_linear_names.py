"""The linear family's named members (attention=linear, retnet, efficient; attention/linear.py,
retnet.py, efficient.py over attention/linear_family.py):

- each equals, from its own weights, the quadratic form of its paper written in
  tests/test_linear_family.py (quadratic_reference), so the name builds what its docstring says;
- each is the same layer as attention=gla with the knobs the configs used before the names
  existed: the same parameters drawn from the same seed, either's weights load into the other,
  and the logits are identical (numerics unchanged by the rename);
- a checkpoint saved as attention=gla with those knobs loads under the name, weights and logits
  unchanged (a plan's gla layers too); gla with any other knobs stays gla;
- the config files name the member, and a member refuses gla's knobs in one line.
"""
import os

import pytest
import torch

from helpers import ROOT, tiny_model_kwargs
from model import GPT, GPTConfig
from test_linear_family import quadratic_reference
from trainer.checkpoint import model_config_from_checkpoint, model_from_checkpoint
from trainer.settings import MODEL_KEYS, parse_keys

# The papers' parts, written here: name -> (pos_encoding, the gla knobs that spelled it before)
MEMBERS = {
    "linear": ("none", dict(gla_gate="none", gla_feature_map="elu", gla_norm="sum", gla_output_gate="none")),
    "retnet": ("rope", dict(gla_gate="fixed", gla_feature_map="identity", gla_norm="rms", gla_output_gate="swish")),
    "efficient": ("none", dict(gla_gate="none", gla_feature_map="softmax", gla_norm="none", gla_output_gate="none")),
}


def kwargs(name, **kw):
    pos, knobs = MEMBERS[name]
    attention = {"attention": name} if kw.pop("named", True) else {"attention": "gla", **knobs}
    return tiny_model_kwargs(**{"pos_encoding": pos, "gla_chunk": 8, "n_kv_head": 2, **attention, **kw})


def built(name, named, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**kwargs(name, named=named))).eval()


@pytest.mark.parametrize("name", MEMBERS)
def test_each_member_equals_its_quadratic_form(name):
    _, knobs = MEMBERS[name]
    torch.manual_seed(0)
    layer = GPT(GPTConfig(**kwargs(name, pos_encoding="none"))).h[0].attn
    x = torch.randn(2, 21, 32)
    ref = quadratic_reference(layer, x, knobs["gla_gate"], knobs["gla_feature_map"], knobs["gla_norm"],
                              gated=knobs["gla_output_gate"] == "swish")
    assert (layer(x, torch.arange(21)) - ref).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", MEMBERS)
def test_the_name_and_the_old_knobs_build_the_same_model(name):
    new, old = built(name, named=True), built(name, named=False)
    assert type(new.h[0].attn).__name__ != "GatedLinearAttention" and type(old.h[0].attn).__name__ == \
        "GatedLinearAttention"
    a, b = new.state_dict(), old.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)   # same draws, same names
    other = built(name, named=False, seed=1)
    new.load_state_dict(other.state_dict())                                 # strict: the same layout
    idx = torch.randint(0, 65, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(new(idx)[0], other(idx)[0])
        assert new.cache_state_elems() == other.cache_state_elems()


def test_an_old_checkpoint_loads_under_the_name():
    for name in MEMBERS:
        old = built(name, named=False, seed=2)
        ckpt = {"model": old.state_dict(), "model_args": old.config.to_dict()}
        cfg = model_config_from_checkpoint(ckpt)
        assert cfg.attention == name and cfg.gla_gate == GPTConfig.gla_gate     # knobs back at defaults
        idx = torch.randint(0, 65, (1, 17))
        with torch.no_grad():
            assert torch.equal(model_from_checkpoint(ckpt, cfg)(idx)[0], old(idx)[0])
    plan = GPTConfig(**tiny_model_kwargs(attention="gla,mha", pos_encoding="rope", **MEMBERS["retnet"][1]))
    assert model_config_from_checkpoint({"model_args": plan.to_dict()}).attention == "retnet,mha"
    ablation = GPTConfig(**tiny_model_kwargs(attention="gla", gla_gate="none", gla_feature_map="elu"))
    assert model_config_from_checkpoint({"model_args": ablation.to_dict()}).attention == "gla"


@pytest.mark.parametrize("name", MEMBERS)
def test_the_config_file_names_the_member(name):
    keys = parse_keys([os.path.join(ROOT, "config", f"{name}.py")])
    assert keys["attention"] == name and (keys["pos_encoding"], "data") == (MEMBERS[name][0], keys["gla_gate"])
    GPT(GPTConfig(vocab_size=65, **{**{k: keys[k] for k in MODEL_KEYS}, "n_layer": 1, "n_embd": 32, "n_head": 4}))


@pytest.mark.parametrize("name", MEMBERS)
def test_a_member_refuses_glas_knobs(name):
    with pytest.raises(ValueError, match=f"gla_norm='layer' is set but no variant of attention={name} reads it"):
        GPTConfig(**kwargs(name, gla_norm="layer"))
