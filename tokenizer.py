"""Encode/decode text as the dataset's meta.json says: `char` (with its `chars` list) or `tiktoken:<encoding>`.

data/*/prepare.py write meta.json; train.py copies it into the checkpoint, and sample.py calls
load_tokenizer(ckpt["meta"]) so that prompts and samples use the tokens the model was trained on.
"""


class TokenizerError(ValueError):
    """A one-line problem with the tokenizer (sample.py prints it and exits 2)."""


class CharTokenizer:
    def __init__(self, chars):
        self.chars = list(chars)
        self.stoi = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text):
        missing = sorted(set(c for c in text if c not in self.stoi))
        if missing:
            raise TokenizerError(f"characters {''.join(missing)!r} are not in the model's vocabulary; "
                                 f"use only characters seen in training")
        return [self.stoi[c] for c in text]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


class TiktokenTokenizer:
    def __init__(self, name):
        import tiktoken
        if name not in tiktoken.list_encoding_names():
            raise TokenizerError(f"meta.json names the tiktoken encoding {name!r}, which this tiktoken does not "
                                 f"know ({', '.join(tiktoken.list_encoding_names())}); upgrade tiktoken")
        try:
            self.enc = tiktoken.get_encoding(name)
        except Exception as e:  # offline without a cached copy: requests' errors
            raise TokenizerError(f"cannot load the tiktoken encoding {name!r} ({type(e).__name__}); connect to the "
                                 f"internet once, or set TIKTOKEN_CACHE_DIR to a folder that holds it") from None

    def encode(self, text):
        # A prompt may name the document separator explicitly, as it appears in the training data.
        return self.enc.encode(text, allowed_special={"<|endoftext|>"})

    def decode(self, ids):
        return self.enc.decode(list(ids))


def load_tokenizer(meta: dict):
    kind = meta.get("tokenizer", "char")
    if kind == "char":
        if "chars" not in meta:
            raise TokenizerError("meta.json says tokenizer 'char' but has no 'chars' list; re-run the prepare script")
        return CharTokenizer(meta["chars"])
    if kind.startswith("tiktoken:"):
        return TiktokenTokenizer(kind.split(":", 1)[1])
    if kind == "none":  # token ids without text (e.g. data/mqar): nothing to encode a prompt with
        raise TokenizerError("this run's dataset has no tokenizer (meta.json tokenizer 'none', e.g. MQAR's synthetic "
                             "ids): there is no text to prompt or print; evaluate it with python -m tools.eval")
    raise TokenizerError(f"unknown tokenizer {kind!r} in meta.json; expected 'char' or 'tiktoken:<name>'")
