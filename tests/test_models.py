from __future__ import annotations

import pytest
import torch

from hf_optbench.errors import OptBenchError
from hf_optbench.models import GPT2_SIZES, build_model, count_parameters, padded_vocab_size, resolve_size

# Published GPT-2 parameter counts with the 50,257-token English vocab (HF `gpt2*` configs, n_positions 1024).
PUBLISHED = {"gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200}


def _count_from_shape(size: str, vocab: int, n_positions: int = 1024) -> int:
    from hf_optbench.models import non_embedding_params

    d = GPT2_SIZES[size]["n_embd"]
    return vocab * d + n_positions * d + non_embedding_params(size)


@pytest.mark.parametrize("size", sorted(PUBLISHED))
def test_size_table_matches_published_gpt2_counts(size: str) -> None:
    assert _count_from_shape(size, 50_257) == PUBLISHED[size]


def test_tiny_is_cpu_friendly_and_sizes_grow() -> None:
    counts = [_count_from_shape(s, 4096, 128) for s in ("tiny", "mini", "midi")]
    assert counts[0] < 2_000_000
    assert counts[0] < counts[1] < counts[2]


def test_aliases_and_unknown_size() -> None:
    assert resolve_size("gpt2-base") == "gpt2"
    assert resolve_size("GPT2-Medium") == "gpt2-medium"
    with pytest.raises(OptBenchError, match="gpt2-large"):
        resolve_size("gpt2-lrge")


def test_build_model_resizes_and_ties_embeddings() -> None:
    torch.manual_seed(0)
    model = build_model("tiny", 1000, n_positions=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    emb = model.get_input_embeddings()
    assert emb.num_embeddings == padded_vocab_size(1000, 64) == 1024
    assert model.get_output_embeddings().weight.data_ptr() == emb.weight.data_ptr()
    assert model.config.eos_token_id == 2 and model.config.bos_token_id == 1 and model.config.pad_token_id == 0
    assert model.config.use_cache is False
    assert model.config._attn_implementation == "sdpa"
    assert count_parameters(model) == _count_from_shape("tiny", 1024, 64)
    assert count_parameters(model, exclude_embeddings=True) == _count_from_shape("tiny", 1024, 64) - 1024 * 64 - 64 * 64
    x = torch.randint(0, 1000, (2, 16))
    out = model(input_ids=x, labels=x)
    assert out.logits.shape == (2, 16, 1024) and torch.isfinite(out.loss)


def test_thai_tokenizer_length_pads_to_nanogpt_width() -> None:
    # flax-community/gpt2-base-thai's tokenizer: vocab 50,265 + <|endoftext|> = len 50,266 -> 50,304 rows.
    assert padded_vocab_size(50_266, 64) == 50_304


def test_eager_and_sdpa_agree() -> None:
    torch.manual_seed(0)
    a = build_model("tiny", 256, n_positions=32, attn_implementation="sdpa")
    b = build_model("tiny", 256, n_positions=32, attn_implementation="eager")
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 256, (2, 32))
    torch.testing.assert_close(a(input_ids=x).logits, b(input_ids=x).logits, rtol=1e-4, atol=1e-4)


def test_bad_attention_and_vocab() -> None:
    with pytest.raises(OptBenchError, match="attn_implementation"):
        build_model("tiny", 100, attn_implementation="flash")
    with pytest.raises(OptBenchError, match="vocab_size"):
        build_model("tiny", 0)


def test_init_from_local_checkpoint(tmp_path) -> None:
    torch.manual_seed(0)
    src = build_model("tiny", 256, n_positions=32)
    src.save_pretrained(tmp_path / "ckpt")
    loaded = build_model("tiny", 256, n_positions=32, init_from=str(tmp_path / "ckpt"))
    for (n, p), (_, q) in zip(src.named_parameters(), loaded.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    with pytest.raises(OptBenchError, match="init_from"):
        build_model("tiny", 256, init_from=str(tmp_path / "missing"))


def test_trainer_loss_equals_the_models_own_loss(tmp_path) -> None:
    """Regression: without loss_type the Trainer normalised by T labels instead of T-1 predictions."""
    from transformers import Trainer, TrainingArguments

    torch.manual_seed(0)
    model = build_model("tiny", 128, n_positions=16)
    ids = torch.randint(0, 128, (8, 16))
    data = [{"input_ids": row, "labels": row} for row in ids]
    with torch.no_grad():
        own = model(input_ids=ids, labels=ids).loss.item()
    args = TrainingArguments(str(tmp_path), per_device_eval_batch_size=8, use_cpu=True, report_to="none")
    reported = Trainer(model=model, args=args, eval_dataset=data).evaluate()["eval_loss"]
    assert reported == pytest.approx(own, rel=1e-6)


@pytest.mark.parametrize("size", ["tiny", "mini", "midi"])
def test_non_embedding_params_from_the_shape_equal_the_built_models_count(size: str) -> None:
    from hf_optbench.models import build_model, count_parameters, non_embedding_params

    model = build_model(size, 300, n_positions=64)
    assert non_embedding_params(size) == count_parameters(model, exclude_embeddings=True)
    assert non_embedding_params(size) < count_parameters(model)
