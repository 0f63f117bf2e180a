"""Corpora: shakespeare (Gutenberg boilerplate stripped, split by work), local files, hf: specs."""

import json
import sys

import pytest

from sinkdlm.data import corpus
from sinkdlm.data.corpus import load_documents, parse_hf_spec, strip_gutenberg

TEXTS = [f"Document number {i}: a line of text.\nAnd a second line {i * 7}." for i in range(60)]


def write_parquet(path, columns: dict) -> None:
    """A parquet file written by pyarrow (an optional package: the test skips, saying so, without it)."""
    pa = pytest.importorskip("pyarrow", reason="parquet files are read with the optional pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)


def both(spec, **kw):
    return load_documents(spec, "train", **kw), load_documents(spec, "validation", **kw)


def check_split(train, val, expected):
    """Disjoint, document-level, order-preserving, covering exactly `expected`."""
    assert train and val
    assert sorted(train + val) == sorted(expected)
    assert not set(train) & set(val)
    assert train == [d for d in expected if d in set(train)]


# --- shakespeare ---------------------------------------------------------------------------


def test_shakespeare_boilerplate_gone_and_play_present():
    train, val = both("shakespeare")
    docs = train + val
    assert len(docs) == 42  # one document per *_gut.txt work
    for doc in docs:
        for word in ("Gutenberg", "GUTENBERG", "SMALL PRINT", "Etext", "*** START", "*** END"):
            assert word not in doc
        assert doc == doc.strip("\n") and len(doc) > 1000
    hamlet = [d for d in docs if "HAMLET, PRINCE OF DENMARK" in d]
    assert len(hamlet) == 1
    assert "To be, or not to be,--that is the question:--" in hamlet[0]
    assert "Take up the bodies" in hamlet[0]  # the play's last lines survive


def test_shakespeare_split_by_work_and_deterministic():
    train, val = both("shakespeare")
    assert len(val) == 4  # round(10 % of 42), chosen by a stable hash of the work name
    assert (train, val) == both("shakespeare")
    # Each work file lands wholly on exactly one side.
    for name, path in corpus.shakespeare_works().items():
        opening = path.read_text(encoding="utf-8").strip()[:300]
        sides = [any(opening in d for d in train), any(opening in d for d in val)]
        assert sides.count(True) == 1, name
    assert corpus.shakespeare_validation_works(list(corpus.shakespeare_works())) == {
        "lovers_complaint", "measure_for_measure", "much_ado_about_nothing", "phoenix_and_the_turtle"
    }


OLD_STYLE = """The Project Gutenberg Etext of Hamlet, by William Shakespeare
Copyright laws are changing all over the world, be sure to check
**Welcome To The World of Free Plain Vanilla Electronic Texts**
*BEFORE!* YOU USE OR READ THIS ETEXT
By using or reading any part of this PROJECT GUTENBERG-tm etext...
*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*

{body}

End of Project Gutenberg Etext of Hamlet
"""
NEW_STYLE = """The Project Gutenberg EBook of Macbeth
This eBook is for the use of anyone anywhere at no cost.
*** START OF THIS PROJECT GUTENBERG EBOOK MACBETH ***
{body}
*** END OF THIS PROJECT GUTENBERG EBOOK MACBETH ***
***** This file should be named 1533.txt *****
Section 1. General Terms of Use and Redistributing Project Gutenberg-tm
"""


@pytest.mark.parametrize("template", [OLD_STYLE, NEW_STYLE])
def test_strip_gutenberg(template):
    body = "ACT I.\n\nScene I. A desert place.\n\n  Thunder and lightning.\nFirst Witch.\nWhen shall we three meet again"
    assert strip_gutenberg(template.format(body=body)) == body
    assert strip_gutenberg(body) == body  # clean text is left alone


# --- local files ---------------------------------------------------------------------------


def test_txt_paragraphs(tmp_path):
    paras = [f"Para {i} first line\n  indented second line {i}" for i in range(40)]
    f = tmp_path / "book.txt"
    f.write_text("\n\n".join(paras[:20]) + "\n\n\n \n" + "\n\n".join(paras[20:]) + "\n")
    train, val = both(str(f))
    check_split(train, val, paras)
    assert (train, val) == both(str(f))


def test_jsonl_json_parquet(tmp_path):
    recs = [{"text": t, "id": i} for i, t in enumerate(TEXTS)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    (tmp_path / "b.json").write_text(json.dumps(recs))
    (tmp_path / "c.json").write_text("\n".join(json.dumps(r) for r in recs))  # JSON Lines named .json
    for name in ("a.jsonl", "b.json", "c.json"):
        check_split(*both(str(tmp_path / name)), TEXTS)
    body = [{"body": t} for t in TEXTS]
    (tmp_path / "e.jsonl").write_text("\n".join(json.dumps(r) for r in body))
    check_split(*both(str(tmp_path / "e.jsonl"), text_field="body"), TEXTS)
    write_parquet(tmp_path / "d.parquet", {"text": TEXTS, "id": list(range(60))})
    check_split(*both(str(tmp_path / "d.parquet")), TEXTS)


def test_parquet_without_pyarrow_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed: importing it fails
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match=r"d.parquet: reading parquet needs pyarrow: pip install pyarrow"):
        load_documents(str(tmp_path / "d.parquet"))


def test_hf_spec_without_datasets_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match=r"hf:owner/name needs the datasets package: pip install datasets"):
        load_documents("hf:owner/name")


