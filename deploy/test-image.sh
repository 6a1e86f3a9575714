#!/usr/bin/env bash
# Build the gradefleet image with podman and run the real stack from it (CI calls this
# once, after the test suite). Fails (non-zero) on any failed step, the build included.
#
#   1. podman, runc, debootstrap, redis-server from Debian; lower default ulimits.
#   2. A Debian bookworm base image made with debootstrap (no image registry is
#      reachable here), reused while it exists: `GRADEFLEET_REBUILD_BASE=1` remakes it.
#   3. deploy/Dockerfile built from the tracked files with BASE_IMAGE=that base; its
#      labels, user, entrypoint and the absence of compilers checked.
#   4. A redis-server on a free loopback port; a worker container started with the
#      worker command of deploy/docker-compose.yml (host network); one rollout graded
#      from the host (cold start: container start -> first batch graded), then
#      examples/sample.jsonl; verdicts compared with embedded mode (without `cached`).
#   5. The worker's metrics endpoint scraped, its HEALTHCHECK run, no zombie processes.
#   5b. Code rollouts (examples/code_sample.jsonl: honest rows and hacks): in the locked-down
#      image a worker would take math only (it cannot run the sandbox); a code worker
#      container started as the compose file's code-worker (`--kinds code`, root in the
#      container, capabilities SYS_ADMIN SETUID SETGID SETPCAP KILL NET_ADMIN, the default
#      seccomp profile) on the math worker's broker grades every code row, with verdicts
#      identical to embedded mode on the host; the math worker grades none.
#   6. A `gradefleet serve` container: graded through POST /v1/grade (verdicts as
#      embedded mode), its HEALTHCHECK (/readyz, which says no live worker takes code),
#      SIGTERM -> exit 0.
#   7. podman stop (SIGTERM): the worker must exit 0 before the stop timeout, idle and
#      in the middle of a job, which a replacement worker then completes (verdicts
#      identical to embedded mode, nothing left unacknowledged).
# Podman's complaints about health-check timers (no systemd here) go to a file.
# Prints: image size, build time, cold start.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

IMAGE=${GRADEFLEET_TEST_IMAGE:-localhost/gradefleet:test}
BASE_IMAGE=localhost/gradefleet-base:bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates
TEST_LABEL=io.gradefleet.test-image=1
RUN_ID="gf-test-$$"
STOP_TIMEOUT_S=60

