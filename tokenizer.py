"""Encode/decode text as the dataset's meta.json says: `char` or `tiktoken:<encoding>`."""


class TokenizerError(ValueError):
    pass


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
        self.enc = tiktoken.get_encoding(name)

    def encode(self, text):
        return self.enc.encode(text, allowed_special={"<|endoftext|>"})

    def decode(self, ids):
        return self.enc.decode(list(ids))


def load_tokenizer(meta: dict):
    kind = meta.get("tokenizer", "char")
    if kind == "char":
        return CharTokenizer(meta["chars"])
    if kind.startswith("tiktoken:"):
        return TiktokenTokenizer(kind.split(":", 1)[1])
    raise TokenizerError(f"unknown tokenizer {kind!r} in meta.json; expected 'char' or 'tiktoken:<name>'")
