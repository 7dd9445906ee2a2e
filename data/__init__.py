"""The data pipeline behind data/<name>/prepare.py: text in, train.bin / val.bin / meta.json out.

    prepare_text.py  front end for local .txt files or folders (data/text, data/shakespeare,
                     data/shakespeare_char): char or any tiktoken encoding; the last --val_fraction
                     of the text is the validation split.
    prepare_hf.py    front end for any Hugging Face text dataset (data/openwebtext, data/fineweb): a hub
                     name, streamed, or local files (parquet / jsonl / json / csv / txt / arrow, or a
                     folder written by save_to_disk); validation is a seeded random fraction of the
                     documents or the dataset's own split; resumable after an interruption.
    text_source.py   local files as tokenizing tasks, cut where no token changes; the downloader
    hf_source.py     opening a dataset (hub or local) and reading it as tokenizing tasks
    tokenizers.py    tokenizer names, id widths, the ordered process pool that encodes the tasks
    writer.py        the output folder: temporary files renamed together, meta.json last, resume state
    cli.py           the shared parser, output options and progress bar
    progress.py      how far long work is: a bar on a terminal, plain lines off one (also tools.eval's)
    errors.py        InputError (one line, exit 2) and SourceError (resumable)
    bootstrap.py     how a prepare script imports this package without editing sys.path

What every script guarantees:
- Output: token ids as little-endian uint16 (uint32 when the vocabulary needs it, or --dtype)
  in train.bin and val.bin, and meta.json with vocab_size, dtype, tokenizer (`char` with its
  `chars`, or `tiktoken:<encoding>` with its `eot_token`) and the token counts. With tiktoken,
  every document (dataset row, or input file) ends with the end-of-text token.
- Bounded memory: documents are tokenized in chunks of about a megabyte by --num_proc worker
  processes, at most a few chunks in flight, and the tokens are appended to the output files as
  they come; the corpus is never held in memory.
- Same tokens whatever --num_proc: chunks are written in input order, and a long text is cut
  only where the tokenizer would cut it anyway (see text_source.safe_cut).
- No half-written output: tokens go to train.tmp.bin / val.tmp.bin (ignored by git like any
  .bin), renamed at the end with meta.json written last; a run that stops on bad input removes
  its temporary files, an interrupted Hugging Face run keeps them with prepare_state.json to resume.
- Bad input (missing or empty input, unknown tokenizer, missing text field, unwritable
  --out_dir, a download that fails...) is one line on stderr naming the problem and the fix,
  and exit status 2, checked before any tokenizing where it can be.

The folders next to these modules (data/<name>/) hold each dataset's prepare.py and its output.
"""