def test_folder_sorted_and_mixed(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in TEXTS[20:40]))
    (tmp_path / "a.txt").write_text("\n\n".join(TEXTS[:20]))
    (tmp_path / "sub" / "c.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in TEXTS[40:]))
    (tmp_path / "README.md").write_text("not data")
    (tmp_path / ".hidden.txt").write_text("not data either")
    train, val = both(str(tmp_path))
    check_split(train, val, TEXTS)  # also checks the a.txt, b.jsonl, sub/c.jsonl order


def test_validation_gets_at_least_one_document(tmp_path):
    f = tmp_path / "two.txt"
    f.write_text("first paragraph\n\nsecond paragraph")
    train, val = both(str(f))
    assert len(train) == 1 and len(val) == 1 and train != val


# --- errors --------------------------------------------------------------------------------


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown split 'test'"):
        load_documents("shakespeare", "test")
    with pytest.raises(ValueError, match="does not exist"):
        load_documents(str(tmp_path / "nope.txt"))
    (tmp_path / "data.csv").write_text("text\nhello\n")
    with pytest.raises(ValueError, match="unknown extension '.csv'"):
        load_documents(str(tmp_path / "data.csv"))
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="no text"):
        load_documents(str(tmp_path / "empty.txt"))
    (tmp_path / "one.txt").write_text("a single paragraph")
    with pytest.raises(ValueError, match="nothing can be held out"):
        load_documents(str(tmp_path / "one.txt"), "validation")
    (tmp_path / "f.jsonl").write_text('{"text": "ok"}\n{"content": "x", "id": 3}\n')
    with pytest.raises(ValueError, match=r"f.jsonl:2 has no text field 'text'; fields present: 'content', 'id'"):
        load_documents(str(tmp_path / "f.jsonl"))
    (tmp_path / "g.jsonl").write_text('{"text": "ok"}\n{"text": 5}\n')
    with pytest.raises(ValueError, match=r"g.jsonl:2: field 'text' is a int"):
        load_documents(str(tmp_path / "g.jsonl"))
    (tmp_path / "h.json").write_text('{"text": "an object, not a list"}')
    with pytest.raises(ValueError, match="expected a list of objects"):
        load_documents(str(tmp_path / "h.json"))
    (tmp_path / "i.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(ValueError, match=r"i.jsonl:2 is not valid JSON"):
        load_documents(str(tmp_path / "i.jsonl"))
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.md").write_text("x")
    with pytest.raises(ValueError, match="has no .txt, .jsonl, .json, .parquet files"):
        load_documents(str(tmp_path / "folder"))
    write_parquet(tmp_path / "j.parquet", {"body": ["a", "b"]})
    with pytest.raises(ValueError, match="no text field 'text'; fields present: 'body'"):
        load_documents(str(tmp_path / "j.parquet"))


# --- hf: -----------------------------------------------------------------------------------


def test_parse_hf_spec():
    assert parse_hf_spec("hf:HuggingFaceFW/fineweb-edu") == ("HuggingFaceFW/fineweb-edu", None)
    assert parse_hf_spec("hf:Salesforce/wikitext:wikitext-2-raw-v1") == ("Salesforce/wikitext", "wikitext-2-raw-v1")
    for bad in ("hf:", "hf:a/b/c", "hf:owner/name:", "hf:two words", "hf:a/b:c:d"):
        with pytest.raises(ValueError, match="malformed Hugging Face spec"):
            parse_hf_spec(bad)


def test_hf_streaming_with_a_fake_loader(monkeypatch):
    datasets = pytest.importorskip("datasets", reason="hf: specs stream with the datasets package")

    calls = []

    def fake_load(name, config=None, split=None, streaming=False):
        calls.append((name, config, split, streaming))
        return iter([{"text": t, "url": "u"} for t in TEXTS])

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    train = list(corpus.iter_documents("hf:owner/name:cfg", "train"))
    val = list(corpus.iter_documents("hf:owner/name:cfg", "validation"))
    assert calls == [("owner/name", "cfg", "train", True)] * 2
    assert sorted(train + val) == sorted(TEXTS) and not set(train) & set(val)
    with pytest.raises(ValueError, match="has no text field 'content'; fields present: 'text', 'url'"):
        list(corpus.iter_documents("hf:owner/name", "train", text_field="content"))

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match="could not open Hugging Face dataset 'owner/name'.*no network"):
        load_documents("hf:owner/name")
