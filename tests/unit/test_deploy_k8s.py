"""deploy/k8s: every overlay renders with `kubectl kustomize`, every object validates
against the Kubernetes OpenAPI schemas (kubernetes-validate, pinned version, strict) or
the vendored KEDA / Prometheus Operator CRD schemas, and the properties the fleet
relies on hold (probes, limits sized from the settings, non-root, grace period ≥ the
longest batch, the scaler reads the queue the worker consumes, one alert source)."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from workers.__main__ import build_parser, settings_from_args, worker_argv
from workers.fleet.metrics import QueueDepthCollector
from workers.fleet.settings import WorkerSettings
from workers.wire.lanes import LANE_QUEUES, LANES, queues_for

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
# The Kubernetes version the objects are validated for (the oldest we support).
K8S_VERSION = "1.30.0"
SECRET_NAME = "gradefleet-secrets"
# ConfigMap keys read by something other than WorkerSettings.from_env.
NON_WORKER_KEYS = {"GRADEFLEET_BROKER_HOST", "GRADEFLEET_BROKER_PORT"}


def _kustomize(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed (it renders the kustomize overlays)")
    proc = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@functools.cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    return tuple(_kustomize(overlay))


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    schemas = {}
    for path in (K8S / "schemas").glob("*.json"):
        schema = json.loads(path.read_text())
        kind = schema["properties"]["kind"]["anyOf"][0]["const"]
        schemas[(schema["x-gradefleet-apiVersion"], kind)] = schema
    return schemas


def validation_errors(obj: Mapping[str, Any]) -> list[str]:
    """Schema errors of one object (CRD schema if vendored, else Kubernetes')."""
    schema = crd_schemas().get((obj["apiVersion"], obj["kind"]))
    if schema is not None:
        validator = jsonschema.Draft202012Validator(schema)
        return [
            f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)
        ]
    try:
        kubernetes_validate.validate(dict(obj), K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [str(exc)]
    return []


def objects(overlay: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in rendered(overlay) if o["kind"] == kind]


def one(overlay: str, kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects(overlay, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{overlay}: {kind}/{name} x{len(found)}"
    return found[0]


def pod_specs(overlay: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in rendered(overlay):
        if obj["kind"] in ("Deployment", "StatefulSet"):
            yield obj["metadata"]["name"], obj["spec"]["template"]["spec"]


def worker_settings(overlay: str) -> WorkerSettings:
    """The settings a worker pod of `overlay` runs with (its ConfigMap's env)."""
    data = one(overlay, "ConfigMap", "gradefleet-config")["data"]
    return WorkerSettings.from_env(data)


def worker_container(overlay: str) -> dict[str, Any]:
    spec = one(overlay, "Deployment", "gradefleet-worker")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return dict(container)


def quantity_bytes(value: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 10**3, "M": 10**6, "G": 10**9}
    match = re.fullmatch(r"(\d+)([A-Za-z]*)", value)
    assert match, value
    return int(match[1]) * units.get(match[2], 1)


def pod_settings(overlay: str, name: str) -> WorkerSettings:
    """The settings the worker container of Deployment `name` runs with: its
    ConfigMaps' env, in order, then its options."""
    spec = one(overlay, "Deployment", name)["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env: dict[str, str] = {}
    for source in container["envFrom"]:
        env |= one(overlay, "ConfigMap", source["configMapRef"]["name"])["data"]
    args = container["args"]
    assert args[0] == "worker"
    return settings_from_args(build_parser().parse_args(args[1:]), env)


def consumed_queues(overlay: str, name: str = "gradefleet-worker") -> set[str]:
    """The queues a worker Deployment consumes: its real Celery argv."""
    argv = worker_argv(pod_settings(overlay, name))
    (arg,) = [a for a in argv if a.startswith("--queues=")]
    return set(arg.removeprefix("--queues=").split(","))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deploy_k8s_overlay_objects_validate(overlay):
    objs = rendered(overlay)
    assert len(objs) > 10
    errors = {
        f"{o['kind']}/{o['metadata']['name']}": validation_errors(o) for o in objs
    }
    assert not {k: v for k, v in errors.items() if v}
    for obj in objs:
        assert obj["metadata"].get("namespace", "gradefleet") == "gradefleet"


def test_deploy_k8s_validators_reject_broken_objects():
    # The validation above can fail: a misspelt field, a wrong type, in both kinds.
    deployment = json.loads(
        json.dumps(one(OVERLAYS[0], "Deployment", "gradefleet-worker"))
    )
    deployment["spec"]["replicaz"] = 3
    assert validation_errors(deployment)
    scaled = json.loads(
        json.dumps(one("self-contained", "ScaledObject", "gradefleet-worker"))
    )
    scaled["spec"]["minReplicaCount"] = "one"
    assert validation_errors(scaled)
    scaled["spec"]["minReplicaCount"] = 1
    scaled["spec"]["triggerz"] = scaled["spec"].pop("triggers")
    assert validation_errors(scaled)
    rule = json.loads(json.dumps(one("self-contained", "PrometheusRule", "gradefleet")))
    rule["spec"]["groups"][0]["rules"][0]["exprr"] = "1"
    assert validation_errors(rule)


def test_deploy_k8s_crd_schemas_are_pinned_with_their_source():
    schemas = crd_schemas()
    assert set(schemas) == {
        ("keda.sh/v1alpha1", "ScaledObject"),
        ("keda.sh/v1alpha1", "TriggerAuthentication"),
        ("monitoring.coreos.com/v1", "PodMonitor"),
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
    }
    for schema in schemas.values():
        assert re.search(r"==\d+\.\d+\.\d+\.\d+ by generate.py$", schema["$comment"])


# The one workload with more rights than the others: the code grader's sandbox needs
# root in a user namespace of the pod's own and these capabilities (and no others).
CODE_WORKER = "gradefleet-code-worker"
CODE_CAPABILITIES = ["SYS_ADMIN", "SETUID", "SETGID", "SETPCAP", "KILL", "NET_ADMIN"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deploy_k8s_every_container_is_locked_down(overlay):
    for name, spec in pod_specs(overlay):
        if name == CODE_WORKER:
            continue  # its own test, below
        assert spec["automountServiceAccountToken"] is False, name
        pod_sc = spec["securityContext"]
        assert pod_sc["runAsNonRoot"] is True, name
        assert pod_sc["runAsUser"] != 0, name
        assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault", name
        for container in spec["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["readOnlyRootFilesystem"] is True, name
            assert sc["capabilities"]["drop"] == ["ALL"], name
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container["resources"][kind]), name
            assert "livenessProbe" in container, name
            assert "readinessProbe" in container, name


def test_deploy_k8s_code_workers_have_exactly_the_sandbox_rights():
    overlays = [o for o in OVERLAYS if objects(o, "Deployment") and _has_code(o)]
    assert overlays == ["self-contained-code"]
    for overlay in overlays:
        deployment = one(overlay, "Deployment", CODE_WORKER)
        spec = deployment["spec"]["template"]["spec"]
        # Root only inside the pod's own user namespace; seccomp as everywhere.
        assert spec["hostUsers"] is False
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsUser"] == 0
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        (container,) = spec["containers"]
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"], "add": CODE_CAPABILITIES}
        assert "privileged" not in sc
        # The slot uids fit the 65,536 ids the user namespace maps.
        code = one(overlay, "ConfigMap", "gradefleet-code-config")["data"]
        settings = WorkerSettings.from_env(
            {**one(overlay, "ConfigMap", "gradefleet-config")["data"], **code}
        )
        assert settings.code_uid_base is not None
        assert settings.code_uid_base + 2 * 4096 < 65_536
        refs = [r["configMapRef"]["name"] for r in container["envFrom"]]
        assert refs == ["gradefleet-config", "gradefleet-code-config"]  # code wins
        # The fleet's broker, the code queues only; the math workers take the math
        # queues only, so code rollouts never reach them.
        assert pod_settings(overlay, CODE_WORKER).broker_url == (
            worker_settings(overlay).broker_url
        )
        assert consumed_queues(overlay, CODE_WORKER) == set(queues_for(LANES, ["code"]))
        assert consumed_queues(overlay) == set(LANE_QUEUES.values())
        # Memory: a math sandbox child and a code rollout per grading process.
        memory = quantity_bytes(container["resources"]["limits"]["memory"])
        assert memory >= settings.concurrency * 2 * settings.item_memory_bytes
        assert spec["terminationGracePeriodSeconds"] >= settings.longest_batch_s + 30
        monitor = one(overlay, "PodMonitor", "gradefleet-code-workers")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()


def _has_code(overlay: str) -> bool:
    return any(
        o["metadata"]["name"] == CODE_WORKER for o in objects(overlay, "Deployment")
    )


def test_deploy_k8s_image_user_matches_the_dockerfile():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\d+):(\d+)$", dockerfile, re.MULTILINE)
    for overlay in OVERLAYS:
        for name in ("gradefleet-worker", "gradefleet-service"):
            spec = one(overlay, "Deployment", name)["spec"]["template"]["spec"]
            sc = spec["securityContext"]
            assert (str(sc["runAsUser"]), str(sc["runAsGroup"])) == user


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deploy_k8s_worker_sized_from_its_settings(overlay):
    settings = worker_settings(overlay)
    container = worker_container(overlay)
    resources = container["resources"]
    memory = quantity_bytes(resources["limits"]["memory"])
    # Every sandbox child may reach its cap before it is killed; the pod's limit must
    # hold all of them plus the main and prefork processes.
    floor = settings.concurrency * settings.item_memory_bytes + 256 * 2**20
    assert memory >= floor, (memory, floor)
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert int(resources["requests"]["cpu"]) == settings.concurrency
    spec = one(overlay, "Deployment", "gradefleet-worker")["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] >= settings.longest_batch_s + 30


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deploy_k8s_worker_probes_and_metrics_dir(overlay):
    settings = worker_settings(overlay)
    container = worker_container(overlay)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == settings.metrics_port
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    ready = container["readinessProbe"]["exec"]["command"]
    assert ready[1:] == ["/opt/gradefleet/healthcheck.py", "--ready"]
    assert (ROOT / "deploy" / "healthcheck.py").is_file()
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    spec = one(overlay, "Deployment", "gradefleet-worker")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert settings.metrics_dir is not None
    assert "emptyDir" in volumes[mounts[settings.metrics_dir]]
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert container["args"] == ["worker", "--kinds", "math"]


def test_deploy_k8s_configmap_keys_are_read_by_the_worker():
    class Recording(dict[str, str]):
        read: set[str]

        def get(self, key, default=None):
            self.read.add(key)
            return super().get(key, default)

    for overlay in OVERLAYS:
        data = Recording(one(overlay, "ConfigMap", "gradefleet-config")["data"])
        data.read = set()
        WorkerSettings.from_env(data)
        unread = set(data) - data.read - NON_WORKER_KEYS
        assert not unread, f"{overlay}: {unread} are read by nothing"


def test_deploy_k8s_scaler_reads_the_queue_the_worker_consumes():
    for overlay in OVERLAYS:
        queues = consumed_queues(overlay)
        scalers = objects(overlay, "ScaledObject")
        hpas = objects(overlay, "HorizontalPodAutoscaler")
        assert len(scalers) + len(hpas) == 1, overlay
        env = {e["name"] for e in worker_container(overlay).get("env", [])}
        env |= set(one(overlay, "ConfigMap", "gradefleet-config")["data"])
        for scaler in scalers:
            spec = scaler["spec"]
            assert spec["scaleTargetRef"]["name"] == "gradefleet-worker"
            assert 0 <= spec["minReplicaCount"] < spec["maxReplicaCount"]
            assert spec["cooldownPeriod"] > 0
            triggers = spec["triggers"]
            assert {t["type"] for t in triggers} == {"redis"}
            # Every consumed queue has a trigger, and no trigger reads another list.
            assert {t["metadata"]["listName"] for t in triggers} == queues
            for trigger in triggers:
                meta = trigger["metadata"]
                assert int(meta["listLength"]) > 0
                assert {meta["hostFromEnv"], meta["portFromEnv"]} <= env
        for hpa in hpas:
            spec = hpa["spec"]
            assert spec["scaleTargetRef"]["name"] == "gradefleet-worker"
            exported = {f.name for f in QueueDepthCollector(None, ()).describe()}  # type: ignore[arg-type]
            hpa_queues = set()
            for metric in spec["metrics"]:
                assert metric["external"]["metric"]["name"] in exported
                labels = metric["external"]["metric"]["selector"]["matchLabels"]
                assert labels["state"] == "ready"
                hpa_queues.add(labels["queue"])
            assert hpa_queues == queues


def test_deploy_k8s_hpa_and_keda_aim_at_the_same_backlog_per_pod():
    keda = yaml.safe_load((K8S / "autoscaling/keda/scaledobject.yaml").read_text())
    hpa = yaml.safe_load((K8S / "autoscaling/hpa/hpa.yaml").read_text())
    keda_targets = {
        t["metadata"]["listName"]: int(t["metadata"]["listLength"])
        for t in keda["spec"]["triggers"]
    }
    hpa_targets = {
        m["external"]["metric"]["selector"]["matchLabels"]["queue"]: int(
            m["external"]["target"]["averageValue"]
        )
        for m in hpa["spec"]["metrics"]
    }
    assert keda_targets == hpa_targets
    # The interactive lane scales the fleet first: the smaller backlog per pod.
    interactive, bulk = (LANE_QUEUES[lane] for lane in ("interactive", "bulk"))
    assert keda_targets[interactive] < keda_targets[bulk]
    assert keda["spec"]["maxReplicaCount"] == hpa["spec"]["maxReplicas"]
    adapter = yaml.safe_load(
        (K8S / "autoscaling/hpa/prometheus-adapter-values.yaml").read_text()
    )
    (rule,) = adapter["rules"]["external"]
    assert {rule["name"]["as"]} == {
        m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]
    }
    # Every node reports the same shared queue: max, never sum.
    assert rule["metricsQuery"].startswith("max(")


def test_deploy_k8s_prometheusrule_is_generated_from_alerts_yml():
    spec = importlib.util.spec_from_file_location("gen", K8S / "gen_prometheusrule.py")
    assert spec is not None
    assert spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    alerts = (ROOT / "deploy/prometheus/alerts.yml").read_text()
    assert (K8S / "base/prometheusrule.yaml").read_text() == gen.render(alerts)
    for overlay in OVERLAYS:
        rule = one(overlay, "PrometheusRule", "gradefleet")
        assert rule["spec"]["groups"] == yaml.safe_load(alerts)["groups"]


def test_deploy_k8s_monitors_match_the_alerts_and_ports():
    alerts = (ROOT / "deploy/prometheus/alerts.yml").read_text()
    jobs = set(re.findall(r'up\{job="([^"]+)"\}', alerts))
    for overlay in OVERLAYS:
        monitor = one(overlay, "PodMonitor", "gradefleet-workers")
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        relabel = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
        assert {r["replacement"] for r in relabel} == jobs
        ports = {p["name"] for p in worker_container(overlay)["ports"]}
        assert endpoint["port"] in ports
        pod_labels = one(overlay, "Deployment", "gradefleet-worker")["spec"][
            "template"
        ]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        service = one(overlay, "Service", "gradefleet")
        svc_monitor = one(overlay, "ServiceMonitor", "gradefleet-service")
        assert (
            svc_monitor["spec"]["selector"]["matchLabels"].items()
            <= service["metadata"]["labels"].items()
        )
        (svc_endpoint,) = svc_monitor["spec"]["endpoints"]
        assert svc_endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return selector.items() <= labels.items()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deploy_k8s_network_policies(overlay):
    policies = objects(overlay, "NetworkPolicy")
    deny = one(overlay, "NetworkPolicy", "gradefleet-default-deny")["spec"]
    assert deny["podSelector"] == {}
    assert set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert "ingress" not in deny
    assert "egress" not in deny
    pods = {
        name: one(overlay, kind, name)["spec"]["template"]["metadata"]["labels"]
        for kind in ("Deployment", "StatefulSet")
        for name in (o["metadata"]["name"] for o in objects(overlay, kind))
    }
    open_ingress = []
    for policy in policies:
        spec = policy["spec"]
        for rule in spec.get("ingress", []):
            if not rule.get("from"):
                selected = [
                    n for n, labels in pods.items()
                    if _selects(spec["podSelector"].get("matchLabels", {}), labels)
                ]  # fmt: skip
                open_ingress.append((selected, rule["ports"]))
    # Only the service is reachable from anywhere, and only on its port.
    assert open_ingress == [
        (["gradefleet-service"], [{"protocol": "TCP", "port": 8000}])
    ]
    # Workers: egress to Redis (and DNS) only.
    worker_labels = pods["gradefleet-worker"]
    for policy in policies:
        spec = policy["spec"]
        if not _selects(spec["podSelector"].get("matchLabels", {}), worker_labels):
            continue
        for rule in spec.get("egress", []):
            ports = {p["port"] for p in rule["ports"]}
            assert ports in ({53}, {6379}), (policy["metadata"]["name"], ports)
            for peer in rule["to"]:
                if "ipBlock" in peer:
                    assert overlay == "managed-redis"
                    continue
                target = peer.get("podSelector", {}).get("matchLabels", {})
                if ports == {6379}:
                    assert target.get("gradefleet.io/redis") == "true"
                    assert "namespaceSelector" not in peer
    redis = [n for n, labels in pods.items() if labels.get("gradefleet.io/redis")]
    assert sorted(redis) == (
        [] if overlay == "managed-redis" else ["gradefleet-broker", "gradefleet-cache"]
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deploy_k8s_redis_policies(overlay):
    if overlay == "managed-redis":
        assert not objects(overlay, "StatefulSet")
        data = one(overlay, "ConfigMap", "gradefleet-config")["data"]
        assert "GRADEFLEET_BROKER_URL" not in data  # from the Secret, with its password
        return
    args = {
        name: one(overlay, "StatefulSet", name)["spec"]["template"]["spec"][
            "containers"
        ][0]["args"]
        for name in ("gradefleet-broker", "gradefleet-cache")
    }
    broker, cache = (" ".join(map(str, a)) for a in args.values())
    assert "--maxmemory-policy noeviction" in broker
    assert "--appendonly yes" in broker
    assert "--maxmemory-policy allkeys-lru" in cache
    assert "--appendonly no" in cache
    assert "--save " in cache
    claims = one(overlay, "StatefulSet", "gradefleet-broker")["spec"][
        "volumeClaimTemplates"
    ]
    assert claims[0]["metadata"]["name"] == "data"


def test_deploy_k8s_pdbs_select_workloads():
    for overlay in OVERLAYS:
        for pdb in objects(overlay, "PodDisruptionBudget"):
            name = pdb["metadata"]["name"]
            labels = one(overlay, "Deployment", name)["spec"]["template"]["metadata"][
                "labels"
            ]
            assert _selects(pdb["spec"]["selector"]["matchLabels"], labels)


KEY_SECRET_KEY = "signing-key"


def gradefleet_containers(
    overlay: str,
) -> Iterator[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """Every container of `overlay` that runs the gradefleet image (workers, the
    service, any producer Job or CronJob): workload name, container, pod volumes."""
    base = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    (image,) = [i["newName"] for i in base["images"] if i["name"] == "gradefleet"]
    for obj in rendered(overlay):
        spec = obj.get("spec", {})
        if obj["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if "template" not in spec:
            continue
        pod = spec["template"]["spec"]
        for container in pod["containers"] + pod.get("initContainers", []):
            if container["image"].split(":")[0] == image:
                yield obj["metadata"]["name"], container, pod.get("volumes", [])


def _env_read_by(reader: Any) -> set[str]:
    class Recording(dict[str, str]):
        def get(self, key, default=None):
            read.add(key)
            return super().get(key, default)

    read: set[str] = set()
    reader(Recording())
    return read


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deploy_k8s_every_gradefleet_container_holds_the_fleet_key(overlay):
    from workers.wire.signing import keyring_from_env

    # The variable both sides read (worker settings; producer CLI and service).
    assert "GRADEFLEET_SIGNING_KEY_FILE" in _env_read_by(WorkerSettings.from_env)
    assert "GRADEFLEET_SIGNING_KEY_FILE" in _env_read_by(keyring_from_env)
    found = list(gradefleet_containers(overlay))
    assert {"gradefleet-worker", "gradefleet-service"} <= {n for n, _, _ in found}
    for name, container, volumes in found:
        env = {e["name"]: e for e in container.get("env", [])}
        path = Path(env["GRADEFLEET_SIGNING_KEY_FILE"]["value"])
        assert "GRADEFLEET_SIGNING_KEY" not in env, name  # a file, never env
        (mount,) = [
            m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent)
        ]
        assert mount.get("readOnly") is True, name
        (volume,) = [v for v in volumes if v["name"] == mount["name"]]
        # A required Secret: no key, no pod (never a fleet anyone can forge).
        secret = volume["secret"]
        assert secret["secretName"] == SECRET_NAME, name
        assert secret.get("optional", False) is False, name
        assert secret["items"] == [{"key": KEY_SECRET_KEY, "path": path.name}], name
        # Readable by the pod's user or group only (the pod sets fsGroup).
        assert secret["defaultMode"] & 0o007 == 0, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deploy_k8s_no_key_value_committed(overlay):
    assert not objects(overlay, "Secret"), "secrets are created by the operator"
    for obj in rendered(overlay):
        text = json.dumps(obj)
        assert not re.search(r"[0-9a-fA-F]{32,}", text), obj["metadata"]["name"]
        assert '"GRADEFLEET_SIGNING_KEY"' not in text, obj["metadata"]["name"]
    data = one(overlay, "ConfigMap", "gradefleet-config")["data"]
    assert not [k for k in data if k.startswith("GRADEFLEET_SIGNING_KEY")]


def test_deploy_k8s_secrets_are_referenced_by_documented_keys():
    readme = (ROOT / "deploy" / "README.md").read_text()
    for overlay in OVERLAYS:
        text = json.dumps(rendered(overlay))
        assert not objects(overlay, "Secret"), "secrets are created by the operator"
        refs = re.findall(
            r'"secretKeyRef": \{"key": "([^"]+)", "name": "([^"]+)"', text
        )
        refs += [
            (r["key"], r["name"])
            for o in objects(overlay, "TriggerAuthentication")
            for r in o["spec"]["secretTargetRef"]
        ]
        refs += [
            (item["key"], volume["secret"]["secretName"])
            for _, spec in pod_specs(overlay)
            for volume in spec.get("volumes", [])
            if "secret" in volume
            for item in volume["secret"]["items"]
        ]
        assert (KEY_SECRET_KEY, SECRET_NAME) in refs
        assert refs
        for key, name in refs:
            assert name == SECRET_NAME
            assert f"`{key}`" in readme, f"deploy/README.md does not document {key}"


def test_deploy_k8s_service_command():
    from producer.cli import cli

    for overlay in OVERLAYS:
        (container,) = one(overlay, "Deployment", "gradefleet-service")["spec"][
            "template"
        ]["spec"]["containers"]
        args = container["args"]
        assert args[0] == "serve"
        serve = cli.commands["serve"]
        flags = {opt for p in serve.params for opt in getattr(p, "opts", [])}
        assert {a for a in args[1:] if a.startswith("--")} <= flags
        envvars = {p.envvar for p in serve.params if isinstance(p.envvar, str)}
        envvars.add("GRADEFLEET_SIGNING_KEY_FILE")  # serve reads the key itself
        assert {e["name"] for e in container["env"]} <= envvars
