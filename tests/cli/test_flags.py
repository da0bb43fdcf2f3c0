"""One flag style (issue 33 item 5): every subcommand spells its options with underscores, as `run` and a recipe
do, and the old spellings (hyphens, `memory --model`, `optimizers --size`) still parse to the same values."""

from __future__ import annotations

import re
from typing import Any

import pytest

from hf_optbench import cli
from hf_optbench.cli.find_lr import _split_own
from hf_optbench.cli.flags import canonical_flags


class _Parsed(Exception):
    """Raised once the outermost parser has parsed: the test needs the namespace, not the command's work."""


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``parse(argv) -> dict``: the namespace ``hf-optbench argv`` parses to, without running the command."""
    original = cli.ArgumentParser.parse_known_args
    depth = [0]

    def spy(self: cli.ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        depth[0] += 1
        try:
            result = original(self, args, namespace)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            raise _Parsed(vars(result[0]))
        return result

    monkeypatch.setattr(cli.ArgumentParser, "parse_known_args", spy)

    def parse(argv: list[str]) -> dict[str, Any]:
        with pytest.raises(_Parsed) as got:
            cli.main(argv)
        return got.value.args[0]

    return parse


# (new spelling, old spelling) per subcommand: the same values either way
SPELLINGS = [
    (["sweep", "s.yaml", "--output_dir", "d", "--dry_run", "--max_runs", "3", "--retry_failed"],
     ["sweep", "s.yaml", "--output-dir", "d", "--dry-run", "--max-runs", "3", "--retry-failed"]),
    (["report", "d", "--target_loss", "3.5", "--tuning_dir", "t", "--output", "o"],
     ["report", "d", "--target-loss", "3.5", "--tuning-dir", "t", "--output", "o"]),
    (["memory", "--model_size", "tiny", "--zero_stage", "2", "--world_size", "4", "--micro_batch_size", "2",
      "--block_size", "64", "--vocab_size", "1000", "--n_positions", "128", "--attn_implementation", "eager",
      "--gradient_checkpointing", "--embedding_state_8bit"],
     ["memory", "--model", "tiny", "--zero-stage", "2", "--world-size", "4", "--micro-batch-size", "2",
      "--block-size", "64", "--vocab-size", "1000", "--n-positions", "128", "--attn-implementation", "eager",
      "--gradient-checkpointing", "--embedding-state-8bit"]),
    (["optimizers", "--model_size", "mini"], ["optimizers", "--size", "mini"]),
    (["push", "r", "--repo_id", "me/x", "--dry_run", "--stage_dir", "s", "--commit_message", "m"],
     ["push", "r", "--repo-id", "me/x", "--dry-run", "--stage-dir", "s", "--commit-message", "m"]),
    (["tokenizer", "train", "--input", "a.txt", "--vocab_size", "300", "--output", "o", "--no_keep_thai_marks",
      "--char_level", "--min_frequency", "3", "--text_column", "t"],
     ["tokenizer", "train", "--input", "a.txt", "--vocab-size", "300", "--output", "o", "--no-keep-thai-marks",
      "--char-level", "--min-frequency", "3", "--text-column", "t"]),
]


@pytest.mark.parametrize(("new", "old"), SPELLINGS, ids=[s[0][0] for s in SPELLINGS])
def test_old_spellings_parse_to_the_same_values(parsed: Any, new: list[str], old: list[str]) -> None:
    got = parsed(new)
    assert got == parsed(old)
    assert "model" not in got and "size" not in got  # renamed, not added beside
    if new[0] == "memory":
        assert got["model_size"] == "tiny" and got["zero_stage"] == 2 and got["embedding_state_8bit"] is True


def test_equals_form_is_rewritten_too(parsed: Any) -> None:
    assert parsed(["memory", "--zero-stage=3"])["zero_stage"] == 3


def test_unknown_options_are_left_to_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["memory", "--zero-stages", "3"]) == 2  # still refused with one line, not guessed
    assert "--zero-stages" in capsys.readouterr().err
    assert canonical_flags(["--a-b", "--", "--a-b"], {"--a_b"}) == ["--a_b", "--", "--a-b"]
    assert canonical_flags(["--x", "--a-b"], {"--a_b"}, {"--x": "--y"}) == ["--y", "--a_b"]


def test_find_lr_options_take_both_spellings() -> None:
    own, rest = _split_own(["r.yaml", "--num-steps", "40", "--min_lr=1e-6", "--diverge-factor", "3", "--max_steps",
                            "5"])
    assert own == {"num_steps": 40, "min_lr": 1e-6, "diverge_factor": 3.0}
    assert rest == ["r.yaml", "--max_steps", "5"]


# --help-all is a help switch beside -h/--help (argparse's own spelling), not an option of a command
HYPHENATED = re.compile(r"--(?!help-all\b)[a-z0-9]+(?:-[a-z0-9]+)+")


@pytest.mark.parametrize("argv", [["sweep", "--help"], ["report", "--help"], ["tune", "--help"], ["memory", "--help"],
                                  ["optimizers", "--help"], ["push", "--help"], ["tokenizer", "train", "--help"],
                                  ["find-lr", "--help"], ["validate", "--help"], ["run", "--help"]])
def test_help_shows_only_underscore_spellings(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    try:
        rc = cli.main(argv)
    except SystemExit as exc:  # argparse's own --help
        rc = exc.code
    text = capsys.readouterr().out
    assert rc == 0 and "usage:" in text
    assert HYPHENATED.findall(text) == [], argv
