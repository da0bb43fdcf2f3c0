"""The secret table of publish/redact.py: every credential kind this ecosystem's users carry is found in a staged file
(plain, as a JSON value, escaped, in a safetensors header's metadata), named by kind and never by value; and the
files a real run stages (tokenizer, config, summary with a git commit next to a W&B version, card) are not flagged.

The values below are shaped like real ones and built at run time; none is a working credential."""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import pytest

from hf_optbench.publish.redact import secret_problems

_RNG = random.Random(0)
_ALNUM = string.ascii_letters + string.digits


def _rand(n: int, alphabet: str = _ALNUM) -> str:
    return "".join(_RNG.choice(alphabet) for _ in range(n))


HEX40 = _rand(40, "0123456789abcdef")
# (kind the refusal names, a value of that shape)
TOKENS = {
    "github-classic": ("a GitHub token", "ghp_" + _rand(36)),
    "github-oauth": ("a GitHub token", "gho_" + _rand(36)),
    "github-app": ("a GitHub token", "ghs_" + _rand(36)),
    "github-fine-grained": ("a GitHub fine-grained token", "github_pat_" + _rand(22) + "_" + _rand(59)),
    "openai-legacy": ("an OpenAI API key", "sk-" + _rand(48)),
    "openai-project": ("an OpenAI API key", "sk-proj-" + _rand(60, _ALNUM + "-_") + "T3BlbkFJ" + _rand(60)),
    "anthropic": ("an Anthropic API key", "sk-ant-api03-" + _rand(93, _ALNUM + "-_") + "AA"),
    "wandb-v1": ("a W&B API key", "wandb_v1_" + _rand(77, _ALNUM + "_")),
    "slack-bot": ("a Slack token", "xoxb-1234567890123-1234567890123-" + _rand(24)),
    "slack-user": ("a Slack token", "xoxp-1234567890-1234567890-1234567890-" + _rand(32, "0123456789abcdef")),
    "slack-webhook": ("a Slack webhook URL", "https://hooks.slack.com/services/T" + _rand(10) + "/B" + _rand(10) + "/"
                      + _rand(24)),
    "gitlab": ("a GitLab token", "glpat-" + _rand(20, _ALNUM + "-_")),
    "google": ("a Google API key", "AIza" + _rand(35, _ALNUM + "-_")),
}
# W&B's legacy key is 40 hex digits: a secret where W&B's own places put it (the generic rule may name it too)
WANDB_PLACES = {
    "env-assignment": f"export WANDB_API_KEY={HEX40}\n",
    "login-call": f'import wandb\nwandb.login(key="{HEX40}")\n',
    "netrc": f"machine api.wandb.ai\n  login user\n  password {HEX40}\n",
}


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("case", sorted(TOKENS))
def test_each_token_kind_is_found_in_a_json_value_and_named_never_shown(tmp_path: Path, case: str) -> None:
    """Issue 43: a token pasted into tokenizer_config.json's "notes" field was staged for upload."""
    kind, value = TOKENS[case]
    path = _write(tmp_path, "tokenizer_config.json", json.dumps({"eos_token": "<|endoftext|>", "notes": value}))
    problems = secret_problems(path, None)
    assert f"contains {kind}" in problems, problems
    assert not any(value in p or value[8:24] in p for p in problems)


@pytest.mark.parametrize("case", sorted(TOKENS))
def test_each_token_kind_is_found_when_json_escapes_hide_it(tmp_path: Path, case: str) -> None:
    """A JSON string may spell any character as \\uXXXX; the parsed value is searched as well as the bytes."""
    kind, value = TOKENS[case]
    escaped = "".join(f"\\u{ord(c):04x}" if i % 3 == 0 else c for i, c in enumerate(value))
    path = _write(tmp_path, "config.json", '{"model_type": "gpt2", "notes": "' + escaped + '"}')
    assert value not in path.read_text()
    assert f"contains {kind}" in secret_problems(path, None)


@pytest.mark.parametrize("case", sorted(TOKENS))
def test_each_token_kind_is_found_in_weights_and_plain_text(tmp_path: Path, case: str) -> None:
    import torch
    from safetensors.torch import save_file

    kind, value = TOKENS[case]
    weights = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(8)}, str(weights), metadata={"note": value})
    text = _write(tmp_path, "merges.txt", f"#version: 0.2\nĠ t\n{value}\n")
    assert f"contains {kind}" in secret_problems(weights, None)
    assert f"contains {kind}" in secret_problems(text, None)


@pytest.mark.parametrize("place", sorted(WANDB_PLACES))
def test_a_legacy_wandb_key_is_found_where_wandb_keeps_it(tmp_path: Path, place: str) -> None:
    path = _write(tmp_path, "notes.txt", WANDB_PLACES[place])
    assert "contains a W&B API key" in secret_problems(path, None)


