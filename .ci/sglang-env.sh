#!/usr/bin/env bash
# Create (or reuse) a separate venv holding SGLang 0.5.23's argument parser and benchmark client,
# for the tests marked `sglang` (tests/backends/test_sglang_args.py, tests/gateway/test_sglang_bench.py).
# No GPU needed: the CPU build of torch that pip finds on this machine's local disk, the few light
# packages `sglang.srt.server_args` and `sglang.benchmark.serving` import, and sglang itself without
# its CUDA dependencies. It stays apart from the project's venv.
#
#   usage: .ci/sglang-env.sh DIR        prints DIR/bin/python on its last line
#   then:  SPECGATE_SGLANG_PYTHON=DIR/bin/python pytest -m sglang
#
# About 1 minute and 2.3 GB the first time; a second run with the same DIR only checks it.
set -euo pipefail

dir=${1:?usage: .ci/sglang-env.sh DIR}
base_python=${SGLANG_ENV_BASE_PYTHON:-python3.11}

# Versions known to work together; the stamp records them so a change rebuilds the venv.
requirements=(
    "torch==2.13.0+cpu"
    triton==3.9.0 numpy==2.4.6 orjson==3.13.0 psutil==7.2.2 pybase64==1.5.1 requests==2.34.2
    packaging==26.4 pillow==13.0.0 starlette==1.10.0 msgspec==0.22.0 pydantic==2.14.4
    pyzmq==27.3.0 tqdm==4.70.1 ipython==9.18.1 aiohttp==3.14.5
    # SGLang's benchmark client (`python -m sglang.benchmark.serving`) loads a tokenizer.
    transformers==5.19.0 tokenizers==0.23.2 datasets==5.2.0
)
sglang=sglang==0.5.23
stamp="$dir/.specgate-sglang-env"
wanted="${requirements[*]} $sglang"
python="$dir/bin/python"

usable() {
    [[ -x $python && -f $stamp && $(cat "$stamp") == "$wanted" ]] &&
        (cd / && "$python" -c 'import sglang.srt.server_args') >/dev/null 2>&1
}

if usable; then
    echo "sglang parser venv already in $dir" >&2
else
    start=$SECONDS
    rm -rf "$dir"
    "$base_python" -m venv "$dir"
    # The machine's pip config supplies the local wheel directory and the torch version cap.
    "$python" -m pip install --quiet --disable-pip-version-check "${requirements[@]}"
    "$python" -m pip install --quiet --disable-pip-version-check --no-deps "$sglang"
    (cd / && "$python" -c 'import sglang.srt.server_args')
    echo "$wanted" >"$stamp"
    echo "sglang parser venv built in $dir in $((SECONDS - start)) s, $(du -sh "$dir" | cut -f1)" >&2
fi
echo "$python"
