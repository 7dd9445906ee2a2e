"""Hugging Face text datasets as tokenizing tasks: a hub name (streamed) or local files, read in order.

Local data: parquet / jsonl / json / csv / txt / arrow files read in place, or a folder written by
save_to_disk. Every row is one document; which documents go to validation is drawn here, in
document order, so that the draw depends on neither task sizes nor --num_proc.
"""
import os

import numpy as np

from . import tokenizers  # tokenizers.CHUNK_CHARS is read at call time: tests shrink it
from .errors import InputError, SourceError, one_line

TEXT_FIELD_HINT = "parquet/jsonl/json/csv/txt/arrow files, or a folder written by Dataset.save_to_disk"
LOCAL_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv",
                  ".txt": "text", ".arrow": "arrow"}


def looks_local(dataset):
    """A --dataset value meant as a path (that may not exist) rather than a hub name."""
    return dataset.startswith((".", "/", "~")) or os.path.splitext(dataset)[1].lower() in LOCAL_BUILDERS


def _saved_split(datasets, path, split):
    """One split of a folder written by save_to_disk, as a streaming IterableDataset."""
    ds = datasets.load_from_disk(path)
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise InputError(f"{path} has splits {', '.join(ds)}, not {split!r}; pick one with --split")
        ds = ds[split]
    return ds.to_iterable_dataset()


def _local_source(path, split):
    """A local path as a streaming IterableDataset: save_to_disk folders, or data files read in place
    (streaming=True reads them directly, without converting them into the datasets cache)."""
    import datasets
    if os.path.isdir(path) and any(os.path.exists(os.path.join(path, f)) for f in ("dataset_dict.json", "state.json")):
        return _saved_split(datasets, path, split)
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
    kinds = {}
    for f in files:
        ext = os.path.splitext(f[:-3] if f.endswith(".gz") else f)[1].lower()
        if ext in LOCAL_BUILDERS:
            kinds.setdefault(LOCAL_BUILDERS[ext], []).append(f)
    if len(kinds) != 1:
        found = "none" if not kinds else ", ".join(sorted(kinds))
        raise InputError(f"{path}: need data files of one kind ({TEXT_FIELD_HINT}), found {found}")
    if split != "train":
        raise InputError(f"local data files form a single split; drop --split/--val_split {split!r} "
                         f"(validation is then drawn with --val_fraction), or use a save_to_disk folder with splits")
    builder, data_files = next(iter(kinds.items()))
    if all(os.path.getsize(f) == 0 for f in data_files):
        raise InputError(f"{path} holds no documents; pass files with data in them")
    # A .txt file is one document (not one per line, the text builder's default).
    extra = {"sample_by": "document"} if builder == "text" else {}
    return datasets.load_dataset(builder, data_files=data_files, split="train", streaming=True, **extra)


def _load(args, split, local):
    """The split as an IterableDataset, every failure to open it as one InputError naming the fix."""
    # datasets' IterableDataset imports torch when it is installed (~200 MB more per process), only to
    # share its epoch counter with torch DataLoader workers, which this script does not use.
    os.environ.setdefault("USE_TORCH", "0")
    try:
        import datasets
    except ImportError:
        raise InputError("the Hugging Face datasets package is missing; pip install datasets") from None
    where = args.input or args.dataset
    try:
        if local:
            return _local_source(where, split)
        kw = dict(name=args.name, split=split, streaming=args.streaming, revision=args.revision)
        ds = datasets.load_dataset(where, **kw, **({} if args.streaming else {"num_proc": args.num_proc}))
        return ds if args.streaming else ds.to_iterable_dataset()
    except InputError:
        raise
    except Exception as e:  # offline, unknown name or split, scripts no longer supported...: one line each
        if local:
            raise InputError(f"cannot read {where} ({one_line(e)}); pass {TEXT_FIELD_HINT}") from None
        hint = ("; the hub copy still uses a loading script: try --revision=refs/convert/parquet"
                if "scripts are no longer supported" in str(e) else "")
        raise InputError(f"cannot load {where!r} (config {args.name}, split {split}) from the Hugging Face Hub "
                         f"({one_line(e)}){hint}; check --dataset/--name/--split and the connection, "
                         f"or pass a local copy with --input PATH ({TEXT_FIELD_HINT})") from None


def _columns(ds, features, where, split):
    """The dataset's column names (read from the first row when the builder does not know them yet)."""
    if features is not None:
        return list(features)
    try:
        first = next(iter(ds.take(1)), None)
    except Exception as e:
        raise InputError(f"cannot read {where} ({one_line(e)}); pass {TEXT_FIELD_HINT}") from None
    if first is None:
        raise InputError(f"{where} (split {split}) holds no documents")
    return list(first)


def open_source(args, split, local):
    """The dataset split as a streaming IterableDataset with the text field checked; InputError otherwise."""
    ds = _load(args, split, local)
    where, field = args.input or args.dataset, args.text_field
    features = ds.features
    columns = _columns(ds, features, where, split)
    if field not in columns:
        raise InputError(f"{where} (split {split}) has no field {field!r}; its fields are "
                         f"{', '.join(columns)}: pass the one holding the text with --text_field=NAME")
    if features is not None:
        kind = getattr(features[field], "dtype", None)
        if kind not in ("string", "large_string"):
            raise InputError(f"field {field!r} of {where} holds {features[field]}, not text; "
                             f"pass the one holding the text with --text_field=NAME (fields: {', '.join(columns)})")
    return ds.select_columns([field])  # decode only the text


def hf_tasks(ds, field, first_doc, route, rng, val_fraction, local):
    """Yield (meta, [(text, True)...]) tasks of about CHUNK_CHARS, reading the dataset in order.

    meta records where the dataset stands after the task (for resuming), the document numbers and
    which documents go to val (drawn here, in document order, so that the draw does not depend on
    task sizes or --num_proc)."""
    pieces, chars, doc = [], 0, first_doc
    batches = ds.iter(batch_size=64)
    while True:
        try:
            batch = next(batches, None)
        except Exception as e:  # a broken local file is bad input; network trouble midway is resumable
            msg = f"reading the dataset failed at document {doc} ({one_line(e)})"
            raise (InputError(f"{msg}; fix or remove that file") if local else SourceError(msg)) from None
        if batch is not None:
            for text in batch[field]:
                if not isinstance(text, str):
                    raise InputError(f"document {doc} has {field} = {str(text)[:40]!r} ({type(text).__name__}), "
                                     f"not text; clean the dataset or pick another --text_field")
                pieces.append((text, True))
                chars += len(text)
                doc += 1
        if pieces and (chars >= tokenizers.CHUNK_CHARS or batch is None):
            to_val = (rng.random(len(pieces)) < val_fraction) if route == "fraction" else \
                np.full(len(pieces), route == "val")
            yield {"end_doc": doc, "to_val": to_val, "ds_state": ds.state_dict(),
                   "rng": rng.bit_generator.state}, pieces
            pieces, chars = [], 0
        if batch is None:
            return
