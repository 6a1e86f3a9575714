#!/bin/bash
# Packs .devkit/ for the lent many-core device (no network, no Redis, Python 3.12
# without our dependencies): this machine's redis-server with the libraries it links,
# bubblewrap likewise, MBPP's references, and wheels of the runtime dependencies that
# machine lacks. Then, from the device tool, with carry [".devkit"]:
#
#   bash .devkit/run.sh python3 tests/bench/bench_fleet.py --ceiling 1,16
#   bash .devkit/run.sh python3 tests/bench/bench_fleet.py --workers 1,16 \
#       --rollouts 100000 --producers 4
#   bash .devkit/run.sh python3 tests/bench/bench_overhead.py --no-table --no-fleet \
#       --fleet-workers 1,16 --rollouts 200000
#   bash .devkit/run.sh python3 tests/bench/bench_fleet_code.py --workers 1,2,4,8,16 \
#       --rollouts 6144 --data .devkit/mbpp_sanitized.jsonl
set -euo pipefail
cd "$(dirname "$0")/../.."
kit=.devkit
rm -rf "$kit"
mkdir -p "$kit/bin" "$kit/lib" "$kit/whl"

# redis-server (the device has no Redis) and bwrap (the code sandbox's; the device's
# image may lack bubblewrap), each with every library it links but the C runtime's
# own (the device has those), behind a wrapper that points the loader at them.
for name in redis-server bwrap; do
    binary=$(command -v "$name")
    cp "$binary" "$kit/lib/$name.bin"
    ldd "$binary" | awk '/=> \// {print $3}' \
        | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' \
        | xargs -I{} cp -L {} "$kit/lib/"
    sed "s/@NAME@/$name/" > "$kit/bin/$name" <<'WRAP'
#!/bin/sh
lib=$(dirname "$(readlink -f "$0")")/../lib
LD_LIBRARY_PATH="$lib" exec "$lib/@NAME@.bin" "$@"
WRAP
    chmod +x "$kit/bin/$name"
done
# The MBPP references the code benchmarks grade (../shared does not travel).
cp ../shared/data/code/mbpp_sanitized.jsonl "$kit/"

# The device's image has NumPy, pyarrow, matplotlib, prometheus-client, uvloop and
# httpx (/work/.library/device/KINDS.md); these, pinned as pyproject.toml pins them.
python3 -m pip download -q --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d "$kit/whl" \
    "celery[redis]>=5.4,<6" "redis>=5.0" "hiredis>=3.0" "orjson>=3.8" \
    sympy==1.14.0 mpmath==1.3.0 "fastapi>=0.115,<1" "uvicorn>=0.30,<1" \
    "httptools>=0.6,<1" "pydantic>=2.7,<3"

cat > "$kit/run.sh" <<'RUN'
#!/bin/bash
# On the device: install the carried wheels once, then run "$@" from the repo root.
set -u
python3 -c "import celery" 2>/dev/null || python3 -m pip install -q --no-index \
    --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devkit/whl/*.whl \
    || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=$PWD/.devkit/bin:$PATH PYTHONUNBUFFERED=1
nproc
exec "$@"
RUN
chmod +x "$kit/run.sh"
du -sh "$kit"
