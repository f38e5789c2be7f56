"""Measure a model's decode step-time curves on this machine and write a simulator profile.

    python -m benchmarks.calibrate.gpu --config benchmarks/calibrate/configs/llama-3.1-8b.json \\
        --name h200-llama8b --out-dir OUT

For each batch size B it times a plain decode step (one token per request) and an EAGLE-3 chain
step (`--drafts` draft passes of a one-layer head, a verify of drafts+1 tokens per request, the draft
extend) of a random-weight model shaped by the config.json, with a KV context of `--context` tokens.
On a CUDA GPU each step is captured in a CUDA graph and timed with device events over many replays
(median); without one it runs eagerly on the CPU and is timed with the host clock. A prefill of two
prompt lengths gives the prefill cost per token, on a plain server and on an EAGLE one (whose prefill
batch adds the draft's extend over the prompt). Writes `<name>.json` (every measurement, the
device and the command) and `<name>.toml` (a profile with `step_ms` tables).

Only PyTorch and the standard library are needed, so it runs on a bare GPU machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from benchmarks.calibrate.llama import DEFAULT_DRAFT_VOCAB, Decoder, LlamaShape
from benchmarks.calibrate.profile_file import MeasuredMemory, RoleLimits, profile_tables, write_profile

DEFAULT_BATCHES = (1, 8, 16, 32, 64, 96, 128, 192, 256)


@dataclass(frozen=True)
class StepPoint:
    """Median step time at one batch size, with the spread of the samples it came from."""

    batch: int
    plain_ms: float
    eagle_ms: float
    plain_iqr_ms: float
    eagle_iqr_ms: float


class StepTimer:
    """Times a step function: captured in a CUDA graph and replayed under device events, or (on a CPU,
    or for steps of few large kernels) called eagerly under the host clock."""

    def __init__(self, device: torch.device, warmup: int, repeats: int, graphs: bool) -> None:
        self.device = device
        self.warmup = warmup
        self.repeats = repeats
        self.graphs = graphs and device.type == "cuda"

    def _eager(self, step: Callable[[], object]) -> None:
        step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def samples_ms(self, step: Callable[[], object]) -> list[float]:
        """Duration of each of `repeats` runs of `step`, ms, after `warmup` untimed runs."""
        if not self.graphs:
            for _ in range(self.warmup):
                self._eager(step)
            out = []
            for _ in range(self.repeats):
                start = time.perf_counter()
                self._eager(step)
                out.append((time.perf_counter() - start) * 1000.0)
            return out
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before capture must run off the capturing stream
            for _ in range(max(self.warmup, 1)):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # its own memory pool, freed with the graph
            step()
        for _ in range(self.warmup):
            graph.replay()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(self.repeats)]
        for start, end in events:
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]


def _iqr(samples: list[float]) -> float:
    q = statistics.quantiles(samples, n=4)
    return q[2] - q[0]


def measure_steps(decoder: Decoder, batches: tuple[int, ...], drafts: int, timer: StepTimer) -> list[StepPoint]:
    """Plain and EAGLE step times at each batch size."""
    points = []
    gen = torch.Generator(device=decoder.device).manual_seed(1)
    for batch in batches:
        tokens = torch.randint(0, decoder.draft_vocab, (batch,), generator=gen, device=decoder.device)
        hidden = torch.randn(batch, decoder.shape.hidden, generator=gen, device=decoder.device).to(decoder.dtype)
        plain = timer.samples_ms(lambda: decoder.plain_step(tokens))
        eagle = timer.samples_ms(lambda: decoder.eagle_step(tokens, hidden, drafts))
        point = StepPoint(batch, statistics.median(plain), statistics.median(eagle), _iqr(plain), _iqr(eagle))
        points.append(point)
        print(f"B={batch:4d}  plain {point.plain_ms:8.3f} ms  eagle {point.eagle_ms:8.3f} ms", flush=True)
    return points


def measure_prefill(decoder: Decoder, lengths: tuple[int, int], timer: StepTimer) -> tuple[dict[int, float], dict[int, float]]:
    """Median time of a one-prompt prefill at each prompt length, ms, on a plain server and on an EAGLE
    server (the target's prefill, then the draft's extend over the prompt); eager: few large kernels."""
    eager = StepTimer(decoder.device, timer.warmup, max(3, timer.repeats // 10), graphs=False)
    plain, eagle = {}, {}
    for length in lengths:
        tokens = torch.randint(0, decoder.shape.vocab, (length,), device=decoder.device)
        plain[length] = statistics.median(eager.samples_ms(lambda: decoder.prefill(tokens)))
        eagle[length] = statistics.median(eager.samples_ms(lambda: decoder.eagle_prefill(tokens)))
        print(f"prefill {length:6d} tokens  plain {plain[length]:8.3f} ms  eagle {eagle[length]:8.3f} ms", flush=True)
    return plain, eagle


def _slope(ms: dict[int, float], lengths: tuple[int, ...]) -> float:
    """ms per prompt token between the two prompt lengths."""
    return max(ms[lengths[1]] - ms[lengths[0]], 0.0) / (lengths[1] - lengths[0])


def copy_bandwidth_gbs(device: torch.device, gib: float = 2.0) -> float | None:
    """Device-to-device copy rate, GB/s counting bytes read and written (the decode step's ceiling)."""
    if device.type != "cuda":
        return None
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * 10 * src.numel() / (start.elapsed_time(end) / 1000.0) / 1e9


def device_description(device: torch.device) -> dict[str, object]:
    """What the numbers were measured on."""
    info: dict[str, object] = {"torch": torch.__version__, "python": platform.python_version(), "host": platform.node()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {
            "name": props.name,
            "total_memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda,
        }
    else:
        info |= {
            "name": f"CPU ({platform.processor() or platform.machine()})",
            "total_memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "threads": torch.get_num_threads(),
        }
    return info


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="Hugging Face config.json of the model")
    parser.add_argument("--name", required=True, help="profile name; also the output files' stem")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)), help="comma-separated batch sizes")
    parser.add_argument("--context", type=int, default=1024, help="KV context per request, tokens")
    parser.add_argument("--drafts", type=int, default=3, help="draft passes per EAGLE step (chain, topk 1)")
    parser.add_argument("--draft-vocab", type=int, default=DEFAULT_DRAFT_VOCAB)
    parser.add_argument("--tau", type=float, default=3.0, help="acceptance length written into the eagle table")
    parser.add_argument("--prefill-lengths", default="512,2048", help="two prompt lengths for the prefill slope")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--mem-fraction-static", type=float, default=0.88, help="SGLang's share of GPU memory for weights and KV")
    parser.add_argument("--plain-max-running", type=int, default=256)
    parser.add_argument("--eagle-max-running", type=int, default=48, help="SGLang's default cap for EAGLE servers")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile each decoder layer (fuses elementwise work)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Measure, then write the raw JSON and the profile TOML."""
    args = parse_args(argv)
    device = torch.device(args.device)
    shape = LlamaShape.from_config(json.loads(args.config.read_text(encoding="utf-8")))
    batches = tuple(sorted(int(b) for b in args.batches.split(",")))
    lengths = tuple(int(n) for n in args.prefill_lengths.split(","))
    if len(lengths) != 2 or lengths[0] >= lengths[1]:
        raise SystemExit("--prefill-lengths takes two increasing lengths")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    started = time.perf_counter()
    decoder = Decoder(
        shape,
        context=args.context,
        max_batch=batches[-1],
        draft_vocab=args.draft_vocab,
        device=device,
        dtype=dtype,
        compile_layers=args.compile,
    )
    timer = StepTimer(device, args.warmup, args.repeats, graphs=True)
    with torch.inference_mode():
        points = measure_steps(decoder, batches, args.drafts, timer)
        prefill, eagle_prefill = measure_prefill(decoder, (lengths[0], lengths[1]), timer)
    bandwidth = copy_bandwidth_gbs(device)
    prefill_per_token = _slope(prefill, lengths)
    described = device_description(device)
    total_memory = int(described.get("total_memory_bytes", 0))
    weight_bytes = shape.target_params() * dtype.itemsize
    draft_bytes = shape.draft_params(args.draft_vocab) * dtype.itemsize
    limits = RoleLimits.from_memory(
        shape,
        total_memory=total_memory,
        mem_fraction=args.mem_fraction_static,
        target_weight_bytes=weight_bytes,
        draft_weight_bytes=draft_bytes,
        plain_max_running=args.plain_max_running,
        eagle_max_running=args.eagle_max_running,
    )
    profile = profile_tables(
        name=args.name,
        model_path=shape.model_path,
        accelerator=str(described["name"]),
        context_length=shape.context_length,
        eos_token_id=shape.eos_token_id,
        plain_steps=[(p.batch, p.plain_ms) for p in points],
        eagle_steps=[(p.batch, p.eagle_ms) for p in points],
        tau=args.tau,
        num_draft_tokens=args.drafts + 1,
        prefill_ms_per_token=prefill_per_token,
        limits=limits,
        memory=MeasuredMemory.from_bytes(
            total_memory=total_memory,
            target_weight_bytes=weight_bytes,
            draft_weight_bytes=draft_bytes,
            mem_fraction=args.mem_fraction_static,
            node_gpus=torch.cuda.device_count() if device.type == "cuda" else 1,
        ),
    )
    raw = {
        "command": " ".join(["python -m benchmarks.calibrate.gpu", *(argv if argv is not None else sys.argv[1:])]),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": described,
        "dtype": str(dtype).removeprefix("torch."),
        "cuda_graphs": device.type == "cuda",
        "compiled_layers": args.compile,
        "shape": asdict(shape),
        "context": args.context,
        "drafts": args.drafts,
        "draft_vocab": args.draft_vocab,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "steps": [asdict(p) for p in points],
        "prefill_ms": {str(k): v for k, v in prefill.items()},
        "prefill_ms_per_token": prefill_per_token,
        "eagle_prefill_ms": {str(k): v for k, v in eagle_prefill.items()},
        "eagle_prefill_ms_per_token": _slope(eagle_prefill, lengths),
        "copy_bandwidth_gbs": bandwidth,
        "target_weight_bytes": weight_bytes,
        "draft_weight_bytes": draft_bytes,
        "weight_read_floor_ms": weight_bytes / (bandwidth * 1e9) * 1000.0 if bandwidth else None,
        "limits": asdict(limits),
        "seconds": round(time.perf_counter() - started, 1),
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{args.name}.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    write_profile(args.out_dir / f"{args.name}.toml", profile)
    print(f"wrote {args.out_dir / (args.name + '.json')} and {args.out_dir / (args.name + '.toml')}", flush=True)


if __name__ == "__main__":
    main()
