"""infra/: every YAML parses, and the pieces agree with each other and with the repository.

What is checked: Kubernetes kinds and API versions; one image (the project's, tagged with its version)
in every manifest, the Dockerfile and the AWS cluster launcher YAML; every Ray pod has a memory-backed
/dev/shm; every entrypoint is an `xh` command; the CronJob renders and
applies the batch-scoring RayJob and ends as soon as the RayJob does, failing unless its Ray job
succeeded (its containers run against a stand-in kubectl); the RBAC lets it; no secret travels in a
RayJob, and S3 keys reach pods only as a mounted file; the AWS YAML passes Ray's own schema; the
Dockerfile pins torch and installs the project; submit.sh is valid shell, needs a token, and keeps
credentials off its command line and out of its output. Schemas: test_manifests.py.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from xh.config import load_config

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
K8S = INFRA / "k8s"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"ghcr.io/transformer-xh/transformer-xh-ray:{VERSION}"
# Tool images that are not the project's: pinned, but allowed to differ.
TOOL_IMAGES = ("busybox:", "registry.k8s.io/kubectl:", "postgres:")
YAML_FILES = sorted(p for p in INFRA.rglob("*") if p.suffix in (".yaml", ".yml"))


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _manifests() -> list[dict]:
    """Every Kubernetes object under infra/k8s (the kustomization and the project config are not objects)."""
    return [
        d for p in sorted(K8S.glob("*.yaml")) for d in _docs(p) if "apiVersion" in d and d["kind"] != "Kustomization"
    ]


def _one(kind: str, name: str | None = None) -> dict:
    found = [m for m in _manifests() if m["kind"] == kind and (name is None or m["metadata"].get("name") == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _pod_specs(obj) -> list[dict]:
    """Every pod spec inside an object (Deployment, CronJob, RayCluster groups, RayJob submitters...)."""
    found = []
    if isinstance(obj, dict):
        if "containers" in obj:
            found.append(obj)
        for value in obj.values():
            found += _pod_specs(value)
    elif isinstance(obj, list):
        for value in obj:
            found += _pod_specs(value)
    return found


def _containers(obj) -> list[dict]:
    return [c for spec in _pod_specs(obj) for c in spec.get("initContainers", []) + spec["containers"]]


def _rayjobs() -> dict[str, dict]:
    return {p.name: _docs(p)[0] for p in sorted(K8S.glob("rayjob-*.yaml"))}


def _command_of(entrypoint: str) -> str:
    words = shlex.split(entrypoint)
    assert words[0] == "xh", f"entrypoint {entrypoint!r} is not `xh COMMAND ...`"
    return words[1]


# --- YAML, kinds and API versions ------------------------------------------------------------


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(INFRA)))
def test_every_yaml_file_parses_into_mappings(path):
    docs = _docs(path)
    assert docs and all(isinstance(d, dict) for d in docs)


def test_manifests_have_the_expected_kinds_and_api_versions():
    kinds = {(m["apiVersion"], m["kind"]) for m in _manifests()}
    for expected in [
        ("ray.io/v1", "RayCluster"),
        ("ray.io/v1", "RayJob"),
        ("batch/v1", "CronJob"),
        ("v1", "ServiceAccount"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("apps/v1", "Deployment"),
        ("apps/v1", "StatefulSet"),
        ("v1", "Service"),
        ("v1", "Namespace"),
    ]:
        assert expected in kinds, f"no {expected[1]} ({expected[0]}) under infra/k8s"
    assert {m["apiVersion"] for m in _manifests() if m["kind"] in ("RayCluster", "RayJob")} == {"ray.io/v1"}


def test_ray_cluster_has_a_head_and_autoscaled_cpu_and_gpu_groups_with_token_auth():
    cluster = _one("RayCluster")["spec"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["authOptions"]["mode"] == "token"
    assert cluster["headGroupSpec"]["template"]["spec"]["containers"]
    groups = {g["groupName"]: g for g in cluster["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu"}
    for group in groups.values():
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"] and group["maxReplicas"] > 0
    gpu_limits = [c["resources"]["limits"] for c in _containers(groups["gpu"])]
    cpu_limits = [c["resources"]["limits"] for c in _containers(groups["cpu"])]
    assert all(int(limits["nvidia.com/gpu"]) >= 1 for limits in gpu_limits)
    assert not any("nvidia.com/gpu" in limits for limits in cpu_limits)


def test_every_ray_pod_has_a_memory_backed_dev_shm_for_the_object_store():
    cluster = _one("RayCluster")["spec"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        shm = volumes[mounts["/dev/shm"]]["emptyDir"]
        memory = pod["containers"][0]["resources"]["limits"]["memory"]
        assert shm["medium"] == "Memory" and _gib(shm["sizeLimit"]) < _gib(memory)


def _gib(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Gi|Mi)", quantity).groups()
    return int(number) / (1024 if unit == "Mi" else 1)


def test_rayjob_submitters_get_the_token_from_the_operator_not_from_their_own_env():
    """KubeRay (>= 1.5.1) sets RAY_AUTH_MODE and RAY_AUTH_TOKEN on a RayJob's submitter from the selected
    RayCluster's authOptions (the Secret authOptions.secretName, >= 1.6): one place names the Secret."""
    cluster = _one("RayCluster")["spec"]
    assert cluster["authOptions"] == {"mode": "token", "secretName": "xh-ray-auth"}
    for name, job in _rayjobs().items():
        env = [e["name"] for c in _containers(job["spec"]["submitterPodTemplate"]) for e in c.get("env", [])]
        assert not [e for e in env if e.startswith("RAY_AUTH")], f"{name} sets {env} by hand"


