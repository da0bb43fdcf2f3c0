"""``DataArguments``: where the tokens come from and how they are cut, parsed with TrainingArguments.

Standard library only (the CLI's ``--help`` and recipe validation import this module). Field names avoid every
``TrainingArguments`` field. Values are checked in ``__post_init__`` so a bad recipe fails before any loading.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from hf_optbench.errors import OptBenchError

DATA_SOURCES = ("thai_sample", "hub", "local", "synthetic")


@dataclass
class DataArguments:
    """Data source, tokenizer, packing and the fixed validation split.

    Every optimizer in a sweep sees exactly the same tokens: the split depends on ``split_seed`` and the data
    settings only (never on the training seed), and the packed result is cached under a fingerprint of them.
    """

    data_source: Literal["thai_sample", "hub", "local", "synthetic"] = field(
        default="thai_sample",
        metadata={
            "help": "thai_sample: the small original Thai corpus shipped with the package (offline demo); "
            "hub: stream dataset_name/dataset_config from the Hub; local: data_files; synthetic: a graph of "
            "hidden Markov nodes of controlled difficulty (no tokenizer; see hf_optbench.data.synthetic)."
        },
    )
    dataset_name: str = field(
        default="allenai/c4",
        metadata={"help": "Hub dataset for data_source=hub. allenai/c4 config th is mC4 Thai (`mc4` is a loading "
                  "script that datasets>=4 refuses)."},
    )
    dataset_config: str | None = field(default="th", metadata={"help": "Hub dataset config (c4 language code)."})
    dataset_split: str = field(
        default="train",
        metadata={"help": "split of the source to read (train or validation; c4 layout: c4-th.* or c4-th-validation.*)."},
    )
    data_files: list[str] | None = field(
        default=None,
        metadata={"help": "data_source=local: files, globs or a directory (txt, jsonl/json[.gz], parquet; a "
                  "directory in the c4 layout multilingual/c4-<config>.*.json.gz is read like the Hub dataset)."},
    )
    text_column: str = field(default="text", metadata={"help": "column holding the document text (json/parquet)."})
    txt_sample_by: Literal["line", "paragraph", "document"] = field(
        default="line",  # datasets' `text` builder default (TextConfig.sample_by="line")
        metadata={"help": "how .txt files split into documents: per line (the default, as datasets' text builder), "
                  "per blank-line-separated paragraph, or one document per file. Documents are held out whole, "
                  "so 'document' on a single file leaves nothing to train on."},
    )
    tokenizer_name: str = field(
        default="flax-community/gpt2-base-thai",  # the Thai GPT-2 tokenizer the benchmark was designed around
        metadata={"help": "Hub id (cache only when offline), a local directory, or builtin:<name> for a tokenizer "
                  "shipped with the package (builtin:thai-bpe-2k; `hf-optbench tokenizer list`). Ignored by data_source=synthetic."},
    )
    block_size: int = field(
        default=128,
        metadata={"help": "tokens per training example; documents are joined with EOS and packed into blocks of "
                  "this size (run_clm's group_texts). Must be <= the model's n_positions."},
    )
    max_documents: int | None = field(
        default=None, metadata={"help": "read only the first N non-empty documents of the source (deterministic)."}
    )
    max_train_tokens: int | None = field(
        default=None,
        metadata={"help": "stop reading once the training split has this many tokens (rounded down to whole "
                  "blocks); for synthetic, see synthetic_num_tokens."},
    )
    validation_fraction: float = field(
        default=0.05,
        metadata={"help": "fraction of documents held out for evaluation (systematic sample with a start drawn "
                  "from split_seed; for synthetic, of the training blocks)."},
    )
    validation_blocks: int | None = field(
        default=None,
        metadata={"help": "keep exactly this many evaluation blocks (the first of the held-out documents). With it "
                  "set, the evaluation set stays identical when max_documents/max_train_tokens change."},
    )
    tuning_blocks: int = field(
        default=0,
        metadata={"help": "blocks held out for learning-rate selection, disjoint from train and eval, never reported "
                  "as eval (0: none). Text: documents held out whole, as for eval; synthetic: its own random stream."},
    )
    split_seed: int = field(
        default=1234,  # an arbitrary fixed constant; deliberately not TrainingArguments.seed
        metadata={"help": "seed of the held-out split. Fixed for a whole sweep; NOT the training seed."},
    )
    preprocessing_num_workers: int | None = field(
        default=None,
        metadata={"help": "processes for tokenization (datasets.map num_proc). Default 1: the Rust tokenizer "
                  "already uses every core for a batch (on 2 shared cores, 2 processes were within run-to-run noise of 1)."},
    )
    data_cache_dir: str | None = field(
        default=None,
        metadata={"help": "where packed datasets are cached (memory-mapped Arrow). Default: $HF_OPTBENCH_CACHE/data "
                  "or ~/.cache/hf_optbench/data."},
    )
    overwrite_data_cache: bool = field(
        default=False, metadata={"help": "rebuild the packed dataset even if a cached copy with the same fingerprint exists."}
    )
    # -- synthetic source (graph of hidden Markov nodes; default size 32 tokens, 4 hidden nodes of 4 states) --
    synthetic_vocab_size: int = field(
        default=32, metadata={"help": "observable tokens of the synthetic source."}
    )
    synthetic_hidden_nodes: int = field(
        default=4, metadata={"help": "hidden Markov nodes in the chain feeding the observed node."}
    )
    synthetic_hidden_states: int = field(
        default=4, metadata={"help": "states per hidden node."}
    )
    synthetic_alpha_x: float = field(
        default=0.068,  # calibrated to a gzip ratio of 0.75, "hard but learnable" (see synthetic_alpha_z)
        metadata={"help": "Dirichlet concentration of the observed node's transitions; smaller = more predictable."},
    )
    synthetic_alpha_z: float = field(
        # `hf-optbench data difficulty --data_source synthetic --target_ratio 0.75` on the default graph (V=32, K=4,
        # S=4), synthetic_seed 0 -> 0.068 for both alphas (ratio 0.750). A gzip ratio near 0.75 is hard but
        # learnable; above ~0.98 there is little structure to learn. Alphas do not transfer between graph
        # constructions: alpha_x 1e-3 with alpha_z 0.125, which gave 0.74 on another construction of the same
        # size, gives 0.40 on this one.
        default=0.068,
        metadata={"help": "Dirichlet concentration of the hidden nodes' transitions. Recalibrate with `hf-optbench "
                  "data difficulty --data_source synthetic --target_ratio 0.75` after changing the graph."},
    )
    synthetic_num_tokens: int = field(
        default=1 << 20, metadata={"help": "training tokens to generate (whole blocks of block_size)."}
    )
    synthetic_seed: int = field(
        default=0, metadata={"help": "seed of the synthetic graph (transition tables) and of the training samples."}
    )
    synthetic_topics: int = field(
        default=0,
        metadata={"help": "document topics of the synthetic source: each sequence keeps one, and a token comes from "
                  "its word distribution with probability synthetic_topic_weight (0: none, the graph alone)."},
    )
    synthetic_topic_weight: float = field(
        default=0.5, metadata={"help": "probability that a synthetic token comes from its sequence's topic."}
    )

    def __post_init__(self) -> None:
        if self.data_source not in DATA_SOURCES:
            raise OptBenchError(f"data_source must be one of {', '.join(DATA_SOURCES)}, got {self.data_source!r}.")
        if isinstance(self.data_files, str):  # a single path given in YAML
            self.data_files = [self.data_files]
        if self.data_source == "local" and not self.data_files:
            raise OptBenchError("data_source is 'local' but data_files is empty. Set data_files to files, globs or a directory.")
        if self.data_files and self.data_source != "local":
            raise OptBenchError(
                f"data_files is set but data_source is {self.data_source!r}. Set data_source: local to read them, "
                "or remove data_files."
            )
        if self.data_source == "hub" and not self.dataset_name.strip():
            raise OptBenchError("dataset_name is empty for data_source 'hub'. Use e.g. allenai/c4 with dataset_config th.")
        if not self.text_column.strip():
            raise OptBenchError("text_column is empty. Name the column that holds the text (c4: text).")
        if self.block_size < 2:
            raise OptBenchError(f"block_size must be >= 2, got {self.block_size}. Use e.g. 128 or the model's n_positions.")
        _positive("max_documents", self.max_documents, optional=True)
        _positive("max_train_tokens", self.max_train_tokens, optional=True)
        if self.max_train_tokens is not None and self.max_train_tokens < self.block_size:
            raise OptBenchError(
                f"max_train_tokens={self.max_train_tokens} is smaller than block_size={self.block_size}: not one "
                "training block. Raise max_train_tokens or lower block_size."
            )
        if not 0.0 < self.validation_fraction <= 0.5:
            raise OptBenchError(
                f"validation_fraction must be in (0, 0.5], got {self.validation_fraction}. Use e.g. 0.05."
            )
        _positive("validation_blocks", self.validation_blocks, optional=True)
        if not isinstance(self.tuning_blocks, int) or self.tuning_blocks < 0:
            raise OptBenchError(
                f"tuning_blocks must be an integer >= 0, got {self.tuning_blocks!r}. Use 0 for no tuning split."
            )
        _positive("preprocessing_num_workers", self.preprocessing_num_workers, optional=True)
        if self.synthetic_vocab_size < 2 or self.synthetic_vocab_size > 65536:
            raise OptBenchError(f"synthetic_vocab_size must be in [2, 65536], got {self.synthetic_vocab_size}.")
        if self.synthetic_hidden_nodes < 0:
            raise OptBenchError(f"synthetic_hidden_nodes must be >= 0, got {self.synthetic_hidden_nodes}.")
        if self.synthetic_hidden_states < 1:
            raise OptBenchError(f"synthetic_hidden_states must be >= 1, got {self.synthetic_hidden_states}.")
        if self.synthetic_topics < 0 or not 0.0 <= self.synthetic_topic_weight <= 1.0:
            raise OptBenchError(f"synthetic_topics must be >= 0 and synthetic_topic_weight in [0, 1], got "
                                f"{self.synthetic_topics} and {self.synthetic_topic_weight}. Use e.g. 8 and 0.5.")
        for key in ("synthetic_alpha_x", "synthetic_alpha_z"):
            value = getattr(self, key)
            if not value > 0:
                raise OptBenchError(f"{key} must be > 0 (a Dirichlet concentration), got {value}. Try 1e-3 .. 1.")
        if self.data_source == "synthetic" and self.synthetic_num_tokens < self.block_size:
            raise OptBenchError(
                f"synthetic_num_tokens={self.synthetic_num_tokens} < block_size={self.block_size}. Raise synthetic_num_tokens."
            )

    @property
    def needs_tokenizer(self) -> bool:
        """False for the synthetic source, whose tokens are already ids."""
        return self.data_source != "synthetic"

    def resolved_cache_dir(self) -> str:
        """The directory that holds packed datasets."""
        if self.data_cache_dir:
            return os.path.abspath(os.path.expanduser(self.data_cache_dir))
        root = os.environ.get("HF_OPTBENCH_CACHE") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hf_optbench"
        )
        return os.path.join(root, "data")


def _positive(name: str, value: int | None, *, optional: bool) -> None:
    if value is None and optional:
        return
    if value is None or value < 1:
        raise OptBenchError(f"{name} must be a positive integer, got {value!r}. Leave it unset for no limit.")
