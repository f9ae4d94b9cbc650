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
