"""Tokenizer-style preprocessing as data: the bundle carries the tokenizer as files and rules, never code.

A text spec (``manifest["preprocessing"]`` with ``"kind": "text"``)::

    {"kind": "text", "input": "input_ids", "mask": "attention_mask" | null,
     "tokenizer": {"type": "hf", "file": "tokenizer.json"}
                | {"type": "vocab", "file": "vocab.txt", "lowercase": true, "split": "wordpiece",
                   "unk": "[UNK]", "continuation": "##", "bos": "[CLS]" | null, "eos": "[SEP]" | null},
     "max_length": 128, "padding": "longest" | "max_length", "pad_id": 0,
     "source": "Tokenizer from train.py:TOKENIZER"}

``hf`` is a Hugging Face ``tokenizer.json`` (the ``tokenizers`` library reads it: a JSON document of
vocabulary, normaliser, pre-tokeniser and post-processor, no code). ``vocab`` is a plain vocabulary
(one token per line, the line number its id) with rules: lowercase, ``whitespace`` split or
``wordpiece`` (whitespace and punctuation split, then greedy longest match with the continuation
prefix, ``unk`` for a word with no match), optional ``bos``/``eos`` tokens around the sequence.

Either way the ids are truncated to ``max_length`` (special tokens included) and padded with
``pad_id`` to the longest sample of the request (``longest``, for a dynamic ``seq`` axis) or to
``max_length`` (a fixed one); ``mask`` names the model input fed 1 for tokens and 0 for padding.
Serve takes ``{"raw": {"text": ["...", ...]}}``.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import numpy as np

from torchscalpel.errors import UsageError
from torchscalpel.ship.preprocess import PreprocessError

KIND = "text"
PADDINGS = ("longest", "max_length")
SPLITS = ("whitespace", "wordpiece")
HF_FILE = "tokenizer.json"
VOCAB_FILE = "vocab.txt"
MAX_LENGTH = 1 << 20
MAX_CHARS_PER_TOKEN = 64
"""A raw text may hold at most ``max_length`` times this many characters: the work a request can ask for
is bounded before tokenising (truncation would throw the rest away anyway)."""
MAX_VOCAB = 2_000_000
MAX_WORD_CHARS = 100
"""A longer word is one ``unk`` (as BERT's wordpiece does): greedy matching is quadratic in its length."""
RAW_FIELD = "text"
"""The member of ``"raw"`` a text bundle reads."""


def is_text_spec(value: Any) -> bool:
    """True for a text spec (``"kind": "text"``)."""
    return isinstance(value, dict) and value.get("kind") == KIND


def _fail(what: str) -> UsageError:
    return UsageError(f"text preprocessing: {what}; re-export, or fix the --preprocess JSON.")


def _plain_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or "/" in value or "\\" in value or value in (".", ".."):
        raise _fail(f"{what} must be a plain file name inside the bundle")
    return value


def _token(value: Any, what: str, *, optional: bool) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= 64:
        raise _fail(f"{what} must be a token of 1 to 64 characters" + (" or null" if optional else ""))
    return value


def check_tokenizer(tok: Any) -> dict[str, Any]:
    """The ``tokenizer`` member, checked and normalised (unknown keys refused)."""
    if not isinstance(tok, dict) or tok.get("type") not in ("hf", "vocab"):
        raise _fail("'tokenizer' must be an object with type 'hf' or 'vocab'")
    if tok["type"] == "hf":
        if set(tok) - {"type", "file"}:
            raise _fail("an hf tokenizer takes only 'file'")
        return {"type": "hf", "file": _plain_name(tok.get("file", HF_FILE), "the tokenizer file")}
    allowed = {"type", "file", "lowercase", "split", "unk", "continuation", "bos", "eos"}
    if set(tok) - allowed:
        raise _fail(f"a vocab tokenizer takes no {', '.join(sorted(map(str, set(tok) - allowed)))[:80]}")
    if not isinstance(tok.get("lowercase", True), bool):
        raise _fail("lowercase is true or false")
    if tok.get("split", "wordpiece") not in SPLITS:
        raise _fail(f"split must be one of {', '.join(SPLITS)}")
    return {
        "type": "vocab",
        "file": _plain_name(tok.get("file", VOCAB_FILE), "the vocabulary file"),
        "lowercase": tok.get("lowercase", True),
        "split": tok.get("split", "wordpiece"),
        "unk": _token(tok.get("unk", "[UNK]"), "unk", optional=False),
        "continuation": _token(tok.get("continuation", "##"), "continuation", optional=False),
        "bos": _token(tok.get("bos"), "bos", optional=True),
        "eos": _token(tok.get("eos"), "eos", optional=True),
    }


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_text_spec(spec: Any, input_names: list[str] | None = None) -> dict[str, Any]:
    """A text spec checked and normalised; raises :class:`UsageError` (one sentence) naming the first problem."""
    if not is_text_spec(spec):
        raise _fail('the spec must be a JSON object with "kind": "text"')
    extra = set(spec) - {"kind", "input", "mask", "tokenizer", "max_length", "padding", "pad_id", "source"}
    if extra:
        raise _fail(f"the spec has unknown keys {', '.join(sorted(map(str, extra)))[:80]}")
    tokenizer = check_tokenizer(spec.get("tokenizer"))
    if not _whole(spec.get("max_length"), 1, MAX_LENGTH):
        raise _fail(f"max_length must be a whole number from 1 to {MAX_LENGTH}")
    padding = spec.get("padding", "longest")
    if padding not in PADDINGS:
        raise _fail(f"padding must be one of {', '.join(PADDINGS)}")
    pad_id = spec.get("pad_id", 0)
    if not _whole(pad_id, 0, MAX_VOCAB):
        raise _fail(f"pad_id must be a whole number from 0 to {MAX_VOCAB}")
    name, mask = spec.get("input"), spec.get("mask")
    if name is not None and not isinstance(name, str):
        raise _fail("'input' must be the name of a model input")
    if mask is not None and (not isinstance(mask, str) or mask == name):
        raise _fail("'mask' must name another model input, or be null")
    if input_names is not None:
        name = name if name is not None else input_names[0]
        for label, value in (("input", name), ("mask", mask)):
            if value is not None and value not in input_names:
                raise _fail(f"'{label}' {value[:60]!r} is not a model input ({', '.join(input_names)})")
    out: dict[str, Any] = {
        "kind": KIND,
        "input": name,
        "mask": mask,
        "tokenizer": tokenizer,
        "max_length": spec["max_length"],
        "padding": padding,
        "pad_id": pad_id,
    }
    if spec.get("source") is not None:
        out["source"] = str(spec["source"])[:300]
    return out


def read_vocab(path: Path) -> dict[str, int]:
    """A plain vocabulary file (one token per line, its line number the id); one sentence when it is not one."""
    try:
        with path.open(encoding="utf-8") as fh:
            tokens = [
                line.rstrip("\n").rstrip("\r") for _, line in zip(range(MAX_VOCAB + 1), fh, strict=False)
            ]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"Cannot read the vocabulary {path} as UTF-8 text ({exc}).") from None
    if not tokens or len(tokens) > MAX_VOCAB:
        raise UsageError(f"The vocabulary {path} must hold 1 to {MAX_VOCAB} tokens, one per line.")
    vocab: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)
    return vocab


