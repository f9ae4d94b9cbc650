import random

from conftest import make_story

from mvgpt.tokenizer import EOT, Tokenizer, file_hash, train_tokenizer

TEXTS = [
    "Héllo, wörld! Ça va? naïve café",
    "emoji 🤖🪁 and 日本語 text",
    "bare\nnewlines\n\n\nand\ttabs  and   spaces ",
    "\n",
    "",
    "x" * 500,
]


def trained(vocab_size: int = 300) -> Tokenizer:
    rng = random.Random(0)
    return train_tokenizer([make_story(rng) for _ in range(200)], vocab_size)


def test_round_trip_on_arbitrary_text():
    tok = trained()
    for text in TEXTS + [make_story(random.Random(5))]:
        assert tok.decode(tok.encode(text)) == text
    rng = random.Random(1)
    for _ in range(50):  # random unicode, including characters never seen in training
        text = "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(128, 0x2FFF), 10])) for _ in range(40))
        assert tok.decode(tok.encode(text)) == text


def test_vocab_and_endoftext_is_one_token():
    tok = trained(300)
    assert tok.vocab_size == 300 and tok.eot == 299
    ids = tok.encode(f"a story{EOT}another")
    assert ids.count(tok.eot) == 1
    assert tok.encode(EOT) == [tok.eot]
    assert max(tok.encode("Lily saw a red ball.")) < tok.eot  # ordinary text never makes it


def test_batch_encoding_equals_one_at_a_time():
    tok = trained()
    texts = [make_story(random.Random(i)) for i in range(20)]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]


def test_save_load_keeps_encoding_and_hash(tmp_path):
    tok = trained()
    tok.save(tmp_path / "tokenizer.json")
    again = Tokenizer.load(tmp_path / "tokenizer.json")
    assert again.hash == tok.hash == file_hash(tmp_path / "tokenizer.json")
    for text in TEXTS:
        assert again.encode(text) == tok.encode(text)
    assert trained(301).hash != tok.hash


def test_stream_holds_a_split_character_until_it_is_whole():
    tok = trained()
    kite = "🪁".encode()  # 4 bytes, one token each here: the single-byte tokens
    ids = [tok.ranks[bytes([b])] for b in kite]
    stream = tok.stream()
    assert [stream.add(i) for i in ids] == ["", "", "", "🪁"]
    assert stream.flush() == ""
    stream = tok.stream()  # a character cut short by the end of the story: U+FFFD, as decode() shows
    assert [stream.add(i) for i in ids[:2]] == ["", ""] and stream.flush() == "\ufffd"


def test_stream_goes_on_after_bytes_that_make_no_character():
    tok = trained()
    stray = tok.ranks[bytes([0x80])]  # a continuation byte on its own: never valid UTF-8
    stream = tok.stream()
    got = [stream.add(i) for i in [stray, *tok.encode("Lily saw a café")]]
    assert "".join(got) == "\ufffdLily saw a café" and got[0] == "\ufffd"
    assert stream.flush() == ""


def test_stream_pieces_join_to_decode_for_any_ids():
    tok = trained()
    rng = random.Random(2)
    for _ in range(200):  # random ids: split characters, stray bytes, the special token
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(0, 30))]
        stream = tok.stream()
        assert "".join(stream.add(i) for i in ids) + stream.flush() == tok.decode(ids)
    text = "Zoë flew a kite 🪁 at the café, 日本語."
    stream = tok.stream()
    pieces = [stream.add(i) for i in tok.encode(text)]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in p for p in pieces)  # nothing shown before it is whole
