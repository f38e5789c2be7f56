"""benchmarks/calibrate: the GPU step-time measurement (run on the CPU with a tiny model) and the fit to
SGLang's bench_serving results; both write profile files the simulator loads.

The measurement's tests need PyTorch, which `.[test]` leaves out: they carry the `calibrate` marker,
which .ci/run runs in a stage that installs the CPU wheel (and where a missing torch fails, never skips).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.sim.profiles import load_profile
from benchmarks.calibrate import fit
from benchmarks.calibrate.profile_file import profile_toml
from benchmarks.calibrate.shape import LlamaShape

CONFIGS = Path(__file__).resolve().parents[2] / "benchmarks" / "calibrate" / "configs"


def test_llama_8b_config_gives_its_known_size() -> None:
    shape = LlamaShape.from_config(json.loads((CONFIGS / "llama-3.1-8b.json").read_text()))
    assert shape.target_params() == 8_030_261_248  # Llama-3.1-8B's published parameter count
    assert shape.kv_bytes_per_token(shape.layers) == 128 * 1024 and shape.eos_token_id == 128009


@pytest.mark.calibrate
def test_decode_attention_folds_query_groups_exactly() -> None:
    import torch

    from benchmarks.calibrate.llama import Decoder

    shape = LlamaShape.from_config(json.loads((CONFIGS / "tiny.json").read_text()))
    decoder = Decoder(shape, context=8, max_batch=2, draft_vocab=64, device=torch.device("cpu"), dtype=torch.float64)
    tokens = torch.tensor([3, 5])
    x = decoder.embed[tokens]
    layer = decoder.layers[0]
    rope = decoder._rope_tables(7, 1)
    out = decoder._layer(layer, x, x, 2, 1, (decoder.k_cache[0], decoder.v_cache[0]), rope)
    # Reference: plain multi-head attention with each KV head repeated for its query heads.
    s = shape
    h = torch.nn.functional.rms_norm(x, (s.hidden,), layer.norm_attn, s.rms_eps)
    qkv = torch.nn.functional.linear(h, layer.wqkv)
    qk = decoder._rope(qkv[:, : (s.heads + s.kv_heads) * s.head_dim].view(2, 1, -1, s.head_dim), rope)
    q = qk[:, :, : s.heads].transpose(1, 2)
    group = s.heads // s.kv_heads
    k = decoder.k_cache[0][:2].repeat_interleave(group, dim=1)
    v = decoder.v_cache[0][:2].repeat_interleave(group, dim=1)
    attn = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, -1)
    mid = x + torch.nn.functional.linear(attn, layer.wo)
    gate, up = torch.nn.functional.linear(
        torch.nn.functional.rms_norm(mid, (s.hidden,), layer.norm_mlp, s.rms_eps), layer.w_gate_up
    ).chunk(2, dim=-1)
    ref = mid + torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, layer.w_down)
    assert torch.allclose(out, ref, atol=1e-12)
    assert decoder.plain_step(tokens).shape == (2,) and decoder.eagle_step(tokens, x, 3).shape == (8,)
    prompt = torch.tensor([1, 2, 3, 4, 5])
    # An EAGLE server's prefill batch: the target's prefill, then the draft's extend (its first draft token out).
    assert decoder.eagle_prefill(prompt).shape == (1,) and decoder.prefill(prompt).shape == (1,)


@pytest.mark.calibrate
def test_gpu_mode_runs_on_cpu_and_writes_a_profile_the_sim_loads(tmp_path: Path) -> None:
    from benchmarks.calibrate import gpu

    gpu.main(
        ["--config", str(CONFIGS / "tiny.json"), "--name", "tiny", "--out-dir", str(tmp_path), "--batches", "4,1",
         "--context", "16", "--prefill-lengths", "8,32", "--warmup", "1", "--repeats", "3", "--device", "cpu"]
    )
    raw = json.loads((tmp_path / "tiny.json").read_text())
    assert [s["batch"] for s in raw["steps"]] == [1, 4] and raw["cuda_graphs"] is False
    assert all(s["plain_ms"] > 0 and s["eagle_ms"] > 0 for s in raw["steps"])
    assert set(raw["prefill_ms"]) == set(raw["eagle_prefill_ms"]) == {"8", "32"}
    assert all(ms > 0 for ms in raw["eagle_prefill_ms"].values()) and raw["eagle_prefill_ms_per_token"] >= 0
    p = load_profile("field-8gpu", tmp_path / "tiny.toml")
    assert p.name == "tiny" and p.model_path == "specgate/tiny-llama" and p.plain.t0_ms is None
    assert p.plain.step_ms(4) == pytest.approx(raw["steps"][1]["plain_ms"], abs=1e-3)
    assert p.eagle.step_ms(1) == pytest.approx(raw["steps"][0]["eagle_ms"], abs=1e-3)
    assert (p.eagle.tau, p.eagle.num_draft_tokens, p.eagle.max_running_requests) == (3.0, 4, 48)
    assert p.plain.max_total_tokens > p.eagle.max_total_tokens  # the draft head and its KV take room
    # The memory it measured at, which the simulator's memory model checks the tables against.
    assert p.gpu_memory_gb > 0 and p.mem_fraction_static == 0.88 and p.target_weights_gb > 0 and p.draft_weights_gb > 0


def _bench_line(concurrency: int | None, tpot: float, ttft: float = 20.0, prompt: int = 128, accept: float | None = None) -> str:
    """One run as sglang.benchmark.serving (0.5.23) appends it to its --output-file."""
    record = {
        "backend": "sglang-oai-chat", "dataset_name": "random", "request_rate": float("inf"),
        "max_concurrency": concurrency, "random_input_len": prompt, "random_output_len": 512,
        "random_range_ratio": 1.0, "duration": 60.0, "completed": 64, "total_input": 64 * prompt,
        "total_output": 64 * 512, "output_throughput": 1000.0, "median_ttft_ms": ttft, "mean_tpot_ms": tpot,
        "median_tpot_ms": tpot, "concurrency": float(concurrency or 16) - 0.3, "accept_length": accept,
    }
    return json.dumps(record)


def test_fit_reads_bench_serving_results_into_tables(tmp_path: Path) -> None:
    plain = tmp_path / "plain.jsonl"
    plain.write_text(
        "\n".join(
            [_bench_line(1, 5.0, ttft=10.0, prompt=128), _bench_line(1, 5.0, ttft=30.0, prompt=1152),
             _bench_line(8, 6.4), _bench_line(8, 6.0), _bench_line(8, 5.8), _bench_line(32, 9.0),
             _bench_line(None, 7.0)]
        ) + "\n"
    )
    eagle = tmp_path / "eagle.jsonl"
    eagle.write_text("\n".join(_bench_line(b, t, accept=2.5) for b, t in ((1, 2.5), (8, 3.0), (32, 6.0))) + "\n")
    out = tmp_path / "fitted.toml"
    fit.main(["--name", "fitted", "--plain", str(plain), "--eagle", str(eagle), "--out", str(out)])
    p = load_profile("llama8b-h100", out)
    assert p.plain.step_table == ((1, 5.0), (8, 6.0), (16, 7.0), (32, 9.0))  # no cap set: mean in-flight, rounded
    assert p.plain.prefill_ms_per_token == pytest.approx(20.0 / 1024, abs=1e-6)
    assert p.eagle.tau == 2.5 and p.eagle.step_table == ((1, 6.25), (8, 7.5), (32, 15.0))
    assert p.eagle.max_running_requests == 48 and p.eagle.prefill_ms_per_token == 0.02  # kept from the base
    assert p.tpot_s("eagle", 8) == pytest.approx(0.003)


def test_fit_needs_an_acceptance_length_for_eagle(tmp_path: Path) -> None:
    eagle = tmp_path / "eagle.jsonl"
    eagle.write_text(_bench_line(4, 3.0) + "\n")
    with pytest.raises(SystemExit, match="no accept_length; give --tau"):
        fit.main(["--name", "x", "--eagle", str(eagle), "--out", str(tmp_path / "x.toml")])
    fit.main(["--name", "x", "--eagle", str(eagle), "--tau", "2.0", "--out", str(tmp_path / "x.toml")])
    assert load_profile("field-8gpu", tmp_path / "x.toml").eagle.step_ms(4) == 6.0
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"max_concurrency": 4}\n')
    with pytest.raises(SystemExit, match="run 1: missing or malformed"):
        fit.main(["--name", "x", "--plain", str(broken), "--out", str(tmp_path / "y.toml")])


def test_profile_writer_output_is_toml_that_round_trips() -> None:
    text = profile_toml({"name": "a \"quoted\" name", "plain": {"step_ms": [[1, 2.5], [8, 3.0]], "tau": 1.0}})
    assert 'name = "a \\"quoted\\" name"' in text and "    [8, 3.0],\n" in text