log() { printf '\n== %s\n' "$*"; }
die() { printf 'test-image: FAIL: %s\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$2"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# The host side runs this tree's code (not whichever copy is pip-installed).
gf() { PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" python3 -c 'import sys; from producer.cli import main; main(sys.argv[1:])' "$@"; }

# --- 1. tools -------------------------------------------------------------------------
log "tools"
need_apt=()
for tool in podman runc debootstrap redis-server; do
    command -v "$tool" >/dev/null 2>&1 || need_apt+=("$tool")
done
if [ "${#need_apt[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# Podman's default ulimits exceed this machine's hard limits (the runtime then fails
# with RLIMIT_NOFILE / RLIMIT_NPROC: Operation not permitted). Set lower defaults,
# leaving an existing containers.conf alone unless it says nothing about ulimits.
CONF=/etc/containers/containers.conf
if ! grep -qs default_ulimits "$CONF"; then
    mkdir -p /etc/containers
    if grep -qs '^\[containers\]' "$CONF"; then
        die "$CONF has a [containers] table without default_ulimits: add nofile=10000:10000 and nproc=5000:5000 to it"
    fi
    printf '[containers]\ndefault_ulimits = [\n "nofile=10000:10000",\n "nproc=5000:5000",\n]\n' >> "$CONF"
fi
# crun refuses this machine's hybrid cgroups; runc with cgroupfs works.
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
# No systemd here to run podman's HEALTHCHECK timers: containers get none, and the
# check is run by hand (`podman healthcheck run`).
NO_TIMER=(--health-interval disable)
podman --version

# --- cleanup: this run's containers and redis-server, whatever happens ------------------
WORK=$(mktemp -d /tmp/gradefleet-test-image.XXXXXX)
REDIS_PID=""
cleanup() {
    local rc=$?
    for name in "$RUN_ID-worker" "$RUN_ID-serve" "$RUN_ID-code"; do
        "${PODMAN[@]}" rm -f -t 0 "$name" >/dev/null 2>&1 || true
    done
    if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
# Containers an earlier run of this script left (killed before its trap ran).
leftovers=$("${PODMAN[@]}" ps -a -q --filter "label=$TEST_LABEL" || true)
if [ -n "$leftovers" ]; then
    echo "removing containers left by an earlier run: $leftovers"
    # shellcheck disable=SC2086
    "${PODMAN[@]}" rm -f -t 0 $leftovers >/dev/null
fi

# --- 2. base image ----------------------------------------------------------------------
log "base image $BASE_IMAGE"
if [ "${GRADEFLEET_REBUILD_BASE:-0}" != 1 ] \
    && "${PODMAN[@]}" image exists "$BASE_IMAGE" \
    && [ "$("${PODMAN[@]}" image inspect --format '{{ index .Labels "io.gradefleet.base-packages" }}' "$BASE_IMAGE" 2>/dev/null)" = "$BASE_PACKAGES" ]; then
    echo "reusing $BASE_IMAGE (GRADEFLEET_REBUILD_BASE=1 rebuilds it)"
else
    t0=$(now)
    ROOTFS="$WORK/rootfs"
    mkdir -p "$ROOTFS"
    # No mirror argument: debootstrap uses its own default mirror for the suite.
    debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$ROOTFS" \
        >"$WORK/debootstrap.log" 2>&1 \
        || { tail -20 "$WORK/debootstrap.log"; die "debootstrap failed"; }
    # debootstrap keeps the .debs it installed: ~100 MB nobody needs in an image.
    rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
    tar -C "$ROOTFS" -c . | "${PODMAN[@]}" import \
        --change "LABEL io.gradefleet.base-packages=$BASE_PACKAGES" \
        --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
    rm -rf "$ROOTFS"
    echo "base image built in $(elapsed "$t0" "$(now)") s"
fi

# --- 3. build ---------------------------------------------------------------------------
log "build $IMAGE"
# The build context: files git tracks or would track (no caches, no local outputs).
CONTEXT="$WORK/context"
mkdir -p "$CONTEXT"
git ls-files -z --cached --others --exclude-standard -- pyproject.toml README.md workers producer deploy \
    | xargs -0 cp --parents -t "$CONTEXT"
# The package version: pyproject's, or hatch's dynamic one (`__version__` in a file).
VERSION=$(python3 - <<'PY'
import pathlib
import re
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))
version = project["project"].get("version")
if version is None:
    path = project["tool"]["hatch"]["version"]["path"]
    text = pathlib.Path(path).read_text()
    version = re.search(r"__version__\s*=\s*[\"']([^\"']+)[\"']", text)[1]
print(version)
PY
)
# The grader version this tree reports on the host (sympy as installed by `pip install
# -e .`); the image must report the same.
GRADER_VERSION=$(PYTHONPATH="$ROOT" python3 -c 'from workers.verifier.version import GRADER_VERSION; print(GRADER_VERSION)')
# pip in the build trusts what pip trusts here (this machine's TLS goes through a proxy
# whose CA is in the system bundle); a build secret, so it stays out of the image.
CERT_SECRET=()
HOST_CERT=$(python3 -m pip config get global.cert 2>/dev/null || true)
[ -s "$HOST_CERT" ] || HOST_CERT=/etc/ssl/certs/ca-certificates.crt
[ -s "$HOST_CERT" ] && CERT_SECRET=(--secret "id=pip_cert,src=$HOST_CERT")
# GRADEFLEET_NO_BUILD_CACHE=1: build every layer again (what a fresh machine pays).
NO_CACHE=()
[ "${GRADEFLEET_NO_BUILD_CACHE:-0}" = 1 ] && NO_CACHE=(--no-cache)
build_t0=$(now)
if ! "${PODMAN[@]}" build --format docker --network host "${NO_CACHE[@]}" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" \
    --build-arg VERSION="$VERSION" --build-arg GRADER_VERSION="$GRADER_VERSION" \
    "${CERT_SECRET[@]}" \
    -t "$IMAGE" -f "$CONTEXT/deploy/Dockerfile" "$CONTEXT" >"$WORK/build.log" 2>&1; then
    tail -40 "$WORK/build.log"
    die "image build failed"
fi
BUILD_S=$(elapsed "$build_t0" "$(now)")
# Earlier builds' final images, untagged by this one (the builder-stage layers stay:
# they are the cache of the next build).
"${PODMAN[@]}" image prune -f --filter label=org.opencontainers.image.title=gradefleet >/dev/null
SIZE_BYTES=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$IMAGE")
SIZE_MB=$(python3 -c "print(f'{$SIZE_BYTES / 1e6:.0f}')")
BASE_BYTES=$("${PODMAN[@]}" image inspect --format '{{.Size}}' "$BASE_IMAGE")
BASE_MB=$(python3 -c "print(f'{$BASE_BYTES / 1e6:.0f}')")
echo "built in $BUILD_S s; image $SIZE_MB MB (base $BASE_MB MB)"

log "image checks"
label() { "${PODMAN[@]}" image inspect --format "{{ index .Config.Labels \"$1\" }}" "$IMAGE"; }
[ "$(label org.opencontainers.image.version)" = "$VERSION" ] || die "version label"
[ "$(label io.gradefleet.grader-version)" = "$GRADER_VERSION" ] || die "grader-version label"
user=$("${PODMAN[@]}" image inspect --format '{{.Config.User}}' "$IMAGE")
case "$user" in "" | 0 | 0:* | root | root:*) die "image runs as root ($user)" ;; esac
entry=$("${PODMAN[@]}" image inspect --format '{{json .Config.Entrypoint}}' "$IMAGE")
[ "$entry" = '["/usr/local/bin/tini","--","gradefleet"]' ] || die "entrypoint $entry"
health=$("${PODMAN[@]}" image inspect --format '{{json .Config.Healthcheck}}' "$IMAGE")
case "$health" in *healthcheck.py*) ;; *) die "no HEALTHCHECK ($health)" ;; esac
# Inside: the installed package reports the grader version the labels claim; no
# compilers, no pip; not root.
inside=$("${PODMAN[@]}" run --rm "${NO_TIMER[@]}" --network none --entrypoint /opt/gradefleet/bin/python "$IMAGE" -c '
import os, shutil
from workers.verifier import GRADER_VERSION
tools = [t for t in ("gcc", "cc", "c++", "clang", "make", "pip", "pip3") if shutil.which(t)]
print(GRADER_VERSION, os.getuid(), ",".join(tools) or "-")' 2>>"$WORK/podman.err")
read -r in_grader in_uid in_tools <<<"$inside"
[ "$in_grader" = "$GRADER_VERSION" ] || die "image grades as $in_grader, label says $GRADER_VERSION"
[ "$in_uid" != 0 ] || die "container runs as uid 0"
[ "$in_tools" = "-" ] || die "build tools in the runtime image: $in_tools"
echo "labels, user $user, entrypoint, HEALTHCHECK, grader $in_grader, no compilers: ok"

# --- 4. the stack: redis-server on the host, a worker container ---------------------------
log "worker container"
REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --maxmemory-policy noeviction --daemonize no >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 100); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    sleep 0.05
done
redis-cli -p "$REDIS_PORT" ping >/dev/null || die "redis-server did not start"
BROKER="redis://127.0.0.1:$REDIS_PORT/0"
METRICS_PORT=$(free_port)
# The worker command of the compose file (one source), its metrics port made free.
mapfile -t WORKER_CMD < <(python3 - "$METRICS_PORT" <<'EOF'
import sys

import yaml

compose = yaml.safe_load(open("deploy/docker-compose.yml"))
cmd = [str(arg) for arg in compose["services"]["worker"]["command"]]
cmd[cmd.index("--metrics-port") + 1] = sys.argv[1]
print(*cmd, sep="\n")
EOF
)
echo "command: ${WORKER_CMD[*]}"
head -n 1 examples/sample.jsonl >"$WORK/one.jsonl"
start_t0=$(now)
"${PODMAN[@]}" run -d "${NO_TIMER[@]}" --name "$RUN_ID-worker" --label "$TEST_LABEL" --network host \
    -e GRADEFLEET_BROKER_URL="$BROKER" -e GRADEFLEET_CACHE_URL="$BROKER" \
    -e GRADEFLEET_METRICS_PORT="$METRICS_PORT" -e GRADEFLEET_METRICS_ADDR=127.0.0.1 \
    "$IMAGE" "${WORKER_CMD[@]}" --hostname "$RUN_ID@%h" >/dev/null 2>>"$WORK/podman.err" \
    || { cat "$WORK/podman.err"; die "worker container did not start"; }