@pytest.mark.parametrize(("text", "name"), [
    ("MY_SERVICE_TOKEN=" + _rand(32) + "\n", "MY_SERVICE_TOKEN"),
    ("deploy:\n  api_key: '" + _rand(24) + "'\n", "api_key"),
    ('os.environ["HF_WRITE_KEY"] = "' + _rand(40, "0123456789abcdef") + '"\n', "HF_WRITE_KEY"),
])
def test_a_high_entropy_key_or_token_assignment_is_found_naming_the_key(tmp_path: Path, text: str,
                                                                         name: str) -> None:
    problems = secret_problems(_write(tmp_path, "notes.txt", text), None)
    assert f"contains a high-entropy value assigned to '{name}'" in problems, problems


def test_a_high_entropy_value_under_a_secret_key_in_json_and_safetensors_metadata(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    secret = _rand(32)
    path = _write(tmp_path, "tokenizer_config.json", json.dumps({"extra": {"deploy_token": secret}}))
    assert "contains a high-entropy value assigned to 'deploy_token'" in secret_problems(path, None)
    weights = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(8)}, str(weights), metadata={"wandb_api_key": secret})
    assert "contains a high-entropy value assigned to 'wandb_api_key'" in secret_problems(weights, None)


def test_what_a_real_run_stages_is_not_taken_for_a_secret(tmp_path: Path) -> None:
    """The shapes a run's own files carry: special tokens under *_token keys, token counts, a 40-hex git commit
    right after a W&B version, a run name with hyphens, a card mentioning scikit-learn and task slugs, weights of
    random numbers."""
    import torch
    from safetensors.torch import save_file

    files = {
        "tokenizer_config.json": json.dumps({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                                             "pad_token": None, "unk_token": "[UNK]", "add_bos_token": False,
                                             "model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer"}),
        "config.json": json.dumps({"bos_token_id": 50256, "eos_token_id": 50256, "n_embd": 128,
                                   "_commit_hash": HEX40, "transformers_version": "5.23.0"}),
        "summary.json": json.dumps({"tokens_per_step": 1024, "flops_per_token": 786432, "max_train_tokens": 10**6,
                                    "env": {"packages": {"torch": "2.13.0", "wandb": "0.21.0"}},
                                    "git": {"commit": HEX40, "dirty": False}, "run_name": "adamw-tiny-s0-lrx2"}),
        "config.yaml": f"report_to: wandb\nrun_name: adamw-tiny-s0\ntokenizer_name: builtin:thai-bpe-2k\n"
                       f"# git commit {HEX40}\nmax_train_tokens: 1000000\n",
        "README.md": "Trained with hf_optbench (task-specific-language-model-benchmarking-suite); compare with "
                     "sk-learn-style baselines. tokens_seen: 40960.\n",
        "metrics.jsonl": '{"kind": "train", "step": 1, "loss": 6.0, "tokens": 1024}\n',
    }
    for name, text in files.items():
        assert secret_problems(_write(tmp_path, name, text), None) == [], name
    weights = tmp_path / "model.safetensors"
    save_file({"w": torch.randn(256, 256, generator=torch.Generator().manual_seed(0))}, str(weights))
    assert secret_problems(weights, None) == []


def test_unparsable_json_and_yaml_are_refused_as_uncheckable(tmp_path: Path) -> None:
    bad = _write(tmp_path, "config.json", '{"notes": "\\u0067hp_...", ')
    assert any("not valid JSON" in p and "cannot be checked for secrets" in p for p in secret_problems(bad, None))
    dup = _write(tmp_path, "config.yaml", "a: 1\na: 2\n")
    assert any("cannot be checked for secrets" in p for p in secret_problems(dup, None))
    deep = _write(tmp_path, "nested.json", "[" * 100_000 + "]" * 100_000)
    assert any("nested too deeply" in p for p in secret_problems(deep, None))


def test_a_long_run_of_name_characters_does_not_hang_the_assignment_rule(tmp_path: Path) -> None:
    """The assignment rule once tried a name from every position of a run of letters, each try backtracking through
    the rest: quadratic, 20 s for 20,000 letters, so this file (200,000 letters and a secret after them) took most of
    an hour; the name now starts only where no name character precedes it (the suite's timeout would catch a
    return)."""
    secret = _rand(32)
    path = _write(tmp_path, "merges.txt", "a" * 200_000 + f"\nAPI_KEY={secret}\n")
    assert secret_problems(path, None) == ["contains a high-entropy value assigned to 'API_KEY'"]
