import threading

import pytest
import torch

from workers.rft import models


def test_tiny_build_is_deterministic_and_small(tmp_path):
    first, second = models.build_tiny_model(tmp_path / "a"), models.build_tiny_model(tmp_path / "b")
    for path in sorted(first.iterdir()):
        assert path.read_bytes() == (second / path.name).read_bytes(), path.name
    model = models.load_policy(first, torch.device("cpu"))
    assert model.config.model_type == "qwen2" and model.config.num_hidden_layers == 4
    assert 1_500_000 < sum(p.numel() for p in model.parameters()) < 3_500_000


def test_tiny_tokenizer_round_trips_through_auto_tokenizer(tiny_path, tokenizer):
    # AutoTokenizer re-imposes Qwen2's pre-tokenizer: ids only round-trip because we trained with it.
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(tiny_path / "tokenizer.json"))
    texts = ["What is 12 + 7? The answer is 19.", "Using the numbers [3, 5, 7]\n\n<answer>3*5+7</answer>", "héllo 😀"]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == raw.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids) == text
    assert tokenizer("7")["input_ids"] != tokenizer("77")["input_ids"]  # digits are single tokens


def test_tiny_tokenizer_has_chat_template_and_special_tokens(tokenizer):
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 5?"}], add_generation_prompt=True, return_dict=False
    )
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens[0] == "<|im_start|>" and tokens[-3:] == ["<|im_start|>", "assistant", "Ċ"]
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.eos_token_id != tokenizer.pad_token_id


def test_builtin_names_resolve_into_the_data_dir_once(data_dir):
    # Two threads racing to build the same model: both get a complete directory.
    results = []
    threads = [threading.Thread(target=lambda: results.append(models.resolve_model_path("tiny"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [data_dir / "models" / "tiny"] * 2
    assert not [p for p in (data_dir / "models").iterdir() if p.name.startswith(".")]  # no leftovers
    assert models.resolve_model_path(str(data_dir)) == data_dir


def test_a_missing_model_directory_is_named_not_taken_for_a_hub_repo_id(data_dir):
    # A saved model renamed since launch: transformers had said "Repo id must be in the form ...".
    gone = data_dir / "models" / "hot"
    with pytest.raises(FileNotFoundError, match=f"no model directory at {gone} \\(renamed or deleted"):
        models.resolve_model_path(str(gone))
    with pytest.raises(FileNotFoundError, match="no model directory at"):
        models.load_tokenizer(gone)


def test_device_and_dtype_on_cpu():
    device = models.pick_device("auto")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert device.type == expected
    assert models.pick_dtype(torch.device("cpu")) == torch.float32
    assert models.pick_dtype(torch.device("cpu"), "bfloat16") == torch.bfloat16


def test_reference_is_frozen_and_critic_gives_one_value_per_token(tiny_path):
    cpu = torch.device("cpu")
    reference = models.load_reference(tiny_path, cpu)
    assert not any(p.requires_grad for p in reference.parameters()) and not reference.training
    critic = models.load_critic(tiny_path, cpu)
    values = critic(input_ids=torch.tensor([[5, 6, 7]])).logits[..., 0]
    assert values.shape == (1, 3)


def test_models_load_in_several_threads_at_once(tiny_path):
    """An embedded server's explorer and trainer load in threads of one process: without one load
    at a time, transformers' meta-device build left 2 of 3 threads with meta weights."""
    from workers.rft.rewards.models import _reward_model

    loaded, errors = [], []

    def load(fn):
        try:
            for _ in range(4):
                loaded.append(fn(tiny_path, torch.device("cpu")))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=load, args=(fn,))
               for fn in (models.load_policy, models.load_critic, models.load_reference)]
    threads.append(threading.Thread(target=lambda: _reward_model.__wrapped__(str(tiny_path), "cpu", 4)))
    [thread.start() for thread in threads]
    [thread.join() for thread in threads]
    assert errors == []
    assert len(loaded) == 12 and not any(p.is_meta for model in loaded for p in model.parameters())


def test_copy_weights_fills_a_tied_model_from_saved_weights(tiny_path, tmp_path):
    cpu = torch.device("cpu")
    source, target = models.load_policy(tiny_path, cpu), models.load_policy(tiny_path, cpu)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(0.01)
    source.save_pretrained(tmp_path)
    saved = models.read_weights(tmp_path)
    assert "lm_head.weight" not in saved  # tied: saved once, as the embedding
    models.copy_weights(target, saved)
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError):
        models.copy_weights(target, {"nonsense": torch.zeros(1)})


@pytest.mark.slow
def test_smollm2_installs_once_and_answers_sensibly(data_dir):
    from workers.rft.engines import SamplingParams, TransformersEngine

    path = models.resolve_model_path("smollm2-135m")
    assert (path / "model.safetensors").stat().st_size > 500_000_000  # fp32, not the 4-bit GGUF
    tokenizer = models.load_tokenizer(path)
    engine = TransformersEngine(models.load_policy(path, torch.device("cpu")), tokenizer)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_dict=False
    )
    [[answer]] = engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=12))
    assert "Paris" in answer.text and answer.finish_reason == "stop"
