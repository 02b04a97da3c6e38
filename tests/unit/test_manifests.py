"""infra/ against the real schemas, so that a misspelt or misplaced field fails here and not on a cluster.

- RayCluster, RayJob, RayCronJob and RayService documents: the pinned KubeRay CRDs (../shared/kuberay-crds/v1.6.2), each one's
  `spec.versions[v1].schema.openAPIV3Schema` made closed: an object that lists its `properties` and does not
  set `x-kubernetes-preserve-unknown-fields` accepts no other key. (The API server silently prunes an
  unknown field of a custom resource, so `rayStartParms` would be dropped there, not refused.) Their
  `metadata` is checked as Kubernetes' ObjectMeta. CEL rules (`x-kubernetes-validations`) are not run.
- Every other kind: Kubernetes' own strict JSON schemas (kubernetes-validate, offline) for the oldest and
  the newest Kubernetes supported: 1.32 (the CronJob's kubectl) and the newest that kubernetes-validate bundles.
- Documents that are no file of their own: the ConfigMaps the kustomization generates, the RayJob inside
  the ConfigMap `xh-score-rayjob`, and the RayJob the CronJob renders from it.
- infra/aws/cluster.yaml: Ray's cluster-launcher schema, and each node_config against EC2 RunInstances.

Each validator is shown to reject a misspelt field, so that none of these checks can pass by accepting anything.
"""

from __future__ import annotations

import copy
import functools
import os
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version, major_minor

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
K8S = INFRA / "k8s"
KUBERAY_CRDS = ROOT.parent / "shared" / "kuberay-crds"
KUBERAY_VERSION = "v1.6.2"  # the oldest KubeRay the manifests support (authOptions.secretName)
CRD_FILES = {
    "RayCluster": "ray.io_rayclusters.yaml",
    "RayJob": "ray.io_rayjobs.yaml",
    "RayCronJob": "ray.io_raycronjobs.yaml",  # alpha, behind the operator's RayCronJob feature gate
    "RayService": "ray.io_rayservices.yaml",
}
K8S_VERSIONS = ("1.32", major_minor(latest_version()))


@pytest.fixture(scope="session")
def kuberay_crds() -> Path:
    """The pinned CRDs beside the project; absent, tests skip with the reason, except under CI where they fail."""
    folder = KUBERAY_CRDS / KUBERAY_VERSION
    if not all((folder / name).is_file() for name in CRD_FILES.values()):
        message = f"KubeRay CRDs {folder} are absent (they sit beside the project as ../shared/kuberay-crds)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + "; under CI they must be present")
        pytest.skip(message)
    return folder


# --- the documents -----------------------------------------------------------------------------


def _yaml_docs(text: str) -> list:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def _kustomization() -> dict:
    return _yaml_docs((K8S / "kustomization.yaml").read_text())[0]


def _generated_config_maps() -> list[dict]:
    """The ConfigMaps `kubectl kustomize` makes from configMapGenerator (files only, fixed names)."""
    kustomization = _kustomization()
    assert kustomization["generatorOptions"]["disableNameSuffixHash"] is True
    maps = []
    for generator in kustomization["configMapGenerator"]:
        assert set(generator) <= {"name", "files"}, f"this test models only `files`: {generator}"
        data = {}
        for entry in generator["files"]:
            key, file = entry.split("=", 1) if "=" in entry else (Path(entry).name, entry)
            data[key] = (K8S / file).read_text()
        metadata = {"name": generator["name"], "namespace": kustomization["namespace"]}
        maps.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    return maps


