"""Regenerate the vendored CRD schemas (JSON Schema) that tests/unit/test_deploy_k8s.py
validates the KEDA and Prometheus Operator objects against.

Source (pinned): the PyPI packages below, pydantic models generated from each
project's CRDs (cloudcoil-models-keda 2.16.1.0 <- KEDA v2.16.1;
cloudcoil-models-prometheus-operator 0.80.1.0 <- prometheus-operator v0.80.1). The
upstream CRD YAML lives in the projects' Git repositories, which this machine cannot
reach; the packages are the nearest registry copy. Run (network to PyPI needed):

    pip install --target /tmp/crd-models cloudcoil-models-keda==2.16.1.0 \
        cloudcoil-models-prometheus-operator==0.80.1.0
    PYTHONPATH=/tmp/crd-models python3 deploy/k8s/schemas/generate.py

Objects that declare properties get `additionalProperties: false` (as the API server's
strict field validation, and kubernetes-validate's strict mode, reject unknown fields);
descriptions are dropped to keep the files small.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCES = {
    "keda": "cloudcoil-models-keda==2.16.1.0",
    "prometheus-operator": "cloudcoil-models-prometheus-operator==0.80.1.0",
}


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items() if k not in ("description",)}
        if node.get("type") == "object" and "properties" in node:
            node.setdefault("additionalProperties", False)
        return node
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def main() -> None:
    from cloudcoil.models.keda.v1alpha1 import ScaledObject, TriggerAuthentication
    from cloudcoil.models.prometheus_operator.v1 import (
        PodMonitor,
        PrometheusRule,
        ServiceMonitor,
    )

    models = {
        ("keda", "keda.sh/v1alpha1", "ScaledObject"): ScaledObject,
        ("keda", "keda.sh/v1alpha1", "TriggerAuthentication"): TriggerAuthentication,
        ("prometheus-operator", "monitoring.coreos.com/v1", "PodMonitor"): PodMonitor,
        ("prometheus-operator", "monitoring.coreos.com/v1", "ServiceMonitor"): (
            ServiceMonitor
        ),
        ("prometheus-operator", "monitoring.coreos.com/v1", "PrometheusRule"): (
            PrometheusRule
        ),
    }
    for (project, api_version, kind), model in models.items():
        schema = _strict(model.model_json_schema(by_alias=True, mode="validation"))
        schema["$comment"] = f"generated from {SOURCES[project]} by generate.py"
        schema["x-gradefleet-apiVersion"] = api_version
        path = HERE / f"{kind.lower()}.json"
        path.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
        print(f"{path.name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