def _is_punct(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


class VocabTokenizer:
    """The plain ``vocab`` rules, in pure Python (serving them loads nothing else)."""

    def __init__(self, rules: dict[str, Any], vocab: dict[str, int]) -> None:
        self.rules = rules
        self.vocab = vocab
        missing = [
            rules[k] for k in ("unk", "bos", "eos") if rules.get(k) is not None and rules[k] not in vocab
        ]
        if missing:
            raise UsageError(
                f"text preprocessing: the vocabulary has no {', '.join(map(repr, missing))} token."
            )
        self.unk = vocab[rules["unk"]]

    def _words(self, text: str) -> list[str]:
        if self.rules["lowercase"]:
            text = text.lower()
        if self.rules["split"] == "whitespace":
            return text.split()
        words: list[str] = []
        for chunk in text.split():
            word = ""
            for ch in chunk:
                if _is_punct(ch):
                    if word:
                        words.append(word)
                    words.append(ch)
                    word = ""
                else:
                    word += ch
            if word:
                words.append(word)
        return words

    def _pieces(self, word: str) -> list[int]:
        if self.rules["split"] == "whitespace":
            return [self.vocab.get(word, self.unk)]
        if len(word) > MAX_WORD_CHARS:
            return [self.unk]
        out: list[int] = []
        start, prefix = 0, self.rules["continuation"]
        while start < len(word):
            end, found = len(word), None
            while start < end:
                piece = word[start:end] if start == 0 else prefix + word[start:end]
                if piece in self.vocab:
                    found = self.vocab[piece]
                    break
                end -= 1
            if found is None:
                return [self.unk]
            out.append(found)
            start = end
        return out

    def encode(self, text: str, max_length: int) -> list[int]:
        """Ids of one text, special tokens included, truncated to ``max_length``."""
        bos, eos = self.rules["bos"], self.rules["eos"]
        room = max_length - (bos is not None) - (eos is not None)
        ids: list[int] = []
        for word in self._words(text):
            ids.extend(self._pieces(word))
            if len(ids) >= room:
                break
        ids = ids[: max(room, 0)]
        return (
            ([self.vocab[bos]] if bos is not None else [])
            + ids
            + ([self.vocab[eos]] if eos is not None else [])
        )


def load_hf(path: Path, max_length: int) -> Any:
    """A ``tokenizers.Tokenizer`` from a tokenizer.json (data), truncating at ``max_length`` and padding nothing
    (the spec pads); one sentence when the library is missing or the file is not a tokenizer."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError(
            "This bundle's text preprocessing is a tokenizer.json, which needs the tokenizers library; run "
            "'pip install tokenizers'."
        ) from None
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises its own Exception type for every parse error
        raise UsageError(
            f"Cannot read {path.name} as a tokenizer.json ({str(exc)[:160]}); re-export the bundle."
        ) from None
    tok.no_padding()
    tok.enable_truncation(max_length)
    return tok


def pad(ids: list[list[int]], spec: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged ids -> (ids, mask) of one width: the longest sample's, or ``max_length``."""
    width = spec["max_length"] if spec["padding"] == "max_length" else max([1, *(len(i) for i in ids)])
    out = np.full((len(ids), width), spec["pad_id"], dtype=np.int64)
    mask = np.zeros((len(ids), width), dtype=np.int64)
    for row, seq in enumerate(ids):
        seq = seq[:width]
        out[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
    return out, mask


class TextPreprocessor:
    """Applies a checked text spec to raw strings; the tokenizer's files are read from the bundle folder."""

    def __init__(self, spec: dict[str, Any], folder: Path) -> None:
        self.spec = check_text_spec(spec)
        self.input: str | None = self.spec["input"]
        self.mask: str | None = self.spec["mask"]
        self.max_length: int = self.spec["max_length"]
        rules = self.spec["tokenizer"]
        path = folder / rules["file"]
        self._hf: Any = None
        self._vocab: VocabTokenizer | None = None
        if rules["type"] == "hf":
            self._hf = load_hf(path, self.max_length)
        else:
            self._vocab = VocabTokenizer(rules, read_vocab(path))

    @property
    def field(self) -> str:
        """The raw member clients send (for error messages)."""
        return RAW_FIELD

    @property
    def max_chars(self) -> int:
        """The longest raw text accepted."""
        return self.max_length * MAX_CHARS_PER_TOKEN

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (truncated, not padded)."""
        if self._hf is not None:
            return [list(e.ids) for e in self._hf.encode_batch(texts)]
        assert self._vocab is not None
        return [self._vocab.encode(t, self.max_length) for t in texts]

    def apply_batch(self, texts: list[Any]) -> dict[str, np.ndarray]:
        """Raw texts -> one array per model input this spec feeds (ids, and the mask when named)."""
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise PreprocessError(f"raw input {RAW_FIELD!r} sample {i} must be a string")
            if len(text) > self.max_chars:
                raise PreprocessError(
                    f"raw input {RAW_FIELD!r} sample {i} has {len(text)} characters; the most is {self.max_chars} "
                    f"({MAX_CHARS_PER_TOKEN} per token of max_length {self.max_length})"
                )
        ids, mask = pad(self.encode(texts), self.spec)
        out = {self.input or "input": ids}
        if self.mask is not None:
            out[self.mask] = mask
        return out


def looks_like_tokenizer(obj: Any) -> bool:
    """A ``tokenizers.Tokenizer`` or a transformers fast tokenizer (its ``backend_tokenizer`` is one)."""
    return _backend(obj) is not None


def _backend(obj: Any) -> Any:
    backend = getattr(obj, "backend_tokenizer", obj)
    return (
        backend if callable(getattr(backend, "to_str", None)) and hasattr(backend, "encode_batch") else None
    )


def recognise_tokenizer(
    obj: Any, *, source: str, input_name: str, mask: str | None, seq: int, dynamic_seq: bool
) -> tuple[dict[str, Any], dict[str, bytes], int | None]:
    """The text spec, the files it needs (``tokenizer.json``) and the tokenizer's own length limit (its
    truncation or ``model_max_length``; None when it sets none) for a tokenizer object, or one sentence.

    ``seq`` is the sequence length the export was given (fixed: the padding width; dynamic: the
    truncation until export knows the ``seq`` axis's bound, see :func:`bounded`).
    """
    backend = _backend(obj)
    if backend is None:
        raise UsageError(
            f"The tokenizer {type(obj).__name__} from {source} is not a tokenizers.Tokenizer or a fast "
            "transformers tokenizer; it cannot be recorded as data (tokenizers are never pickled): declare "
            'a vocabulary with --preprocess \'{"kind": "text", ...}\'.'
        )
    try:
        text = backend.to_str()
    except Exception as exc:  # the Rust side's own error type
        raise UsageError(
            f"The tokenizer from {source} cannot be written as tokenizer.json ({str(exc)[:160]})."
        ) from None
    trunc = getattr(backend, "truncation", None) or {}
    own = getattr(obj, "model_max_length", None) if obj is not backend else None
    limits = [trunc.get("max_length") if isinstance(trunc, dict) else None, own]
    found = [v for v in limits if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_LENGTH]
    limit = min(found) if found else None
    max_length = min(limit, seq) if dynamic_seq and limit else seq
    padding = getattr(backend, "padding", None) or {}
    pad_id = padding.get("pad_id") if isinstance(padding, dict) else None
    if not isinstance(pad_id, int):
        pad_id = getattr(obj, "pad_token_id", None)
    spec = {
        "kind": KIND,
        "input": input_name,
        "mask": mask,
        "tokenizer": {"type": "hf", "file": HF_FILE},
        "max_length": max_length,
        "padding": "longest" if dynamic_seq else "max_length",
        "pad_id": pad_id if isinstance(pad_id, int) and pad_id >= 0 else 0,
        "source": f"{type(obj).__name__} from {source}",
    }
    return check_text_spec(spec), {HF_FILE: text.encode("utf-8")}, limit


def bounded(spec: dict[str, Any], limit: int | None, seq_max: int) -> dict[str, Any]:
    """A dynamic-``seq`` spec truncating at the tokenizer's own limit within the axis's bound (else the bound)."""
    return check_text_spec({**spec, "max_length": min(limit, seq_max) if limit else seq_max})


def training_tokens(obj: Any, spec: dict[str, Any], texts: list[str]) -> dict[str, np.ndarray]:
    """The user's own tokenizer on the raw texts, as training called it (the parity reference).

    A transformers tokenizer is called as a training script calls it (``padding``, ``truncation``,
    ``max_length``); a ``tokenizers.Tokenizer`` runs ``encode_batch`` with its own settings, padded to
    the spec's width.
    """
    if obj is not _backend(obj):  # transformers: the call does the truncation and padding
        enc = obj(
            texts,
            padding=spec["padding"],
            truncation=True,
            max_length=spec["max_length"],
            return_tensors="np",
        )
        ids, mask = (
            np.asarray(enc["input_ids"], dtype=np.int64),
            np.asarray(enc["attention_mask"], dtype=np.int64),
        )
    else:
        ids, mask = pad([list(e.ids) for e in obj.encode_batch(texts)], spec)
    out = {spec["input"]: ids}
    if spec["mask"] is not None:
        out[spec["mask"]] = mask
    return out


_SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "A model served is only as good as the text it is given!",
    "hello, world",
    "Tokenizers split words; wordpieces split the rest.",
)


def raw_texts(spec: dict[str, Any], folder: Path, path: Path | None, seed: int, count: int = 8) -> list[str]:
    """Raw texts for the parity run: the lines of ``path`` (UTF-8, one sample per line), or sentences of
    plain English and of random vocabulary words, one of them longer than ``max_length`` tokens."""
    if path is not None:
        try:
            lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(
                f"Cannot read --raw-example {path} as UTF-8 text, one sample per line ({exc})."
            ) from None
        if not lines:
            raise UsageError(f"--raw-example {path} holds no text; give one sample per line.")
        return lines[:64]
    rules = spec["tokenizer"]
    words: list[str] = []
    if rules["type"] == "vocab":
        words = [w for w in read_vocab(folder / rules["file"]) if w.isalpha()]
    else:
        import json

        try:
            vocab = json.loads((folder / rules["file"]).read_text(encoding="utf-8"))["model"]["vocab"]
            items = vocab.keys() if isinstance(vocab, dict) else [v[0] for v in vocab if isinstance(v, list)]
            words = [w for w in items if isinstance(w, str) and w.isalpha()]
        except (OSError, ValueError, KeyError, TypeError):
            words = []
    rng = np.random.default_rng(seed)
    out = list(_SENTENCES)
    while len(out) < count:
        n = int(rng.integers(1, 12)) if len(out) < count - 1 else spec["max_length"] + 8
        picked = [words[int(i)] for i in rng.integers(0, len(words), n)] if words else ["word"] * n
        out.append(" ".join(picked))
    return out[:count]