def _documents() -> list[tuple[str, dict]]:
    """(label, document) for every Kubernetes object under infra/k8s and every generated or embedded one."""
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        for index, doc in enumerate(_yaml_docs(path.read_text())):
            if isinstance(doc, dict) and "apiVersion" in doc and doc.get("kind") != "Kustomization":
                found.append((f"{path.relative_to(K8S)}#{index}:{doc['kind']}", doc))
    for config_map in _generated_config_maps():
        name = config_map["metadata"]["name"]
        found.append((f"kustomization:ConfigMap/{name}", config_map))
        for key, text in config_map["data"].items():
            embedded = _yaml_docs(text) if key.endswith((".yaml", ".yml")) else []
            for doc in embedded:
                if isinstance(doc, dict) and doc.get("kind") in CRD_FILES:
                    found.append((f"kustomization:ConfigMap/{name}[{key}]:{doc['kind']}", doc))
    return found


DOCUMENTS = _documents()
RAY_DOCUMENTS = [(label, doc) for label, doc in DOCUMENTS if doc["apiVersion"].startswith("ray.io/")]
K8S_DOCUMENTS = [(label, doc) for label, doc in DOCUMENTS if not doc["apiVersion"].startswith("ray.io/")]


def _one(kind: str) -> dict:
    docs = [doc for label, doc in DOCUMENTS if doc["kind"] == kind and not label.startswith("kustomization:")]
    assert docs, f"no {kind} under infra/k8s"
    return copy.deepcopy(docs[0])


# --- validators --------------------------------------------------------------------------------