# --- one image everywhere ---------------------------------------------------------------------


def test_one_project_image_in_every_manifest_the_dockerfile_and_the_aws_cluster():
    images = [c["image"] for m in _manifests() for c in _containers(m)]
    project = [i for i in images if not i.startswith(TOOL_IMAGES)]
    assert project and set(project) == {IMAGE}, f"project images differ from {IMAGE}: {set(project)}"
    for image in images:
        assert re.search(r":[\w.-]+$", image) and not image.endswith(":latest"), f"image {image} is not pinned"
    # every Ray container, submitter and the MLflow server run the project image
    for kind in ("RayCluster", "RayJob", "Deployment"):
        for m in (m for m in _manifests() if m["kind"] == kind):
            assert {c["image"] for c in _containers(m)} == {IMAGE}, f"{kind} {m['metadata']} runs another image"
    assert _docs(INFRA / "aws" / "cluster.yaml")[0]["docker"]["image"] == IMAGE
    dockerfile = (INFRA / "Dockerfile").read_text()
    assert IMAGE in dockerfile, "the Dockerfile's build command names another tag"
    assert f'org.opencontainers.image.version="{VERSION}"' in dockerfile


# --- entrypoints and the config they read -----------------------------------------------------


def test_every_entrypoint_is_an_xh_command_and_the_image_installs_xh():
    import typer

    from workflows.cli import app

    commands = typer.main.get_command(app).commands
    entrypoints = [job["spec"]["entrypoint"] for _, job in _all_rayjobs()]
    entrypoints += [_one("RayCronJob")["spec"]["jobTemplate"]["entrypoint"]]
    assert {_command_of(e) for e in entrypoints} >= {"train", "score", "promote"}
    for entrypoint in entrypoints:
        assert _command_of(entrypoint) in commands, f"entrypoint {entrypoint!r} names no command of xh"
    assert 'xh = "workflows.cli:app"' in (ROOT / "pyproject.toml").read_text()
    assert "uv pip install --no-deps --no-build-isolation ." in (INFRA / "Dockerfile").read_text()


