"""SGLang 0.5.23's own benchmark client against `specgate serve` (its embedded simulated backends).

`python -m sglang.benchmark.serving` (through `sglang_bench_client.py`, which only stands in for a
module the text benchmark cannot import here) runs from the venv `.ci/sglang-env.sh DIR` builds
(point SPECGATE_SGLANG_PYTHON at its python) with `--backend sglang` (native `/generate`), `sglang-oai`
(`/v1/completions`) and `sglang-oai-chat` (`/v1/chat/completions`); every request must complete.
Nothing is downloaded: the client loads a word-level tokenizer written here (the simulator's
one-token words, under the simulator's ids), and its `random` dataset samples a ShareGPT-format
file written here too.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.sim import vocab
from backends.testbed import GatewayProcess, start_gateway
from tokencount import ONE_TOKEN_WORDS

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(600)]

NUM_PROMPTS = 20


@pytest.fixture(scope="module")
def sglang_python() -> str:
    python = os.environ.get("SPECGATE_SGLANG_PYTHON")
    if not python:
        pytest.skip("SPECGATE_SGLANG_PYTHON is unset: build the venv with `.ci/sglang-env.sh DIR`")
    return python


def write_tokenizer(directory: Path) -> Path:
    """A Hugging Face word-level tokenizer over the simulator's one-token words, with its ids."""
    directory.mkdir(parents=True, exist_ok=True)
    words = {"[UNK]": 0} | {word: vocab.FIRST_WORD_ID + i for i, word in enumerate(ONE_TOKEN_WORDS)}
    unk = {"id": 0, "content": "[UNK]", "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [unk],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "[UNK]"},
    }
    (directory / "tokenizer.json").write_text(json.dumps(spec))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 8192}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def write_sharegpt(path: Path, conversations: int = 50) -> Path:
    """A ShareGPT-format file of conversations in the simulator's words."""
    rng = random.Random(7)

    def text(n: int) -> str:
        return " ".join(rng.choice(ONE_TOKEN_WORDS) for _ in range(n))

    rows = [
        {"conversations": [{"from": "human", "value": text(rng.randint(8, 40))}, {"from": "gpt", "value": text(20)}]}
        for _ in range(conversations)
    ]
    path.write_text(json.dumps(rows))
    return path


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    gw = start_gateway(env={"SPECGATE_LAUNCH__TIME_SCALE": "0.1", "SPECGATE_SERVER__WORKERS": "1"})
    try:
        yield gw
    finally:
        gw.stop()


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat"])
def test_sglang_benchmark_completes_every_request(
    sglang_python: str, gateway: GatewayProcess, tmp_path: Path, backend: str
) -> None:
    result = tmp_path / "result.jsonl"
    argv = [
        sglang_python, str(Path(__file__).with_name("sglang_bench_client.py")),
        "--backend", backend,
        "--base-url", gateway.url,
        "--tokenizer", str(write_tokenizer(tmp_path / "tokenizer")),
        "--dataset-name", "random",
        "--dataset-path", str(write_sharegpt(tmp_path / "sharegpt.json")),
        "--num-prompts", str(NUM_PROMPTS),
        "--random-input-len", "32",
        "--random-output-len", "16",
        "--max-concurrency", "8",
        "--seed", "1",
        "--output-file", str(result),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540)
    output = run.stdout[-4000:] + run.stderr[-4000:]
    assert run.returncode == 0, output
    line = json.loads(result.read_text().splitlines()[-1])
    assert line["completed"] == NUM_PROMPTS, output
    assert line["total_output_tokens"] > 0 and line["mean_ttft_ms"] > 0, output
