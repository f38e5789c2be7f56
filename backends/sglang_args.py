"""SGLang 0.5.23 command lines: the exact flag spellings specgate passes, and the ones it must not.

Every flag here is a full option string of SGLang's own parser (checked by the `sglang` test
marker against `sglang.srt.server_args`). SGLang's parser still accepts abbreviations, so a
shortened or removed flag may fail only on the GPU node (or silently mean something else);
this module never abbreviates.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from backends.config import LaunchConfig
from backends.resolve import EAGLE, ResolvedServer

# Spellings that older guides use and 0.5.23 rejects as ambiguous prefixes (contract section 0).
REMOVED_FLAGS: dict[str, str] = {
    "--cuda-graph-max-bs": "removed in SGLang 0.5.23 (ambiguous option); use --cuda-graph-max-bs-decode",
    "--cuda-graph-bs": "removed in SGLang 0.5.23 (ambiguous option); use --cuda-graph-bs-decode",
    "--speculative-draft": "ambiguous in SGLang 0.5.23; use --speculative-draft-model-path",
}
# Still accepted by 0.5.23, on their way out.
DEPRECATED_FLAGS: dict[str, str] = {
    "--enable-dp-attention": "deprecated in SGLang 0.5.23 (to be removed); use --attn-dp-size",
}

# Chat and completions report `usage.prompt_tokens_details.cached_tokens` (SGLang's `enable_cache_report`),
# so the gateway and the load tester see how much of each prompt the prefix cache served.
CACHE_REPORT_FLAG = "--enable-cache-report"

# SGLang's priority scheduling: requests carry an integer `priority` (higher first by default).
PRIORITY_SCHEDULING_FLAG = "--enable-priority-scheduling"

# Flags that decide how many GPUs one server occupies: tp * pp * dp.
PARALLEL_FLAGS: dict[str, tuple[str, ...]] = {
    "pp": ("--pp-size", "--pipeline-parallel-size"),
    "dp": ("--dp-size", "--data-parallel-size"),
}


@dataclass(frozen=True)
class SpeculativeArgs:
    """EAGLE-family parameters; SGLang needs all three set together or none (it asserts otherwise)."""

    algorithm: str
    draft_model_path: str | None
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int


@dataclass(frozen=True)
class SGLangServerArgs:
    """Everything that goes on one `python -m sglang.launch_server` command line."""

    model_path: str | None
    served_model_name: str | None
    host: str
    port: int
    tp_size: int | None
    mem_fraction_static: float | None
    max_running_requests: int | None
    cuda_graph_max_bs_decode: int | None
    api_key: str | None
    metric_labels: dict[str, str]
    speculative: SpeculativeArgs | None
    extra_args: tuple[str, ...]


def sglang_argv(python: str, args: SGLangServerArgs) -> tuple[str, ...]:
    """The full argv that starts one SGLang server with `args`."""
    argv: list[str] = [python, "-m", "sglang.launch_server"]
    if args.model_path is not None:
        argv += ["--model-path", args.model_path]
    if args.served_model_name is not None:
        argv += ["--served-model-name", args.served_model_name]
    argv += ["--host", args.host, "--port", str(args.port)]
    if args.tp_size is not None:
        argv += ["--tp-size", str(args.tp_size)]
    if args.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", f"{args.mem_fraction_static:g}"]
    if args.max_running_requests is not None:
        argv += ["--max-running-requests", str(args.max_running_requests)]
    if args.cuda_graph_max_bs_decode is not None:
        argv += ["--cuda-graph-max-bs-decode", str(args.cuda_graph_max_bs_decode)]
    spec = args.speculative
    if spec is not None:
        argv += ["--speculative-algorithm", spec.algorithm]
        if spec.draft_model_path is not None:
            argv += ["--speculative-draft-model-path", spec.draft_model_path]
        argv += [
            "--speculative-num-steps",
            str(spec.num_steps),
            "--speculative-eagle-topk",
            str(spec.eagle_topk),
            "--speculative-num-draft-tokens",
            str(spec.num_draft_tokens),
        ]
    if args.api_key is not None:
        argv += ["--api-key", args.api_key]
    argv += ["--enable-metrics", "--extra-metric-labels", metric_labels_json(args.metric_labels)]
    argv.append(CACHE_REPORT_FLAG)
    argv += args.extra_args
    return tuple(argv)


def metric_labels_json(labels: dict[str, str]) -> str:
    """`--extra-metric-labels` value: compact JSON, so the plan prints it the way it is passed."""
    return orjson.dumps(labels).decode()


def flag_value(args: tuple[str, ...] | list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last `--flag V` or `--flag=V` in `args` among `names`, as argparse reads it."""
    found: str | None = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in names:
            if eq:
                found = value
            elif i + 1 < len(args):
                found = args[i + 1]
    return found


def flags_in(args: tuple[str, ...] | list[str]) -> list[str]:
    """The option names (without `=value`) that appear in `args`."""
    return [arg.partition("=")[0] for arg in args if arg.startswith("--")]


def sglang_server_args(launch: LaunchConfig, server: ResolvedServer) -> SGLangServerArgs:
    """The command-line settings of one resolved server; only the EAGLE one speculates."""
    spec = None
    if server.role == EAGLE:
        spec = SpeculativeArgs(
            algorithm=launch.speculative_algorithm,
            draft_model_path=launch.draft_model_path,
            num_steps=launch.num_steps,
            eagle_topk=launch.eagle_topk,
            num_draft_tokens=launch.num_draft_tokens,
        )
    return SGLangServerArgs(
        model_path=launch.model_path,
        served_model_name=launch.served_model_name,
        host=server.host,
        port=server.port,
        tp_size=server.tp_size,
        mem_fraction_static=server.mem_fraction_static,
        max_running_requests=server.max_running_requests,
        cuda_graph_max_bs_decode=server.cuda_graph_max_bs_decode,
        api_key=backend_api_key(launch),
        metric_labels=server_metric_labels(server),
        speculative=spec,
        extra_args=server.extra_args,
    )


def with_priority_scheduling(launch: LaunchConfig) -> LaunchConfig:
    """`launch` with SGLang's priority scheduling turned on in both servers (real SGLang only: the
    simulator has no such flag and ignores the requests' `priority` field)."""
    if launch.engine != "sglang":
        return launch
    update = {}
    for role in ("eagle", "plain"):
        server = getattr(launch, role)
        if PRIORITY_SCHEDULING_FLAG not in server.extra_args:
            update[role] = server.model_copy(update={"extra_args": [*server.extra_args, PRIORITY_SCHEDULING_FLAG]})
    return launch.model_copy(update=update)


def server_metric_labels(server: ResolvedServer) -> dict[str, str]:
    """`--extra-metric-labels` of one server: every server reports the same `model_name`, so `pool`
    (its role) tells the EAGLE and plain series apart, and `group` the groups' when there are several."""
    labels = {"pool": server.role}
    if server.name != server.role:
        labels["group"] = server.group
    return labels


def backend_api_key(launch: LaunchConfig) -> str | None:
    """The key the servers are started with (`--api-key`), if any."""
    return launch.backend_api_key.get_secret_value() if launch.backend_api_key is not None else None