worker_logs() { "${PODMAN[@]}" logs "$RUN_ID-worker" 2>&1 | tail -40; }
# The job waits in the queue until the worker consumes it: its completion is the end of
# the cold start.
gf grade "$WORK/one.jsonl" -o "$WORK/one.out.jsonl" --broker "$BROKER" --quiet \
    --deadline-s 120 || { worker_logs; die "the first batch was not graded"; }
COLD_S=$(elapsed "$start_t0" "$(now)")
echo "cold start (container start -> first batch graded): $COLD_S s"

log "grade examples/sample.jsonl: fleet vs embedded"
gf grade examples/sample.jsonl -o "$WORK/fleet.jsonl" --broker "$BROKER" --quiet \
    --deadline-s 300 || { worker_logs; die "fleet grading failed"; }
gf grade examples/sample.jsonl -o "$WORK/embedded.jsonl" --no-cache --quiet \
    || die "embedded grading failed"
compare() {
    python3 - "$1" "$2" <<'EOF'
import json
import sys


def rows(path):
    with open(path) as f:
        return [{k: v for k, v in json.loads(line).items() if k != "cached"} for line in f]


a, b = rows(sys.argv[1]), rows(sys.argv[2])
if len(a) != len(b) or not a:
    sys.exit(f"{len(a)} vs {len(b)} rows")
diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
if diff:
    sys.exit(f"{len(diff)} rows differ, first: {a[diff[0]]} vs {b[diff[0]]}")
print(f"{len(a)} verdicts identical")
EOF
}
compare "$WORK/fleet.jsonl" "$WORK/embedded.jsonl" || die "fleet verdicts differ from embedded mode"

