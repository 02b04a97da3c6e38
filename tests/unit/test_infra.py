"""infra/: every YAML parses, and the pieces agree with each other and with the repository.

What is checked: Kubernetes kinds and API versions; one image (the project's, tagged with its version)
in every manifest, the Dockerfile and the AWS cluster launcher YAML; every `python -m X` entrypoint names
a module of this repository; the CronJob renders and applies the batch-scoring RayJob; the RBAC lets it;
the AWS YAML passes Ray's own schema; the Dockerfile pins torch and installs the project; submit.sh is
valid shell, needs a token, and keeps credentials off its command line and out of its output.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
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
    return [d for p in sorted(K8S.glob("*.yaml")) for d in _docs(p) if "apiVersion" in d and d["kind"] != "Kustomization"]


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


def _module_of(entrypoint: str) -> str:
    words = shlex.split(entrypoint)
    assert words[:2] == ["python", "-m"], f"entrypoint {entrypoint!r} is not `python -m MODULE ...`"
    return words[2]


# --- YAML, kinds and API versions ------------------------------------------------------------


@pytest.mark.parametrize("path", YAML_FILES, ids=lambda p: str(p.relative_to(INFRA)))
def test_every_yaml_file_parses_into_mappings(path):
    docs = _docs(path)
    assert docs and all(isinstance(d, dict) for d in docs)


def test_manifests_have_the_expected_kinds_and_api_versions():
    kinds = {(m["apiVersion"], m["kind"]) for m in _manifests()}
    for expected in [
        ("ray.io/v1", "RayCluster"), ("ray.io/v1", "RayJob"), ("batch/v1", "CronJob"), ("v1", "ServiceAccount"),
        ("rbac.authorization.k8s.io/v1", "Role"), ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("apps/v1", "Deployment"), ("apps/v1", "StatefulSet"), ("v1", "Service"), ("v1", "Namespace"),
    ]:  # fmt: skip
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


def test_every_entrypoint_names_a_module_of_this_repository():
    entrypoints = [job["spec"]["entrypoint"] for job in _rayjobs().values()]
    assert {_module_of(e) for e in entrypoints} >= {"workflows.train", "workflows.batch_score"}
    for entrypoint in entrypoints:
        module = _module_of(entrypoint)
        path = ROOT / Path(*module.split(".")).with_suffix(".py")
        assert path.is_file(), f"entrypoint {entrypoint!r}: {path.relative_to(ROOT)} does not exist"


def test_rayjobs_run_on_the_project_cluster_with_the_config_mounted_on_its_head():
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
    binding = next(b for b in _manifests() if b["kind"] == "RoleBinding" and {"kind": "ServiceAccount", "name": account} in b["subjects"])
    role = _one("Role", binding["roleRef"]["name"])
    rules = [r for r in role["rules"] if "ray.io" in r["apiGroups"] and "rayjobs" in r["resources"]]
    assert rules and {"create", "get", "list", "delete"} <= set(rules[0]["verbs"])


def test_cronjob_renders_applies_and_waits_for_the_dated_batch_scoring_rayjob(tmp_path):
    pod = _one("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    render, apply_ = pod["initContainers"]
    # The template is the batch-scoring RayJob itself, shipped by kustomize as a ConfigMap.
    template_mount = next(m for m in render["volumeMounts"] if "configMap" in volumes[m["name"]])
    files = _config_map_files(volumes[template_mount["name"]]["configMap"]["name"])
    env = {e["name"]: e["value"] for e in render["env"]}
    template_key = os.path.relpath(env["TEMPLATE"], template_mount["mountPath"])
    assert files[template_key] == "rayjob-score.yaml"

    # Run the render step as the pod would (busybox sh: date, sed, grep), on the real template.
    (tmp_path / "template").mkdir()
    shutil.copy(K8S / files[template_key], tmp_path / "template" / template_key)
    output = tmp_path / "rayjob.yaml"
    script = render["command"][-1]
    done = subprocess.run(
        ["sh", "-c", script], env={**os.environ, "TEMPLATE": str(tmp_path / "template" / template_key), "OUTPUT": str(output)},
        capture_output=True, text=True, timeout=10,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = yaml.safe_load(output.read_text())
    assert job["kind"] == "RayJob" and job["apiVersion"] == "ray.io/v1"
    assert job["metadata"]["name"] == f"xh-score-{dt.datetime.now(dt.timezone.utc):%Y%m%d}"
    assert _module_of(job["spec"]["entrypoint"]) == "workflows.batch_score"

    # Then kubectl applies that file and waits on it for the Ray job's success.
    assert apply_["args"][0] == "apply" and "/work/rayjob.yaml" == env["OUTPUT"] == apply_["args"][apply_["args"].index("-f") + 1]
    wait = pod["containers"][0]["args"]
    assert wait[0] == "wait" and wait[wait.index("-f") + 1] == env["OUTPUT"]
    assert "--for=jsonpath={.status.jobStatus}=SUCCEEDED" in wait


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
    assert "torch==2.13.0" in (ROOT / "Makefile").read_text(), "the Makefile and the image pin different torch"
    assert re.search(r'^RUN pip install "\.\[offline\]"', resolved, flags=re.M), "the project is not installed"
    assert re.search(r"^COPY .*\bxh\b", resolved, flags=re.M) and re.search(r"^COPY .*\bworkflows\b", resolved, flags=re.M)
    users = re.findall(r"^USER (\S+)", resolved, flags=re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.match(r"3\.1[0-2]$", args["PYTHON_VERSION"])


# --- submit.sh --------------------------------------------------------------------------------

SUBMIT = INFRA / "submit.sh"


def test_submit_sh_is_valid_shell_and_shellcheck_clean():
    assert subprocess.run(["bash", "-n", str(SUBMIT)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        checked = subprocess.run(["shellcheck", str(SUBMIT), str(INFRA / "mlflow-server.sh")], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout


def _submit(args: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_", "MLFLOW_", "XH_"))}
    return subprocess.run(
        ["bash", str(SUBMIT), *args], env={**clean, "HOME": str(tmp_path), **env}, capture_output=True, text=True, timeout=30
    )


def test_submit_sh_help_and_one_line_errors(tmp_path):
    shown = _submit(["--help"], {}, tmp_path)
    assert shown.returncode == 0 and "RAY_ADDRESS" in shown.stdout and "RAY_AUTH_TOKEN" in shown.stdout
    cases = [
        (["synth"], {}, "set RAY_ADDRESS"),
        (["no_such_stage"], {"RAY_ADDRESS": "http://127.0.0.1:1"}, "workflows/no_such_stage.py does not exist"),
        (["synth"], {"RAY_ADDRESS": "http://127.0.0.1:1"}, "no Ray auth token"),  # HOME has no ~/.ray/auth_token
    ]
    for args, env, message in cases:
        done = _submit(args, env, tmp_path)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


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
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "RAY_ADDRESS": "http://head:8265", "RAY_AUTH_TOKEN": "t0ken",
        "AWS_SECRET_ACCESS_KEY": secret, "AWS_REGION": "eu-west-3", "MY_EXTRA": "x", "XH_JOB_ENV": "MY_EXTRA",
        "XH_SUBMIT_OPTS": "--no-wait --submission-id abc", "UNRELATED": "y",
    }  # fmt: skip
    done = _submit(["synth", "--config", "configs/demo.yaml", "--set", "synth.num_docs=100"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    seen = json.loads(record.read_text())
    argv, runtime_env = seen["argv"], seen["runtime_env"]
    assert secret not in " ".join(argv) and secret not in done.stdout + done.stderr and "t0ken" not in " ".join(argv)
    assert argv[:3] == ["job", "submit", "--address"] and argv[3] == "http://head:8265"
    assert argv[argv.index("--working-dir") + 1] == str(ROOT)
    assert argv[argv.index("--") :] == ["--", "python", "-m", "workflows.synth", "--config", "configs/demo.yaml", "--set", "synth.num_docs=100"]
    assert {"--no-wait", "--submission-id", "abc"} <= set(argv[: argv.index("--")])
    assert runtime_env["env_vars"]["AWS_REGION"] == "eu-west-3" and runtime_env["env_vars"]["MY_EXTRA"] == "x"
    assert secret not in json.dumps(runtime_env), "a credential travelled in the job's runtime env"
    assert "UNRELATED" not in runtime_env["env_vars"] and "RAY_AUTH_TOKEN" not in runtime_env["env_vars"]
    assert {".venv/", ".git/", "/runs/", "__pycache__/"} <= set(runtime_env["excludes"])
    assert not Path(seen["env_file"]).exists(), "the runtime-env file was left behind"


def test_submit_sh_refuses_to_pass_secrets_named_in_xh_job_env(tmp_path):
    env = {"RAY_ADDRESS": "http://head:8265", "RAY_AUTH_TOKEN": "t0ken", "XH_JOB_ENV": "MY_DB_PASSWORD AWS_SECRET_ACCESS_KEY",
           "AWS_SECRET_ACCESS_KEY": "s3cr3t", "MY_DB_PASSWORD": "pw"}  # fmt: skip
    done = _submit(["synth"], env, tmp_path)
    assert done.returncode == 2 and "names secrets" in done.stderr and "s3cr3t" not in done.stderr + done.stdout