def test_rayjobs_run_on_the_project_cluster_with_the_config_mounted_on_its_head(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # it would name the tracking server (xh.tracking)
    cluster = _one("RayCluster")
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    volumes = {v["name"]: v for v in head["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in head["containers"][0]["volumeMounts"]}
    for name, job in _rayjobs().items():
        assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}, name
        config = shlex.split(job["spec"]["entrypoint"])[shlex.split(job["spec"]["entrypoint"]).index("--config") + 1]
        folder, key = os.path.split(config)
        assert folder in mounts, f"{name}: --config {config} is not under a volume mounted on the head"
        config_map = mounts[folder]["configMap"]["name"]
        generated = _config_map_files(config_map)
        assert key in generated, f"{name}: ConfigMap {config_map} has no key {key}"
        cfg = load_config(K8S / generated[key])  # the project's own validation: a wrong key fails here
        host = re.match(r"https?://([^:/]+)", cfg.mlflow.tracking_uri).group(1)
        assert _one("Service", host), "the config's MLflow server is not a Service here"


def _config_map_files(name: str) -> dict[str, str]:
    """key -> file of a ConfigMap that the kustomization generates."""
    kustomization = _docs(K8S / "kustomization.yaml")[0]
    for generator in kustomization["configMapGenerator"]:
        if generator["name"] == name:
            pairs = [f.split("=", 1) if "=" in f else (Path(f).name, f) for f in generator["files"]]
            return dict(pairs)
    raise AssertionError(f"no ConfigMap {name} in the kustomization")


def test_kustomization_lists_files_that_exist_and_no_rayjob_as_a_resource():
    kustomization = _docs(K8S / "kustomization.yaml")[0]
    for resource in kustomization["resources"]:
        assert (K8S / resource).is_file(), resource
        assert all(d["kind"] != "RayJob" for d in _docs(K8S / resource)), "RayJobs are created on demand"
    for generator in kustomization["configMapGenerator"]:
        for file in _config_map_files(generator["name"]).values():
            assert (K8S / file).is_file(), file


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_renders_everything_into_one_namespace():
    rendered = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    objects = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert {o["kind"] for o in objects} >= {"RayCluster", "CronJob", "ConfigMap", "Deployment", "StatefulSet"}
    assert {o["metadata"].get("namespace") for o in objects if o["kind"] != "Namespace"} == {"xh"}


# --- the CronJob creates the scoring RayJob ---------------------------------------------------


def test_cronjob_is_forbidden_to_overlap_and_its_role_allows_rayjobs():
    cron = _one("CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    account = pod["serviceAccountName"]
    assert _one("ServiceAccount", account)
    binding = next(
        b
        for b in _manifests()
        if b["kind"] == "RoleBinding" and {"kind": "ServiceAccount", "name": account} in b["subjects"]
    )
    role = _one("Role", binding["roleRef"]["name"])
    rules = [r for r in role["rules"] if "ray.io" in r["apiGroups"] and "rayjobs" in r["resources"]]
    assert rules and {"create", "get", "list", "delete", "patch", "watch"} <= set(rules[0]["verbs"])


# A stand-in for kubectl (the kubectl image's entrypoint) in the CronJob's containers. `apply -f FILE`
# records the RayJob. `wait -f FILE --for=jsonpath={.a.b}[=VALUE] --timeout=T` checks the applied RayJob
# against the status the test wrote as KubeRay, with kubectl's rules: without a value any non-empty value
# matches, a missing field is no error, `--timeout=0s` checks once and fails when unmet. Where the real
# one would block, the stand-in exits 75 ("still waiting").
FAKE_KUBECTL = """\
import json, os, re, sys
import yaml
state, args = os.environ["FAKE_KUBE_STATE"], sys.argv[1:]
def flag(name):
    return next(a.split("=", 1)[1] for a in args if a.startswith(name + "="))
assert flag("--namespace") == "xh", args
if args[0] == "delete":  # the clean step: earlier nights' RayJobs, never the one about to be applied
    assert "--ignore-not-found" in args, args
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(open(args[args.index("-f") + 1])) if d]
    json.dump(names, open(os.path.join(state, "deleted.json"), "w"))
    sys.exit(0)
job = yaml.safe_load(open(args[args.index("-f") + 1]))
if args[0] == "apply":
    json.dump(job, open(os.path.join(state, "applied.json"), "w"))
    print(f"rayjob.ray.io/{job['metadata']['name']} created")
    sys.exit(0)
assert args[0] == "wait", args
applied = json.load(open(os.path.join(state, "applied.json")))
assert applied["metadata"]["name"] == job["metadata"]["name"], "waits on another RayJob than it applied"
path, _, want = flag("--for").removeprefix("jsonpath=").partition("=")
assert re.fullmatch(r"\\{(\\.\\w+)+\\}", path), f"the stand-in only reads {{.a.b}} paths: {path}"
value = {"status": json.load(open(os.path.join(state, "status.json")))}
for key in path.strip("{}.").split("."):
    value = value.get(key) if isinstance(value, dict) else None
if (value not in (None, "")) if not want else (str(value) == want):
    print(f"rayjob.ray.io/{job['metadata']['name']} condition met")
    sys.exit(0)
if flag("--timeout") in ("0", "0s"):
    print(f"error: condition not met for rayjobs/{job['metadata']['name']}", file=sys.stderr)
    sys.exit(1)
sys.exit(75)
"""
STILL_WAITING = 75


def _run_cronjob_pod(tmp_path: Path, rayjob_status: dict) -> list[tuple[str, int]]:
    """Run the CronJob's pod as the kubelet would, KubeRay having given the RayJob `rayjob_status`: the init
    containers in order until one fails (or, here, would block), then the containers. Returns (name, exit code)."""
    pod = _one("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    folders = {name: tmp_path / "volumes" / name for name in volumes}
    for name, volume in volumes.items():
        folders[name].mkdir(parents=True)
        if "configMap" in volume:  # the files kustomize puts in it
            for key, file in _config_map_files(volume["configMap"]["name"]).items():
                shutil.copy(K8S / file, folders[name] / key)
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir(), state.mkdir()
    (bin_dir / "kubectl").write_text(f"#!{sys.executable}\n" + FAKE_KUBECTL)
    (bin_dir / "kubectl").chmod(0o755)
    (state / "status.json").write_text(json.dumps(rayjob_status))

    base_env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_KUBE_STATE": str(state)}
    results = []
    for phase in ("initContainers", "containers"):
        for container in pod[phase]:
            code = _run_container(container, folders, base_env)
            results.append((container["name"], code))
            if phase == "initContainers" and code != 0:
                return results
    return results


def _run_container(container: dict, folders: dict[str, Path], base_env: dict[str, str]) -> int:
    """One container of the pod, run here: its mounts mapped onto `folders`, env and $(VAR) as Kubernetes sets them."""
    mounts = {m["mountPath"] + "/": f"{folders[m['name']]}/" for m in container.get("volumeMounts", [])}

    def local(text: str) -> str:
        for mount_path, folder in mounts.items():
            text = text.replace(mount_path, folder)
        return text

    env = dict(base_env)
    for var in container.get("env", []):
        assert "value" in var or var["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}, var
        env[var["name"]] = local(var["value"]) if "value" in var else "xh"
    argv = container.get("command", ["kubectl"]) + container.get("args", [])
    argv = [local(re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a)) for a in argv]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode in (0, 1, STILL_WAITING), done.stderr
    return done.returncode


ENDED = "2026-01-02T03:05:00Z"
# How KubeRay leaves a RayJob (rayjob_controller.go): jobDeploymentStatus becomes Complete when the Ray job
# SUCCEEDED or was STOPPED, Failed when it FAILED, when activeDeadlineSeconds passed (whatever the Ray job's
# status) or when the submitter failed; .status.endTime is set in that same status update, and only then.
RAYJOB_ENDINGS = {
    "the Ray job succeeded": ({"jobStatus": "SUCCEEDED", "jobDeploymentStatus": "Complete", "endTime": ENDED}, 0),
    "the Ray job failed": (
        {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "reason": "AppFailed", "endTime": ENDED},
        1,
    ),
    "the Ray job was stopped": ({"jobStatus": "STOPPED", "jobDeploymentStatus": "Complete", "endTime": ENDED}, 1),
    "the deadline passed": (
        {"jobStatus": "RUNNING", "jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded", "endTime": ENDED},
        1,
    ),
    "the submission failed": (
        {"jobStatus": "PENDING", "jobDeploymentStatus": "Failed", "reason": "SubmissionFailed", "endTime": ENDED},
        1,
    ),
}


@pytest.mark.parametrize("ending", RAYJOB_ENDINGS)
def test_cronjob_pod_ends_as_soon_as_the_rayjob_ends_and_succeeds_only_if_the_ray_job_did(ending, tmp_path):
    status, verdict = RAYJOB_ENDINGS[ending]
    results = _run_cronjob_pod(tmp_path, status)
    # the wait step returns on any ending (no six-hour wait for a failure); the last step gives the verdict
    assert results == [("render", 0), ("clean", 0), ("apply", 0), ("wait", 0), ("succeeded", verdict)]
    deleted = json.loads((tmp_path / "state" / "deleted.json").read_text())
    applied = json.loads((tmp_path / "state" / "applied.json").read_text())["metadata"]["name"]
    assert len(deleted) == 38 and applied not in deleted  # nights 3 to 40 ago; tonight's and the last two stay


NOT_ENDED = [{"jobStatus": "RUNNING", "jobDeploymentStatus": "Running"}, {"jobDeploymentStatus": "Initializing"}, {}]


@pytest.mark.parametrize("status", NOT_ENDED)
def test_cronjob_pod_keeps_waiting_while_the_rayjob_has_not_ended(status, tmp_path):
    assert _run_cronjob_pod(tmp_path, status) == [("render", 0), ("clean", 0), ("apply", 0), ("wait", STILL_WAITING)]


def test_cronjob_renders_and_applies_the_dated_batch_scoring_rayjob_and_waits_past_its_deadline(tmp_path):
    _run_cronjob_pod(tmp_path, RAYJOB_ENDINGS["the Ray job succeeded"][0])
    job = json.loads((tmp_path / "state" / "applied.json").read_text())
    # The template is the batch-scoring RayJob itself, shipped by kustomize as a ConfigMap, renamed for the day.
    assert job["kind"] == "RayJob" and job["apiVersion"] == "ray.io/v1"
    assert job["metadata"]["name"] == f"xh-score-{dt.datetime.now(dt.UTC):%Y%m%d}"
    assert {**job, "metadata": None} == {**_rayjobs()["rayjob-score.yaml"], "metadata": None}
    assert _command_of(job["spec"]["entrypoint"]) == "score"
    # The wait outlasts the RayJob's own deadline (which ends it), and the Job's deadline outlasts the wait.
    job_spec = _one("CronJob")["spec"]["jobTemplate"]["spec"]
    wait = next(c for c in job_spec["template"]["spec"]["initContainers"] if c["name"] == "wait")
    timeout = int(
        next(a for a in wait["args"] if a.startswith("--timeout=")).removeprefix("--timeout=").removesuffix("s")
    )
    assert job["spec"]["activeDeadlineSeconds"] < timeout < job_spec["activeDeadlineSeconds"]


# --- credentials ------------------------------------------------------------------------------

SECRET_NAMES = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID",
    "AWS_SESSION_TOKEN",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
)


def _all_rayjobs() -> list[tuple[str, dict]]:
    """Every RayJob under infra/k8s, the template the CronJob ships included (it is rayjob-score.yaml)."""
    return [
        (str(p.relative_to(K8S)), d) for p in sorted(K8S.rglob("*.yaml")) for d in _docs(p) if d.get("kind") == "RayJob"
    ]


def test_no_rayjob_puts_s3_or_mlflow_secrets_in_its_runtime_env_or_entrypoint():
    jobs = _all_rayjobs()
    assert {name for name, _ in jobs} >= {"rayjob-train.yaml", "rayjob-score.yaml"}
    for name, job in jobs:
        # anyone holding the cluster token reads a job's runtime env and entrypoint (`ray job list`)
        public = job["spec"].get("runtimeEnvYAML", "") + "\n" + job["spec"]["entrypoint"]
        assert not [s for s in SECRET_NAMES if s in public], f"{name} passes a secret to its Ray job"
        for container in _containers(job):
            assert not [e for e in container.get("env", []) if e["name"] in SECRET_NAMES], name


def test_s3_keys_reach_pods_only_as_a_mounted_credentials_file_and_irsa_is_the_default():
    account = _one("ServiceAccount", "xh-ray")
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")
    for kind in ("RayCluster", "Deployment"):
        for manifest in (m for m in _manifests() if m["kind"] == kind):
            for spec in _pod_specs(manifest):
                assert spec.get("serviceAccountName") == "xh-ray", (
                    f"{kind} {manifest['metadata']['name']} has no IRSA role"
                )
                volumes = {v["name"]: v for v in spec.get("volumes", [])}
                for container in spec["containers"]:
                    assert not container.get("envFrom"), "secrets as env values"
                    env = {e["name"]: e for e in container.get("env", [])}
                    assert not set(env) & set(SECRET_NAMES)
                    # the optional Secret xh-s3, as a file where AWS_SHARED_CREDENTIALS_FILE says
                    path = env["AWS_SHARED_CREDENTIALS_FILE"]["value"]
                    mount = next(m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/"))
                    assert mount.get("readOnly") is True
                    assert volumes[mount["name"]]["secret"] == {"secretName": "xh-s3", "optional": True}


# --- MLflow and Postgres ----------------------------------------------------------------------


def test_mlflow_server_uses_postgres_from_a_secret_and_proxies_artifacts_to_s3():
    server = _containers(_one("Deployment", "xh-mlflow"))[0]
    env = {e["name"]: e for e in server["env"]}
    assert server["command"] == ["mlflow", "server"] and "--serve-artifacts" in server["args"]
    assert env["MLFLOW_BACKEND_STORE_URI"]["value"].startswith("postgresql://")
    password_ref = env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert env["MLFLOW_ARTIFACTS_DESTINATION"]["value"].startswith("s3://")
    postgres = _containers(_one("StatefulSet", "xh-postgres"))[0]
    postgres_env = {e["name"]: e for e in postgres["env"]}
    assert postgres_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == password_ref
    assert "@xh-postgres:5432/" in env["MLFLOW_BACKEND_STORE_URI"]["value"] and _one("Service", "xh-postgres")


# --- the AWS cluster launcher YAML ------------------------------------------------------------


def test_aws_cluster_yaml_passes_rays_schema_with_head_cpu_and_gpu_node_types():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = _docs(INFRA / "aws" / "cluster.yaml")[0]
    validate_config(prepare_config(config))
    types = config["available_node_types"]
    assert set(types) == {config["head_node_type"], "cpu_worker", "gpu_worker"}
    for name in ("cpu_worker", "gpu_worker"):
        assert 0 <= types[name]["min_workers"] <= types[name]["max_workers"]
    setup = " ".join(config["setup_commands"])
    assert "torch==2.13.0" in setup and "transformer-xh" in setup


# --- Dockerfile -------------------------------------------------------------------------------


def test_dockerfile_pins_a_cuda_base_and_torch_installs_the_project_and_runs_as_non_root():
    text = (INFRA / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, flags=re.M))
    resolved = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), text)
    bases = re.findall(r"^FROM (\S+)", resolved, flags=re.M)
    assert all(re.search(r":[\w.-]+$", b) and not b.endswith(":latest") for b in bases), bases
    assert bases[-1].startswith("nvidia/cuda:")
    assert 'pip install "torch==2.13.0"' in resolved
    assert "TORCH_VERSION := 2.13.0" in (ROOT / "Makefile").read_text(), (
        "the Makefile and the image pin different torch"
    )
    # the project without dependencies: they come from requirements.lock (tests/unit/test_lock.py)
    assert re.search(r"^RUN uv pip install --no-deps --no-build-isolation \. ", resolved, flags=re.M), "no project"
    assert re.search(r"^COPY .*\bxh\b", resolved, flags=re.M) and re.search(
        r"^COPY .*\bworkflows\b", resolved, flags=re.M
    )
    users = re.findall(r"^USER (\S+)", resolved, flags=re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.match(r"3\.1[0-2]$", args["PYTHON_VERSION"])


# --- submit.sh --------------------------------------------------------------------------------

SUBMIT = INFRA / "submit.sh"


def test_submit_sh_is_valid_shell_and_shellcheck_clean():
    assert subprocess.run(["bash", "-n", str(SUBMIT)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        checked = subprocess.run(
            ["shellcheck", str(SUBMIT), str(INFRA / "mlflow-server.sh")], capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout


def _submit(args: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_", "MLFLOW_", "XH_"))}
    return subprocess.run(
        ["bash", str(SUBMIT), *args],
        env={**clean, "HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_submit_sh_help_and_one_line_errors(tmp_path):
    shown = _submit(["--help"], {}, tmp_path)
    assert shown.returncode == 0 and "RAY_ADDRESS" in shown.stdout and "RAY_AUTH_TOKEN" in shown.stdout
    cases = [
        (["synth"], {}, "set RAY_ADDRESS"),
        (["no_such_stage"], {"RAY_ADDRESS": "http://127.0.0.1:1"}, "no stage 'no_such_stage': one of synth wiki"),
        (["synth"], {"RAY_ADDRESS": "http://127.0.0.1:1"}, "no Ray auth token"),  # HOME has no ~/.ray/auth_token
    ]
    for args, env, message in cases:
        done = _submit(args, env, tmp_path)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (
            done.stderr
        )


def test_submit_sh_hands_ray_the_env_by_file_never_on_the_command_line(tmp_path):
    """A stand-in `ray` on PATH records what it was given: the real one is exercised in tests/integration."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "record.json"
    fake_ray = bin_dir / "ray"
    fake_ray.write_text(
        "#!/usr/bin/env python3\nimport json, sys\nargv = sys.argv[1:]\n"
        "env_file = argv[argv.index('--runtime-env') + 1]\n"
        f"json.dump({{'argv': argv, 'runtime_env': json.load(open(env_file)), 'env_file': env_file}}, open({str(record)!r}, 'w'))\n"
    )
    fake_ray.chmod(0o755)
    secret = "s3cr3t-value-for-the-test"
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "RAY_ADDRESS": "http://head:8265",
        "RAY_AUTH_TOKEN": "t0ken",
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_REGION": "eu-west-3",
        "MY_EXTRA": "x",
        "XH_JOB_ENV": "MY_EXTRA",
        "XH_SUBMIT_OPTS": "--no-wait --submission-id abc",
        "UNRELATED": "y",
    }
    done = _submit(["synth", "--config", "configs/demo.yaml", "--set", "synth.num_docs=100"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(record.read_text())
    argv, runtime_env = seen["argv"], seen["runtime_env"]
    assert secret not in " ".join(argv) and secret not in done.stdout + done.stderr and "t0ken" not in " ".join(argv)
    assert argv[:3] == ["job", "submit", "--address"] and argv[3] == "http://head:8265"
    assert argv[argv.index("--working-dir") + 1] == str(ROOT)
    assert argv[argv.index("--") :] == [
        "--",
        "xh",
        "synth",
        "--config",
        "configs/demo.yaml",
        "--set",
        "synth.num_docs=100",
    ]
    assert {"--no-wait", "--submission-id", "abc"} <= set(argv[: argv.index("--")])
    assert runtime_env["env_vars"]["AWS_REGION"] == "eu-west-3" and runtime_env["env_vars"]["MY_EXTRA"] == "x"
    assert secret not in json.dumps(runtime_env), "a credential travelled in the job's runtime env"
    assert "UNRELATED" not in runtime_env["env_vars"] and "RAY_AUTH_TOKEN" not in runtime_env["env_vars"]
    assert {".venv/", ".git/", "/runs/", "__pycache__/"} <= set(runtime_env["excludes"])
    assert not Path(seen["env_file"]).exists(), "the runtime-env file was left behind"


def test_submit_sh_refuses_to_pass_secrets_named_in_xh_job_env(tmp_path):
    env = {
        "RAY_ADDRESS": "http://head:8265",
        "RAY_AUTH_TOKEN": "t0ken",
        "XH_JOB_ENV": "MY_DB_PASSWORD AWS_SECRET_ACCESS_KEY",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t",
        "MY_DB_PASSWORD": "pw",
    }
    done = _submit(["synth"], env, tmp_path)
    assert done.returncode == 2 and "names secrets" in done.stderr and "s3cr3t" not in done.stderr + done.stdout


def _fake_ray(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in `ray` on PATH that records its argv and the runtime env file it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "record.json"
    fake_ray = bin_dir / "ray"
    fake_ray.write_text(
        "#!/usr/bin/env python3\nimport json, sys\nargv = sys.argv[1:]\n"
        "env_file = argv[argv.index('--runtime-env') + 1]\n"
        f"json.dump({{'argv': argv, 'runtime_env': json.load(open(env_file))}}, open({str(record)!r}, 'w'))\n"
    )
    fake_ray.chmod(0o755)
    return bin_dir, record


def test_submit_sh_refuses_credentials_inside_values_and_arguments_without_showing_them(tmp_path):
    bin_dir, record = _fake_ray(tmp_path)
    secret = "pw-for-the-test-0451"
    base = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "RAY_ADDRESS": "http://head:8265",
        "RAY_AUTH_TOKEN": "t",
    }
    cases = [
        (
            {"MLFLOW_TRACKING_URI": f"http://alice:{secret}@mlflow:5000"},
            ["synth"],
            "MLFLOW_TRACKING_URI holds a credential",
        ),
        ({"AWS_ENDPOINT_URL": f"https://s3.example/?X-Amz-Signature={secret}"}, ["synth"], "AWS_ENDPOINT_URL holds"),
        ({"MY_URL": f"https://{secret}@git.example/x", "XH_JOB_ENV": "MY_URL"}, ["synth"], "MY_URL holds a credential"),
        ({}, ["synth", "--set", f"mlflow.tracking_uri=http://alice:{secret}@mlflow:5000"], "argument 2 holds"),
        ({}, ["synth", "--set", f"storage.root=s3://b/x?session_token={secret}"], "argument 2 holds"),
    ]
    for env, args, message in cases:
        done = _submit(args, base | env, tmp_path)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and secret not in done.stdout + done.stderr
        assert not record.exists(), "ray was called"
    # a URI without credentials still travels
    done = _submit(
        ["synth", "--set", "storage.root=s3://b/x"], base | {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}, tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(record.read_text())["runtime_env"]["env_vars"]["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"


def _uploaded(working_dir: Path, excludes: list[str]) -> set[str]:
    """The files Ray's own packaging puts in a job's working_dir package for these excludes."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    files: set[str] = set()

    def handler(path: Path) -> None:
        if path.is_file():
            files.add(str(path.relative_to(working_dir)))

    _dir_travel(working_dir, [_get_excludes(working_dir, excludes)], handler, include_gitignore=True)
    return files


def test_submit_sh_uploads_only_tracked_files_and_never_a_credential_file(tmp_path):
    """A checkout with untracked credential files (the README's `aws-credentials`, a `.env`), an untracked
    folder and an untracked config named by --config: only tracked files and that config are uploaded."""
    bin_dir, record = _fake_ray(tmp_path)
    checkout = tmp_path / "checkout"
    (checkout / "workflows").mkdir(parents=True)
    (checkout / "workflows" / "synth.py").write_text("print('synth')\n")
    (checkout / "configs").mkdir()
    (checkout / "configs" / "demo.yaml").write_text("synth: {}\n")
    (checkout / "tracked.env").write_text("tracked but credential-like\n")
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    for untracked in ["aws-credentials", ".env", "notes/todo.txt", "workflows/scratch.py", "my run.yaml", "x[1].txt"]:
        (checkout / untracked).parent.mkdir(parents=True, exist_ok=True)
        (checkout / untracked).write_text("untracked\n")
    (checkout / "configs" / "mine.yaml").write_text("synth: {}\n")
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "RAY_ADDRESS": "http://head:8265",
        "RAY_AUTH_TOKEN": "t",
        "XH_WORKING_DIR": str(checkout),
    }
    done = _submit(["synth", "--config", "configs/mine.yaml"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    excludes = json.loads(record.read_text())["runtime_env"]["excludes"]
    assert _uploaded(checkout, excludes) == {"workflows/synth.py", "configs/demo.yaml", "configs/mine.yaml"}

    # not a git checkout: the credential patterns still hold
    shutil.rmtree(checkout / ".git")
    done = _submit(["synth"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    uploaded = _uploaded(checkout, json.loads(record.read_text())["runtime_env"]["excludes"])
    assert not {"aws-credentials", ".env", "tracked.env"} & uploaded and "notes/todo.txt" in uploaded

    # a config inside an untracked folder is refused in one line rather than left behind
    subprocess.run([*git, "init", "-q"], check=True)
    done = _submit(["synth", "--config", "notes/todo.txt"], env, tmp_path)
    assert done.returncode == 2 and "untracked folder" in done.stderr and len(done.stderr.splitlines()) == 1


def test_submit_sh_refuses_a_config_file_holding_a_credential_without_showing_it(tmp_path):
    """#44 (10): the config file it ships is checked as the arguments are: tracked or untracked, the job's
    working directory is readable by every token holder."""
    bin_dir, record = _fake_ray(tmp_path)
    secret = "pw-in-a-config-0451"
    checkout = tmp_path / "checkout"
    (checkout / "configs").mkdir(parents=True)
    (checkout / "configs" / "demo.yaml").write_text("synth: {}\n")
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    (checkout / "mine.yaml").write_text(f"synth: {{}}\nmlflow:\n  tracking_uri: http://alice:{secret}@mlflow:5000\n")
    (checkout / "token.yaml").write_text(f"storage:\n  root: s3://b/x?X-Amz-Security-Token={secret}\n")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "RAY_ADDRESS": "http://head:8265"}
    env |= {"RAY_AUTH_TOKEN": "t", "XH_WORKING_DIR": str(checkout)}
    for args, line in ((["--config", "mine.yaml"], 3), (["--config=token.yaml"], 2)):
        done = _submit(["synth", *args], env, tmp_path)
        assert done.returncode == 2 and f"holds a credential inside a URI (line {line})" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and secret not in done.stdout + done.stderr
        assert not record.exists(), "ray was called"
    done = _submit(["synth", "--config", "configs/demo.yaml"], env, tmp_path)
    assert done.returncode == 0, done.stderr


def test_submit_sh_never_uploads_git_credentials_and_the_like_even_tracked(tmp_path):
    """#44 (10): `.git-credentials`, `.netrc`, `.pypirc`, a key or a `.env` committed by mistake stay behind."""
    bin_dir, record = _fake_ray(tmp_path)
    checkout = tmp_path / "checkout"
    credentials = [".git-credentials", ".netrc", ".pypirc", ".npmrc", ".pgpass", "deploy.pem", ".env", "sub/.env"]
    for path in ["configs/demo.yaml", *credentials]:
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        (checkout / path).write_text("https://user:not-a-real-token@git.example\n")
    (checkout / "configs" / "demo.yaml").write_text("synth: {}\n")
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-f", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "RAY_ADDRESS": "http://head:8265"}
    done = _submit(["synth"], env | {"RAY_AUTH_TOKEN": "t", "XH_WORKING_DIR": str(checkout)}, tmp_path)
    assert done.returncode == 0, done.stderr
    excludes = json.loads(record.read_text())["runtime_env"]["excludes"]
    assert _uploaded(checkout, excludes) == {"configs/demo.yaml"}


def test_submit_sh_takes_the_commands_of_xh():
    from workflows.cli import ORDER

    stages = re.search(r'^stages=" (.*) "$', SUBMIT.read_text(), re.M).group(1).split()
    assert stages == [c for c in ORDER if c != "config"]