log "metrics, health, processes"
python3 - "$METRICS_PORT" "$(wc -l <"$WORK/fleet.jsonl")" "$VERSION" <<'EOF' || die "metrics"
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

url = f"http://127.0.0.1:{sys.argv[1]}/metrics"
text = urllib.request.urlopen(url, timeout=10).read().decode()
expected, version = int(sys.argv[2]) + 1, sys.argv[3]
samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
graded = sum(s.value for s in samples if s.name == "gradefleet_rollouts_graded_total")
up = [s.value for s in samples if s.name == "gradefleet_queue_depth_up"]
info = [s.labels for s in samples if s.name == "gradefleet_build_info"]
assert graded >= expected, f"graded {graded} < {expected}"
assert up == [1.0], f"queue_depth_up {up}"
assert info and info[0]["version"] == version, f"build_info {info}"
print(f"scraped: {graded:.0f} rollouts graded, queue depth readable, version {version}")
EOF
"${PODMAN[@]}" healthcheck run "$RUN_ID-worker" || die "HEALTHCHECK unhealthy"
echo "HEALTHCHECK: healthy"
# tini is PID 1 and reaps; no process may be left a zombie.
"${PODMAN[@]}" exec "$RUN_ID-worker" /opt/gradefleet/bin/python -c '
import os
procs = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        continue
    procs[int(pid)] = (stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2])
zombies = [p for p, (_, state) in procs.items() if state == "Z"]
assert procs[1][0] == "tini", f"PID 1 is {procs[1][0]}"
assert not zombies, f"zombies: {zombies}"
print(f"PID 1 tini, {len(procs)} processes, no zombies")' || die "process check"

# --- 5b. code rollouts ---------------------------------------------------------------------
log "code rollouts: the locked-down image cannot run the sandbox, so a worker there takes math"
decided=$("${PODMAN[@]}" run --rm "${NO_TIMER[@]}" --network none --entrypoint /opt/gradefleet/bin/python "$IMAGE" -c '
from workers.__main__ import decide_kinds
from workers.fleet.settings import WorkerSettings
settings, notice = decide_kinds(WorkerSettings())
print(",".join(settings.kinds or ()), notice)' 2>>"$WORK/podman.err") || die "kinds decision in the image"
echo "$decided"
case "$decided" in "math gradefleet worker: grading math only (code sandbox unavailable: not root"*) ;;
    *) die "a locked-down worker does not default to math only: $decided" ;; esac

