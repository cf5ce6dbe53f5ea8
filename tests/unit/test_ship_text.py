"""Tokenizer-style preprocessing as data: the rules, export recording a tokenizer (tokenizer.json) and checking
the bundle's tokenization against the training tokenizer on raw texts, serve taking {"raw": {"text": ...}} at two
sequence lengths, a declared plain vocabulary, and the one-sentence refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from fixtures import text_model, text_tokenizer
from torchscalpel.errors import UsageError
from torchscalpel.serve.app import ServeConfig, create_app
from torchscalpel.serve.backends import load_runner
from torchscalpel.ship.bundle import MANIFEST, hash_files, verify_bundle
from torchscalpel.ship.export import ExportOptions, export_bundle
from torchscalpel.ship.textprep import (
    TextPreprocessor,
    VocabTokenizer,
    check_text_spec,
    pad,
    training_tokens,
)

pytest.importorskip("tokenizers")

MODEL = Path(text_model.__file__)
TOK = Path(text_tokenizer.__file__)
JSON = {"content-type": "application/json"}
EXAMPLES = ["ids=int64[1,16]:0..100", "mask=float32[1,16]"]


def _vocab_rules(**kw):
    rules = {
        "type": "vocab",
        "file": "vocab.txt",
        "lowercase": True,
        "split": "wordpiece",
        "unk": "[UNK]",
        "continuation": "##",
        "bos": "[CLS]",
        "eos": "[SEP]",
    }
    rules.update(kw)
    return rules


def test_vocab_rules_match_the_wordpiece_tokenizer():
    """The plain rules (lowercase, punctuation split, greedy wordpiece, [CLS]/[SEP], truncation) give the ids the
    tokenizers library gives for the same vocabulary."""
    tok = VocabTokenizer(_vocab_rules(), dict(text_tokenizer.VOCAB))
    hf = text_tokenizer.build(max_length=8)
    for text in [
        "Tokenizers split words!",
        "the QUICK brown fox, jumps",
        "zzz seen",
        "a b c d e f g h i j k",
    ]:
        assert tok.encode(text, 8) == hf.encode(text).ids, text
    assert tok.encode("tokenizers", 8)[1:-1] == [
        text_tokenizer.VOCAB["token"],
        text_tokenizer.VOCAB["##izers"],
    ]
    plain = VocabTokenizer(_vocab_rules(split="whitespace", bos=None, eos=None), dict(text_tokenizer.VOCAB))
    assert plain.encode("The dog!", 8) == [text_tokenizer.VOCAB["the"], text_tokenizer.VOCAB["[UNK]"]]
    with pytest.raises(UsageError, match="has no '\\[BOS\\]' token"):
        VocabTokenizer(_vocab_rules(bos="[BOS]"), dict(text_tokenizer.VOCAB))


def test_padding_longest_and_max_length():
    spec = {"max_length": 6, "padding": "longest", "pad_id": 0}
    ids, mask = pad([[5, 6, 7], [8]], spec)
    assert ids.tolist() == [[5, 6, 7], [8, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    ids, mask = pad([[5, 6, 7], [8]], {**spec, "padding": "max_length", "pad_id": 9})
    assert ids.shape == (2, 6) and ids[1].tolist() == [8, 9, 9, 9, 9, 9] and mask.sum() == 4


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"padding": "left"}, "padding must be one of"),
        ({"max_length": 0}, "max_length must be"),
        ({"mask": "ids"}, "'mask' must name another model input"),
        ({"mask": "nope"}, "'mask' 'nope' is not a model input"),
        ({"tokenizer": {"type": "hf", "file": "../x.json"}}, "plain file name"),
        ({"tokenizer": {"type": "spm"}}, "type 'hf' or 'vocab'"),
        ({"tokenizer": _vocab_rules(split="bpe")}, "split must be one of"),
        ({"extra": 1}, "unknown keys extra"),
    ],
)
def test_text_spec_refusals(change, words):
    spec = {"kind": "text", "input": "ids", "mask": "mask", "tokenizer": {"type": "hf"}, "max_length": 8}
    with pytest.raises(UsageError, match=words):
        check_text_spec({**spec, **change}, ["ids", "mask"])


@pytest.fixture(scope="module")
def text_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("text") / "bundle"
    opts = ExportOptions(
        model=f"{MODEL}:make",
        examples=EXAMPLES,
        formats=("onnx",),
        dynamic="batch,seq:32",
        max_batch=8,
        out=out,
        transform=f"ids={TOK}:make_tokenizer",
    )
    logs: list[str] = []
    return export_bundle(opts, log=logs.append), logs


def test_export_records_the_tokenizer_and_checks_it(text_bundle):
    result, logs = text_bundle
    m = result.manifest
    assert result.passed, [c for c in m["parity"]["checks"] if not c["passed"]]
    pre = m["preprocessing"]
    assert pre["kind"] == "text" and pre["input"] == "ids" and pre["mask"] == "mask"
    assert pre["tokenizer"] == {"type": "hf", "file": "tokenizer.json"}
    assert (
        pre["padding"] == "longest" and pre["max_length"] == 24
    )  # the tokenizer's own truncation, within 32
    assert m["artifacts"]["tokenizer"] == "tokenizer.json" and "tokenizer.json" in m["files"]
    summary = m["preprocessing_parity"]
    assert summary["reference"] == "the training tokenizer" and summary["tokens_equal"] is True
    assert max(summary["lengths"]) == 24  # one parity text is longer than max_length: truncated
    pre_checks = [c for c in m["parity"]["checks"] if c["format"] == "onnx+pre"]
    assert pre_checks and all(c["passed"] for c in pre_checks)
    assert any("raw text(s) through the training tokenizer" in line for line in logs)


def test_served_texts_equal_the_training_tokenizer_at_two_lengths(text_bundle):
    result, _ = text_bundle
    b = verify_bundle(result.path)
    app = create_app(b, load_runner(b, "onnxruntime"), ServeConfig(max_batch=8, max_wait_ms=1))
    model = text_model.make().eval()
    with TestClient(app) as client:
        for texts in (
            ["hello world"],
            ["the quick brown fox jumps over the lazy dog", "a cat sat on the mat !"],
        ):
            enc = training_tokens(text_tokenizer.TOKENIZER, b.manifest["preprocessing"], texts)
            with torch.inference_mode():
                want = model(torch.from_numpy(enc["ids"]), torch.from_numpy(enc["mask"]).float())
            r = client.post("/v1/predict", content=json.dumps({"raw": {"text": texts}}), headers=JSON)
            assert r.status_code == 200, r.text
            out = r.json()["outputs"]
            np.testing.assert_allclose(np.asarray(out["output_0"]), want[0].numpy(), rtol=1e-4, atol=1e-5)
            assert np.asarray(out["output_1"]).shape[1] == enc["ids"].shape[1]  # this request's length
        one = client.post("/v1/predict", content=json.dumps({"raw": {"text": "hello"}}), headers=JSON)
        assert one.status_code == 200 and np.asarray(one.json()["outputs"]["output_1"]).shape[:2] == (1, 3)
        for body, words in [
            ({"raw": {"text": [3]}}, "'text' sample 0 must be a string"),
            ({"raw": {"ids": ["x"]}}, "takes only 'text'"),
            ({"raw": {"text": []}}, "non-empty JSON array of strings"),
            ({"raw": {"text": ["x " * 1000]}}, "characters; the most is"),
        ]:
            r = client.post("/v1/predict", content=json.dumps(body), headers=JSON)
            assert r.status_code == 422 and words in r.text, (body, r.text)


def test_fixed_length_pads_to_the_example(tmp_path):
    result = export_bundle(
        ExportOptions(
            model=f"{MODEL}:make",
            examples=EXAMPLES,
            formats=("onnx",),
            max_batch=4,
            out=tmp_path / "b",
            transform=f"ids={TOK}:make_fixed",
        ),
        log=lambda _: None,
    )
    assert result.passed
    pre = result.manifest["preprocessing"]
    assert pre["padding"] == "max_length" and pre["max_length"] == 16
    served = TextPreprocessor(pre, result.path).apply_batch(["hello"])
    assert served["ids"].shape == (1, 16) and served["mask"].sum() == 3


def test_declared_vocabulary_travels_and_serves(tmp_path):
    vocab = tmp_path / "words.txt"
    text_tokenizer.write_vocab(vocab)
    spec = {
        "kind": "text",
        "input": "ids",
        "mask": "mask",
        "tokenizer": {**_vocab_rules(), "file": str(vocab)},
        "max_length": 20,
        "padding": "longest",
    }
    result = export_bundle(
        ExportOptions(
            model=f"{MODEL}:make",
            examples=EXAMPLES,
            formats=("onnx",),
            dynamic="batch,seq:32",
            max_batch=4,
            out=tmp_path / "b",
            preprocess=spec,
        ),
        log=lambda _: None,
    )
    assert result.passed
    m = result.manifest
    assert (
        m["preprocessing"]["tokenizer"]["file"] == "vocab.txt" and m["artifacts"]["tokenizer"] == "vocab.txt"
    )
    assert (result.path / "vocab.txt").read_text(encoding="utf-8") == vocab.read_text(encoding="utf-8")
    assert m["preprocessing_parity"]["reference"].startswith("the declared tokenizer")
    b = verify_bundle(result.path)
    app = create_app(b, load_runner(b, "onnxruntime"), ServeConfig(max_batch=4, max_wait_ms=1))
    with TestClient(app) as client:
        r = client.post("/v1/predict", content=json.dumps({"raw": {"text": ["Hello, world!"]}}), headers=JSON)
        assert r.status_code == 200, r.text
        assert np.asarray(r.json()["outputs"]["output_1"]).shape[1] == 6  # [CLS] hello , world ! [SEP]


def test_a_declared_length_beyond_the_axis_is_refused(tmp_path):
    vocab = tmp_path / "words.txt"
    text_tokenizer.write_vocab(vocab)
    spec = {
        "kind": "text",
        "input": "ids",
        "tokenizer": {**_vocab_rules(), "file": str(vocab)},
        "max_length": 40,
    }
    with pytest.raises(UsageError, match="max_length 40 is beyond the seq axis's bound 32"):
        export_bundle(
            ExportOptions(
                model=f"{MODEL}:make",
                examples=EXAMPLES,
                formats=("onnx",),
                dynamic="batch,seq:32",
                out=tmp_path / "b",
                preprocess=spec,
            ),
            log=lambda _: None,
        )


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("tokenize", "is a Python function that takes the input; it cannot be recorded as data"),
        ("CUSTOM", r"The transform Custom \(step 0 of the chain\) is not a transform torchscalpel knows"),
        ("TOKENIZER", "names an object that is not callable .* zero-argument function that returns it"),
    ],
)
def test_a_tokenizer_that_is_code_is_refused_in_one_sentence(tmp_path, name, words):
    with pytest.raises(UsageError, match=words) as info:
        export_bundle(
            ExportOptions(
                model=f"{MODEL}:make",
                examples=EXAMPLES,
                formats=("onnx",),
                out=tmp_path / "b",
                transform=f"ids={TOK}:{name}",
            ),
            log=lambda _: None,
        )
    assert "\n" not in str(info.value)
    assert not (tmp_path / "b").exists()  # refused before anything was written


def test_a_manifest_whose_tokenizer_is_not_hashed_is_refused(text_bundle, tmp_path):
    result, _ = text_bundle
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(result.path, copy)
    m = json.loads((copy / MANIFEST).read_text())
    del m["artifacts"]["tokenizer"]
    m["files"] = hash_files(copy)
    (copy / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(UsageError, match=r"tokenizer file 'tokenizer\.json' is not a hashed artifact"):
        verify_bundle(copy)


def test_a_transformers_fast_tokenizer_travels_as_its_tokenizer_json(tmp_path):
    """The wrapper's backend is written down; the training side is the wrapper called as a training script calls
    it (padding, truncation, max_length); the bundle's file gives the same ids and mask."""
    transformers = pytest.importorskip("transformers")
    from torchscalpel.ship.textprep import looks_like_tokenizer, recognise_tokenizer

    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=text_tokenizer.build(max_length=None), pad_token="[PAD]", unk_token="[UNK]"
    )
    fast.model_max_length = 12
    assert looks_like_tokenizer(fast) and not looks_like_tokenizer(text_tokenizer.CUSTOM)
    spec, files, limit = recognise_tokenizer(
        fast, source="train.py:TOK", input_name="ids", mask="mask", seq=32, dynamic_seq=True
    )
    assert limit == 12 and spec["max_length"] == 12 and spec["pad_id"] == 0
    assert spec["source"] == f"{type(fast).__name__} from train.py:TOK"
    (tmp_path / "tokenizer.json").write_bytes(files["tokenizer.json"])
    texts = ["hello world", "the quick brown fox jumps over the lazy dog and the cat sat on the mat", "x"]
    want = training_tokens(fast, spec, texts)
    got = TextPreprocessor(spec, tmp_path).apply_batch(texts)
    for key in ("ids", "mask"):
        np.testing.assert_array_equal(got[key], want[key])
    assert got["ids"].shape == (3, 12)  # the long text truncated at the tokenizer's own limit


