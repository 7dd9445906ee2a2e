"""Any local text: .txt files or folders of them, tokenized by characters or any tiktoken encoding.

    python data/text/prepare.py --input book1.txt book2.txt --out_dir data/books --tokenizer gpt2
    python data/text/prepare.py --input notes/ --out_dir data/notes --tokenizer char
    python train.py config/gqa.py --dataset=books               # train on it

Each file is one document (followed by <|endoftext|> with tiktoken encodings); files are read
in the order given (a folder's .txt files sorted by path). The last --val_fraction of the text
(default 0.1) is the validation split. Writes train.bin, val.bin and meta.json; --dtype=uint32
forces 32-bit ids (automatic when the vocabulary exceeds 65536). The text is tokenized as it is
(--newlines=keep); it says so when a file has a byte-order mark or CRLF line ends, and
--newlines=unix reads them as dos2unix would leave them.
"""
import os
import runpy

# Registers the data package without editing sys.path; data/bootstrap.py says why (and why at top level).
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bootstrap.py"))

if __name__ == "__main__":
    from data import prepare_text

    prepare_text.main(__doc__, out_dir=os.path.dirname(os.path.abspath(__file__)), tokenizer="gpt2", val_fraction=0.1)