log "code worker container: its own pool on the same broker, with the sandbox's rights"
CODE_METRICS_PORT=$(free_port)
KEY_IN=/run/secrets/gradefleet-signing-key  # a hack reads it: the sandbox must not see it
python3 -c 'import secrets; print(secrets.token_hex(32))' >"$WORK/key"
# The code-worker service of the compose file (one source): its command, with a free
# metrics port, and its rights: root in the container (in its own user namespace on
# Kubernetes, deploy/k8s/components/code-workers), these capabilities only, no new
# privileges, a read-only root, the default seccomp profile.
mapfile -t CODE_SPEC < <(python3 - "$CODE_METRICS_PORT" <<'EOF'
import sys

import yaml

service = yaml.safe_load(open("deploy/docker-compose.yml"))["services"]["code-worker"]
cmd = [str(arg) for arg in service["command"]]
cmd[cmd.index("--metrics-port") + 1] = sys.argv[1]
print(",".join(service["cap_add"]))
print(*cmd, sep="\n")
EOF
)
CODE_CAPS=${CODE_SPEC[0]}
CODE_CMD=("${CODE_SPEC[@]:1}")
echo "command: ${CODE_CMD[*]} (capabilities $CODE_CAPS)"
CODE_RIGHTS=(--user 0 --cap-drop ALL --cap-add "$CODE_CAPS" --read-only --security-opt no-new-privileges)
# The math worker of section 4 is still running on $BROKER with the compose file's
# `--kinds math`: the code worker joins the same broker and takes the code queues. The
# fleet key file is mounted where the compose file mounts it (a hack tries to read it:
# the sandbox must not see it), but not named: the math worker and this script's
# producer hold no key, and keyed and unkeyed nodes do not accept each other's work.
code_t0=$(now)
"${PODMAN[@]}" run -d "${NO_TIMER[@]}" --name "$RUN_ID-code" --label "$TEST_LABEL" --network host \
    "${CODE_RIGHTS[@]}" -v "$WORK/key:$KEY_IN:ro" \
    -e GRADEFLEET_BROKER_URL="$BROKER" -e GRADEFLEET_CACHE_URL=none \
    -e GRADEFLEET_METRICS_DIR=/tmp/gradefleet-metrics \
    -e GRADEFLEET_METRICS_ADDR=127.0.0.1 \
    "$IMAGE" "${CODE_CMD[@]}" --hostname "$RUN_ID-code@%h" >/dev/null 2>>"$WORK/podman.err" \
    || { cat "$WORK/podman.err"; die "code worker container did not start"; }
code_logs() { "${PODMAN[@]}" logs "$RUN_ID-code" 2>&1 | tail -40; }
gf grade examples/code_sample.jsonl \
    -o "$WORK/code.fleet.jsonl" --broker "$BROKER" --quiet --deadline-s 180 \
    || { code_logs; worker_logs; die "code grading on the fleet failed"; }
CODE_S=$(elapsed "$code_t0" "$(now)")
gf grade examples/code_sample.jsonl -o "$WORK/code.embedded.jsonl" --no-cache --quiet \
    || die "embedded code grading failed"
compare "$WORK/code.fleet.jsonl" "$WORK/code.embedded.jsonl" \
    || die "code verdicts on the fleet differ from embedded mode"
python3 - "$WORK/code.fleet.jsonl" "$CODE_METRICS_PORT" "$METRICS_PORT" <<'EOF' || { code_logs; die "code verdicts or metrics"; }
import json
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text.decode())
        for s in fam.samples
    }


rows = {r["id"]: r for r in map(json.loads, open(sys.argv[1]))}
for rid, row in rows.items():
    want = not rid.startswith(("hack-", "stdio-wrong"))
    assert row["correct"] is want, f"{rid}: {row['status']} {row.get('reason')}"
    print(f"  {rid:26} {row['status']:8} {row.get('reason', '')}")
kind = "gradefleet_kind_rollouts_graded_total"
code_node, math_node = scrape(sys.argv[2]), scrape(sys.argv[3])
code = code_node[(kind, (("kind", "code"),))]
starts = code_node[("gradefleet_code_sandbox_starts_total", (("role", "model"),))]
timeouts = code_node[("gradefleet_code_failures_total", (("failure", "timeout"),))]
assert code == sum(r.get("kind") == "code" for r in rows.values()), code
assert starts >= 1 and timeouts >= 1, (starts, timeouts)
# Every code rollout went to the code worker: the locked-down one graded none.
assert math_node[(kind, (("kind", "code"),))] == 0, "code graded on the math worker"
print(f"scraped: {code:.0f} code rollouts on the code worker (0 on the math worker), "
      f"{starts:.0f} model sandbox starts, {timeouts:.0f} timeout")
