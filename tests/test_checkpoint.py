import logging
from dataclasses import asdict

import pytest
import torch
from conftest import tiny_model

from mvgpt.checkpoint import load_model, read_checkpoint, save_checkpoint


@pytest.mark.parametrize("rope", [False, True])
def test_round_trip_gives_identical_logits(tmp_path, rope):
    model = tiny_model(rope=rope)
    path = save_checkpoint(tmp_path / "run", model, step=7, tokenizer_hash="abc")
    assert path == tmp_path / "run" / "ckpt.pt"
    again, state = load_model(tmp_path / "run", tokenizer_hash="abc")
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    assert again(idx)[0].equal(model(idx)[0])
    assert state["step"] == 7 and again.config == model.config
    assert not list((tmp_path / "run").glob(".*tmp*"))


def test_old_config_without_rope_loads_with_its_table(tmp_path, caplog):
    model = tiny_model()
    config = asdict(model.config)
    del config["rope"], config["rope_theta"], config["rope_linear_factor"]
    torch.save({"model": model.state_dict(), "config": config}, tmp_path / "old.pt")
    with caplog.at_level(logging.WARNING):
        again, _ = load_model(tmp_path / "old.pt")
    assert not again.config.rope and hasattr(again, "wpe")
    assert "rope" in caplog.text  # the patch is logged
    idx = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0))
    assert again(idx)[0].equal(model(idx)[0])


def one_line_error(excinfo) -> str:
    message = str(excinfo.value.code)
    assert message.startswith("error:") and "\n" not in message
    return message


def test_missing_truncated_and_corrupt_checkpoints(tmp_path):
    with pytest.raises(SystemExit, match="no checkpoint at") as e:
        load_model(tmp_path / "nothing")
    one_line_error(e)
    path = save_checkpoint(tmp_path / "a.pt", tiny_model())
    data = path.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(SystemExit, match="truncated or corrupt") as e:
        load_model(tmp_path / "truncated.pt")
    one_line_error(e)
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint at all" * 10)
    with pytest.raises(SystemExit, match="truncated or corrupt") as e:
        load_model(tmp_path / "garbage.pt")
    one_line_error(e)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(SystemExit, match="not an mvGPT checkpoint"):
        load_model(tmp_path / "other.pt")


class Sneaky:  # a pickled object: loading it would run code, so weights_only refuses it
    pass


def test_pickled_code_is_never_loaded(tmp_path):
    torch.save({"model": {}, "config": {}, "payload": Sneaky()}, tmp_path / "evil.pt")
    with pytest.raises(SystemExit, match="truncated or corrupt"):
        read_checkpoint(tmp_path / "evil.pt")


def test_tokenizer_hash_mismatch_is_refused(tmp_path):
    save_checkpoint(tmp_path / "run", tiny_model(), tokenizer_hash="aaaa")
    with pytest.raises(SystemExit, match="trained with tokenizer aaaa, but data/ has bbbb") as e:
        load_model(tmp_path / "run", tokenizer_hash="bbbb")
    one_line_error(e)