def closed(schema: dict) -> dict:
    """An OpenAPI v3 structural schema (a CRD's) as a JSON schema that refuses unknown fields.

    An object schema with `properties` gets `additionalProperties: false` unless it sets
    `x-kubernetes-preserve-unknown-fields` (or already says what other keys may hold, a map's schema);
    `nullable` admits null; `x-kubernetes-int-or-string` admits an integer or a string.
    """
    out = dict(schema)
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in out:
        out["properties"] = {name: closed(sub) for name, sub in out["properties"].items()}
        if out.get("x-kubernetes-preserve-unknown-fields") is not True and "additionalProperties" not in out:
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = closed(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = closed(out["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in out:
            out[key] = [closed(sub) for sub in out[key]]
    if isinstance(out.get("not"), dict):
        out["not"] = closed(out["not"])
    return out


@functools.cache
def _crd_validator(folder: Path, kind: str) -> tuple[str, jsonschema.Draft7Validator]:
    # libyaml when present: the CRDs are 40,000 lines, which the pure-Python loader takes seconds over
    crd = yaml.load((folder / CRD_FILES[kind]).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["spec"]["names"]["kind"] == kind
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    assert version["served"], f"{kind} v1 is not served by KubeRay {KUBERAY_VERSION}"
    schema = closed(version["schema"]["openAPIV3Schema"])
    return f"{crd['spec']['group']}/v1", jsonschema.Draft7Validator(schema)


def crd_errors(doc: dict, folder: Path) -> list[str]:
    """Every way a RayCluster/RayJob/RayCronJob breaks the closed CRD schema, and its metadata Kubernetes' ObjectMeta."""
    api_version, validator = _crd_validator(folder, doc["kind"])
    errors = [] if doc["apiVersion"] == api_version else [f"apiVersion {doc['apiVersion']} is not {api_version}"]
    for error in sorted(validator.iter_errors(doc), key=lambda e: [str(p) for p in e.absolute_path]):
        errors.append(f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}")
    # A custom resource's metadata is an ObjectMeta like any other: check it with Kubernetes' own schema.
    for version in K8S_VERSIONS:
        errors += kubernetes_errors(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc.get("metadata", {})}, version
        )
    return errors


def kubernetes_errors(doc: dict, version: str) -> list[str]:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"Kubernetes {version}: {'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"]
    return []


# --- every document passes ---------------------------------------------------------------------


def test_every_yaml_file_under_infra_k8s_is_validated_or_is_data_the_kustomization_ships():
    shipped = {file for cm in _generated_config_maps() for file in _config_map_files(cm["metadata"]["name"])}
    for path in sorted(K8S.rglob("*.yaml")):
        docs = _yaml_docs(path.read_text())
        objects = [d for d in docs if isinstance(d, dict) and "apiVersion" in d]
        relative = str(path.relative_to(K8S))
        assert objects or relative in shipped, f"{relative} is neither Kubernetes objects nor ConfigMap data"
    assert {label.split("#")[0] for label, _ in DOCUMENTS} >= set(_kustomization()["resources"])


def _config_map_files(name: str) -> list[str]:
    generator = next(g for g in _kustomization()["configMapGenerator"] if g["name"] == name)
    return [entry.split("=", 1)[-1] for entry in generator["files"]]


@pytest.mark.parametrize("label, doc", RAY_DOCUMENTS, ids=[label for label, _ in RAY_DOCUMENTS])
def test_ray_documents_pass_the_closed_kuberay_crd_schema(label, doc, kuberay_crds):
    assert crd_errors(doc, kuberay_crds) == []


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("label, doc", K8S_DOCUMENTS, ids=[label for label, _ in K8S_DOCUMENTS])
def test_kubernetes_documents_pass_the_strict_kubernetes_schema(label, doc, version):
    assert kubernetes_errors(doc, version) == []


def test_the_rayjob_the_cronjob_renders_passes_the_crd_schema(tmp_path, kuberay_crds):
    cron = _one("CronJob")
    render = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"][0]
    assert render["name"] == "render"
    output = tmp_path / "rayjob.yaml"
    env = {**os.environ, "TEMPLATE": str(K8S / "rayjob-score.yaml"), "OUTPUT": str(output)}
    done = subprocess.run(["sh", "-c", render["command"][-1]], env=env, capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    job = yaml.safe_load(output.read_text())
    assert job["metadata"]["name"].startswith("xh-score-") and crd_errors(job, kuberay_crds) == []


def test_the_raycronjob_runs_the_rayjob_the_cronjob_applies():
    """The two schedulers run one job: the RayCronJob's template is rayjob-score.yaml's spec, with the
    deletion of finished RayJobs (the CronJob deletes them itself: next test)."""
    (template,) = _yaml_docs((K8S / "rayjob-score.yaml").read_text())
    spec = dict(_one("RayCronJob")["spec"]["jobTemplate"])
    rules = spec.pop("deletionStrategy")["deletionRules"]
    assert spec == template["spec"]
    assert {(r["policy"], r["condition"]["jobStatus"]) for r in rules} == {
        ("DeleteSelf", "SUCCEEDED"),
        ("DeleteSelf", "FAILED"),
    }


def test_the_cronjob_deletes_the_rayjobs_of_earlier_nights_but_the_last_three(tmp_path):
    import datetime as dt

    steps = _one("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["initContainers"]
    assert [s["name"] for s in steps] == ["render", "clean", "apply", "wait"]
    env = {**os.environ, "TEMPLATE": str(K8S / "rayjob-score.yaml"), "OUTPUT": str(tmp_path / "rayjob.yaml")}
    done = subprocess.run(["sh", "-c", steps[0]["command"][-1]], env=env, capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, done.stderr
    old = [d for d in yaml.safe_load_all((tmp_path / "old-rayjobs.yaml").read_text()) if d]
    today = dt.datetime.now(dt.UTC).date()
    names = [f"xh-score-{today - dt.timedelta(days=n):%Y%m%d}" for n in range(3, 41)]
    assert [(d["kind"], d["metadata"]["name"]) for d in old] == [("RayJob", n) for n in names]
    assert steps[1]["args"][0] == "delete" and "--ignore-not-found" in steps[1]["args"]
    assert steps[1]["args"][-1] == "/work/old-rayjobs.yaml"
    role = next(d for d in _yaml_docs((K8S / "cronjob-score.yaml").read_text()) if d["kind"] == "Role")
    assert "delete" in role["rules"][0]["verbs"]


def test_both_scheduled_scoring_jobs_are_incremental_with_the_cluster_config():
    """Each scheduler's entrypoint, its --config read from the ConfigMap's file: a valid config that scores
    only the files the model version has not scored."""
    import shlex

    from xh.config import load_config

    (template,) = _yaml_docs((K8S / "rayjob-score.yaml").read_text())
    for spec in (template["spec"], _one("RayCronJob")["spec"]["jobTemplate"]):
        words = shlex.split(spec["entrypoint"])
        assert words[:2] == ["xh", "score"], words
        config = words[words.index("--config") + 1]
        assert config == "/etc/xh/cluster.yaml"  # where raycluster.yaml mounts the ConfigMap xh-config
        overrides = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        cfg = load_config(K8S / "xh-config" / "cluster.yaml", overrides)
        assert cfg.score.incremental and not cfg.score.replace and cfg.score.input


def test_the_rayservice_serves_xh_serve_app_with_a_valid_config_on_a_cluster_like_the_projects():
    """serveConfigV2 imports `xh serve`'s application builder, whose args (the mounted project config and
    overrides) give a valid config; its cluster runs the project's image, Ray version, auth and config."""
    from xh.config import load_config

    service, cluster = _one("RayService"), _one("RayCluster")
    (app,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    assert app["import_path"] == "xh.serve:app_builder" and app["args"]["config"] == "/etc/xh/cluster.yaml"
    cfg = load_config(K8S / "xh-config" / "cluster.yaml", app["args"]["set"])
    assert cfg.serve.model.endswith("@champion") and cfg.serve.host == "0.0.0.0"
    # Serve adds replicas of both halves under load, within what the worker groups can hold
    from xh.serve import deployment_options

    options = deployment_options(cfg, use_gpu=True)
    groups = {g["groupName"]: g for g in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    for name in ("graphs", "model"):
        scaling = options[name]["autoscaling_config"]
        assert scaling["max_replicas"] > scaling["min_replicas"] >= 1, (name, scaling)
    assert options["model"]["autoscaling_config"]["max_replicas"] <= groups["gpu"]["maxReplicas"]
    ours = service["spec"]["rayClusterConfig"]
    for key in ("rayVersion", "authOptions"):
        assert ours[key] == cluster["spec"][key]
    pods = [ours["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in ours["workerGroupSpecs"]]
    for pod in pods:
        assert pod["serviceAccountName"] == cluster["spec"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"]
        (container,) = pod["containers"]
        assert container["image"] == _head(cluster)["image"]
        assert {"name": "xh-config", "mountPath": "/etc/xh", "readOnly": True} in container["volumeMounts"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_what_kubectl_kustomize_renders_passes_the_same_schemas(kuberay_crds):
    rendered = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    for doc in _yaml_docs(rendered.stdout):
        if doc["apiVersion"].startswith("ray.io/"):
            assert crd_errors(doc, kuberay_crds) == [], doc["metadata"]
        else:
            assert [e for v in K8S_VERSIONS for e in kubernetes_errors(doc, v)] == [], doc["metadata"]


# --- the validators refuse what they should ----------------------------------------------------


def _rename(mapping: dict, old: str, new: str) -> None:
    assert old in mapping, f"no {old!r} to misspell"
    mapping[new] = mapping.pop(old)


def _head(cluster: dict) -> dict:
    return cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]


def _submitter(job: dict) -> dict:
    return job["spec"]["submitterPodTemplate"]["spec"]["containers"][0]


def _cron_container(cron: dict) -> dict:
    return cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]


# (kind, where the field is, the field, its misspelling)
MISSPELT = [
    ("RayCluster", lambda d: d["spec"]["headGroupSpec"], "rayStartParams", "rayStartParms"),
    ("RayCluster", _head, "volumeMounts", "volumeMount"),
    ("RayCluster", lambda d: d["spec"]["workerGroupSpecs"][0], "maxReplicas", "maxReplica"),
    ("RayCluster", lambda d: d["metadata"], "labels", "label"),
    ("RayJob", _submitter, "resources", "resource"),
    ("RayJob", lambda d: d["spec"], "entrypoint", "entryPoint"),
    ("RayCronJob", lambda d: d["spec"], "schedule", "schedul"),
    ("RayCronJob", lambda d: d["spec"]["jobTemplate"], "entrypoint", "entryPoint"),
    ("RayService", lambda d: d["spec"], "serveConfigV2", "serveConfigv2"),
    ("RayService", lambda d: d["spec"]["rayClusterConfig"]["headGroupSpec"], "rayStartParams", "rayStartParms"),
    ("CronJob", _cron_container, "args", "arg"),
    ("CronJob", lambda d: d["spec"], "concurrencyPolicy", "concurrency"),
]


@pytest.mark.parametrize("kind, where, field, misspelt", MISSPELT, ids=[f"{c[0]}-{c[3]}" for c in MISSPELT])
def test_a_misspelt_field_in_a_real_manifest_fails_validation(kind, where, field, misspelt, request):
    doc = _one(kind)
    _rename(where(doc), field, misspelt)
    refused = f"'{misspelt}' was unexpected"
    if kind in CRD_FILES:
        errors = crd_errors(doc, request.getfixturevalue("kuberay_crds"))  # only these need the CRDs
        assert any(refused in e for e in errors), errors
    else:
        for version in K8S_VERSIONS:
            errors = kubernetes_errors(doc, version)
            assert errors and refused in errors[0], errors


def test_int_or_string_fields_of_the_crd_take_an_integer_or_a_string_and_nothing_else(kuberay_crds):
    cluster = _one("RayCluster")
    limits = _head(cluster)["resources"]["limits"]
    for value, ok in ((4, True), ("4", True), ("500m", True), (4.5, False), ([4], False), ({"cores": 4}, False)):
        limits["cpu"] = value
        assert (crd_errors(cluster, kuberay_crds) == []) is ok, value


def test_the_closed_schema_keeps_open_what_kubernetes_keeps_open():
    schema = closed(
        {
            "type": "object",
            "properties": {
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "free": {"type": "object", "properties": {}, "x-kubernetes-preserve-unknown-fields": True},
                "fixed": {"type": "object", "properties": {"a": {"type": "string", "nullable": True}}},
            },
        }
    )
    validator = jsonschema.Draft7Validator(schema)
    assert validator.is_valid({"labels": {"any": "x"}, "free": {"b": 1}, "fixed": {"a": None}})
    assert not validator.is_valid({"fixed": {"b": "x"}}) and not validator.is_valid({"other": 1})
    assert not validator.is_valid({"labels": {"any": 1}})


# --- the AWS cluster launcher YAML -------------------------------------------------------------


def _aws_config() -> dict:
    return _yaml_docs((INFRA / "aws" / "cluster.yaml").read_text())[0]


def _run_instances_errors(node_config: dict) -> str:
    """What EC2 RunInstances would refuse in a node_config (Ray passes it through; it adds the counts)."""
    import botocore.session
    from botocore.validate import ParamValidator

    shape = botocore.session.get_session().get_service_model("ec2").operation_model("RunInstances").input_shape
    return ParamValidator().validate({**node_config, "MinCount": 1, "MaxCount": 1}, shape).generate_report()


def test_aws_node_configs_are_valid_ec2_run_instances_parameters():
    for name, node_type in _aws_config()["available_node_types"].items():
        assert _run_instances_errors(node_type["node_config"]) == "", name


def test_a_misspelt_key_in_the_aws_cluster_yaml_fails_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = _aws_config()
    _rename(config, "max_workers", "max_worker")
    with pytest.raises(jsonschema.ValidationError, match="max_worker"):
        validate_config(prepare_config(config))
    config = _aws_config()
    _rename(config["available_node_types"]["cpu_worker"], "min_workers", "min_worker")
    with pytest.raises(jsonschema.ValidationError, match="min_worker"):
        validate_config(prepare_config(config))
    node_config = _aws_config()["available_node_types"]["cpu_worker"]["node_config"]
    _rename(node_config, "InstanceType", "InstanceTyp")
    assert "InstanceTyp" in _run_instances_errors(node_config)