EOF
"${PODMAN[@]}" stop -t "$STOP_TIMEOUT_S" "$RUN_ID-code" >/dev/null 2>>"$WORK/podman.err"
rc=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$RUN_ID-code")
[ "$rc" = 0 ] || { code_logs; die "code worker exited $rc after SIGTERM"; }
echo "code worker: verdicts identical to embedded mode, $CODE_S s from its start; SIGTERM -> exit 0"

# --- 6. gradefleet serve ------------------------------------------------------------------
log "serve container"
"${PODMAN[@]}" run --rm "${NO_TIMER[@]}" --network none "$IMAGE" serve --help >/dev/null \
    2>>"$WORK/podman.err" || die "'gradefleet serve --help' fails in the image"
{
    SERVE_PORT=$(free_port)
    "${PODMAN[@]}" run -d "${NO_TIMER[@]}" --name "$RUN_ID-serve" --label "$TEST_LABEL" --network host \
        -e GRADEFLEET_BROKER_URL="$BROKER" \
        -e GRADEFLEET_HEALTHCHECK_URL="http://127.0.0.1:$SERVE_PORT/readyz" \
        "$IMAGE" serve --broker "$BROKER" --host 127.0.0.1 --port "$SERVE_PORT" >/dev/null \
        2>>"$WORK/podman.err" || { cat "$WORK/podman.err"; die "serve container did not start"; }
    python3 - "$SERVE_PORT" "$WORK/embedded.jsonl" <<'EOF' || { "${PODMAN[@]}" logs "$RUN_ID-serve" 2>&1 | tail -30; die "serve"; }
import json
import sys
import time
import urllib.request

base = f"http://127.0.0.1:{sys.argv[1]}"
embedded = [json.loads(line) for line in open(sys.argv[2])][:64]
deadline = time.monotonic() + 90
while True:
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=2) as r:
            if r.status == 200:
                ready = json.load(r)
                break
    except OSError:
        pass
    if time.monotonic() > deadline:
        sys.exit("serve never became ready")
    time.sleep(0.2)
# Only the math worker is alive now (the code worker was stopped).
assert ready["code"]["ready"] is False, ready
items = [{"response": row["response"], "gold": row["gold"]} for row in embedded]
request = urllib.request.Request(
    f"{base}/v1/grade",
    data=json.dumps({"items": items}).encode(),
    headers={"Content-Type": "application/json"},
)
with urllib.request.urlopen(request, timeout=60) as r:
    results = json.load(r)["results"]
fields = ("correct", "status", "format_valid", "extracted", "grader_version")
for i, (got, want) in enumerate(zip(results, embedded, strict=True)):
    for field in fields:
        assert got[field] == want[field], f"item {i} {field}: {got[field]!r} != {want[field]!r}"
print(f"POST /v1/grade: {len(results)} verdicts identical to embedded mode")
EOF
    "${PODMAN[@]}" healthcheck run "$RUN_ID-serve" || die "serve HEALTHCHECK (its /readyz) unhealthy"
    echo "serve HEALTHCHECK: healthy"
    "${PODMAN[@]}" stop -t "$STOP_TIMEOUT_S" "$RUN_ID-serve" >/dev/null 2>>"$WORK/podman.err"
    serve_rc=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$RUN_ID-serve")
    [ "$serve_rc" = 0 ] || die "serve exited $serve_rc after SIGTERM"
    echo "serve: SIGTERM -> exit 0"
}

# --- 7. SIGTERM -------------------------------------------------------------------------
log "SIGTERM, idle"
stop_t0=$(now)
"${PODMAN[@]}" stop -t "$STOP_TIMEOUT_S" "$RUN_ID-worker" >/dev/null 2>>"$WORK/podman.err"
STOP_S=$(elapsed "$stop_t0" "$(now)")
rc=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$RUN_ID-worker")
[ "$rc" = 0 ] || { worker_logs; die "worker exited $rc after SIGTERM (137 = killed at the timeout)"; }
echo "worker: SIGTERM -> exit 0 in $STOP_S s"
"${PODMAN[@]}" rm -f "$RUN_ID-worker" >/dev/null 2>>"$WORK/podman.err"