def test_any_raw_text_body_is_ids_or_a_422(text_bundle, tmp_path):
    """Arbitrary JSON under "raw" (unicode of every category, nesting, numbers) through both tokenizers: the
    answer is arrays within the vocabulary and the bundle's bounds, or a RequestError (422), never another error."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from torchscalpel.serve.codec import InputSpec, decode_json
    from torchscalpel.serve.errors import RequestError
    from torchscalpel.ship.bundle import axis_bounds

    result, _ = text_bundle
    b = verify_bundle(result.path)
    specs = [InputSpec.from_manifest(s, axis_bounds(b.manifest)) for s in b.inputs]
    text_tokenizer.write_vocab(tmp_path / "vocab.txt")
    vocab_spec = {**b.manifest["preprocessing"], "tokenizer": _vocab_rules()}
    pres = [TextPreprocessor(b.manifest["preprocessing"], b.path), TextPreprocessor(vocab_spec, tmp_path)]
    leaf = st.one_of(st.text(max_size=80), st.integers(), st.none(), st.floats(allow_nan=True))
    raw = st.one_of(
        st.lists(st.text(max_size=200), min_size=0, max_size=10),
        st.text(max_size=200),
        st.lists(leaf, max_size=4),
        leaf,
    )

    @settings(
        max_examples=60,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(raw, st.sampled_from(["text", "ids"]))
    def check(value, key):
        body = json.dumps({"raw": {key: value}}).encode()
        for pre in pres:
            try:
                ids, mask = decode_json(body, specs, 8, pre)
            except RequestError as exc:
                assert exc.status == 422 and "\n" not in exc.reason
                continue
            assert ids.dtype == np.int64 and 1 <= ids.shape[1] <= 24 and ids.max() < len(text_tokenizer.WORDS)
            assert mask.shape == ids.shape and set(np.unique(mask)) <= {0.0, 1.0}

    check()