log "SIGTERM in the middle of a job"
# 40 copies of the sample (ids made unique), a worker without cache: real work.
python3 - examples/sample.jsonl "$WORK/big.jsonl" 40 <<'PY'
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
with open(sys.argv[2], "w") as out:
    for copy in range(int(sys.argv[3])):
        for row in rows:
            out.write(json.dumps({**row, "id": f"{row['id']}-{copy}"}) + "\n")
PY
start_worker() {  # $1: container name
    "${PODMAN[@]}" run -d "${NO_TIMER[@]}" --name "$1" --label "$TEST_LABEL" --network host \
        -e GRADEFLEET_BROKER_URL="$BROKER" -e GRADEFLEET_CACHE_URL=none \
        -e GRADEFLEET_METRICS_PORT="$METRICS_PORT" -e GRADEFLEET_METRICS_ADDR=127.0.0.1 \
        "$IMAGE" "${WORKER_CMD[@]}" --hostname "$1@%h" >/dev/null 2>>"$WORK/podman.err" \
        || { cat "$WORK/podman.err"; die "worker container $1 did not start"; }
}
start_worker "$RUN_ID-worker"
gf grade "$WORK/big.jsonl" -o "$WORK/big.fleet.jsonl" --broker "$BROKER" --quiet \
    --deadline-s 300 &
GRADE_PID=$!
# SIGTERM as soon as the worker has graded something.
python3 - "$METRICS_PORT" <<'PY' || die "the worker graded nothing within 120 s"
import sys
import time
import urllib.request

url = f"http://127.0.0.1:{sys.argv[1]}/metrics"
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
    except OSError:
        text = ""
    graded = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("gradefleet_rollouts_graded_total{")
    )
    if graded > 0:
        sys.exit(0)
    time.sleep(0.05)
sys.exit(1)
PY
"${PODMAN[@]}" stop -t "$STOP_TIMEOUT_S" "$RUN_ID-worker" >/dev/null 2>>"$WORK/podman.err"
rc=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$RUN_ID-worker")
[ "$rc" = 0 ] || { worker_logs; die "worker exited $rc after SIGTERM mid-job"; }
# Batches still queued, every queue (gradefleet grade sends to the bulk lane).
left=$(PYTHONPATH="$ROOT" python3 -c '
import sys

import redis

from workers.wire.lanes import QUEUES

r = redis.Redis(port=int(sys.argv[1]))
print(sum(r.llen(q) for q in QUEUES.values()))' "$REDIS_PORT")
unacked=$(redis-cli -p "$REDIS_PORT" hlen unacked)
echo "worker: SIGTERM mid-job -> exit 0; $left batches still queued, $unacked unacked"
[ "$unacked" = 0 ] || die "the stopped worker left $unacked batches unacknowledged (they would wait for the visibility timeout)"
[ "$left" != 0 ] || echo "NOTICE: the whole job was taken before SIGTERM landed (the restart below proves less)"
# A fresh worker takes over: the job completes, nothing lost or changed.
"${PODMAN[@]}" rm -f "$RUN_ID-worker" >/dev/null 2>>"$WORK/podman.err"
start_worker "$RUN_ID-worker"
wait "$GRADE_PID" || { worker_logs; die "the job did not complete after the worker was replaced"; }
gf grade "$WORK/big.jsonl" -o "$WORK/big.embedded.jsonl" --no-cache --quiet \
    || die "embedded grading failed"
compare "$WORK/big.fleet.jsonl" "$WORK/big.embedded.jsonl" \
    || die "verdicts across the restart differ from embedded mode"
"${PODMAN[@]}" stop -t "$STOP_TIMEOUT_S" "$RUN_ID-worker" >/dev/null 2>>"$WORK/podman.err"
rc=$("${PODMAN[@]}" inspect --format '{{.State.ExitCode}}' "$RUN_ID-worker")
[ "$rc" = 0 ] || { worker_logs; die "the replacement worker exited $rc after SIGTERM"; }
echo "replacement worker completed the job; SIGTERM -> exit 0"

log "summary"
echo "image size   $SIZE_MB MB ($IMAGE; base $BASE_MB MB)"
echo "build time   $BUILD_S s"
echo "cold start   $COLD_S s (container start -> first batch graded)"
echo "code worker  $CODE_S s (container start -> examples/code_sample.jsonl graded)"
echo "test-image: OK"
