#!/usr/bin/env bash
# Submit one stage of the pipeline to a Ray cluster as a Ray job; see `infra/submit.sh --help`.
#
#   RAY_ADDRESS=http://127.0.0.1:8265 infra/submit.sh synth --config configs/demo.yaml --set storage.root=s3://bucket/xh
#
# The repository's tracked files are shipped as the job's working directory (never local state, data or
# credential files); S3 and MLflow *settings* (endpoints, region, credential file paths) travel as
# environment variables of the job. Secrets never do, by name or inside a value (a URI's user info): a
# job's runtime env and entrypoint are readable by every token holder (`ray job list`, the dashboard).
# Jobs find credentials on the cluster: workload identity (IRSA, instance profiles) or a credentials file
# mounted on the nodes. Ray 2.60 clusters use token authentication.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: infra/submit.sh STAGE [--config FILE] [--set SECTION.KEY=VALUE ...]

Runs `xh STAGE ARGS...` on the Ray cluster at $RAY_ADDRESS as a Ray job, with this repository as the
job's working directory, and waits for it (exit status 0: SUCCEEDED). STAGE is one of xh's commands:
synth wiki retrieve rerank graphs train qtype promote score serve demo eval.
In a git checkout only tracked files are uploaded; credential files (aws-credentials, .env, .netrc,
.git-credentials, .pypirc, *.pem, ...) never are, tracked or not. MLFLOW_TRACKING_URI, when set, is
where the job's runs go (over the config file).

Environment:
  RAY_ADDRESS          the cluster's dashboard address, e.g. http://127.0.0.1:8265 (required)
  RAY_AUTH_TOKEN       the cluster's token; else the file named by RAY_AUTH_TOKEN_PATH; else
                       ~/.ray/auth_token (`ray get-auth-token` on the head node prints it)
  RAY_AUTH_MODE        token (default) or disabled, for a cluster started without authentication
  XH_WORKING_DIR       the directory shipped as the working directory (default: this repository)
  XH_JOB_ENV           more variable names to pass to the job, space separated
  XH_SUBMIT_OPTS       more `ray job submit` options, e.g. "--no-wait --submission-id xh-synth-1"

Passed to the job when set here: AWS_ENDPOINT_URL XH_S3_ENDPOINT_URL AWS_REGION AWS_DEFAULT_REGION
AWS_SHARED_CREDENTIALS_FILE AWS_CONFIG_FILE AWS_PROFILE MLFLOW_TRACKING_URI MLFLOW_S3_ENDPOINT_URL
MLFLOW_TRACKING_USERNAME, and the names in XH_JOB_ENV.

Never passed, even when named in XH_JOB_ENV (refused): AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY
AWS_SESSION_TOKEN MLFLOW_TRACKING_PASSWORD MLFLOW_TRACKING_TOKEN, or any name containing SECRET,
PASSWORD, TOKEN or KEY. A value, an argument or a --config file with a credential inside a URI
(http://user:pw@host, ?token=...) is refused too. Anyone holding the cluster token can read a job's environment
(`ray job list`), so the cluster must find its own credentials: an IAM role for the service account
(IRSA) or the node's instance profile, or files on the nodes named by AWS_SHARED_CREDENTIALS_FILE
(a mounted secret) and ~/.mlflow/credentials (MLflow's own file, [mlflow] section).
EOF
}

die() { echo "submit.sh: $*" >&2; exit 2; }

case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  "" | -*) usage >&2; exit 2 ;;
esac
stage=$1
shift

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
working_dir=${XH_WORKING_DIR:-$repo}
# xh's commands (workflows/cli.py ORDER but `config`, which runs nothing)
stages=" synth wiki retrieve rerank graphs train qtype promote score serve demo eval "
[[ $stages == *" $stage "* ]] || die "no stage '$stage': one of${stages% }"
[[ -n ${RAY_ADDRESS:-} ]] || die "set RAY_ADDRESS to the cluster's dashboard address, e.g. http://127.0.0.1:8265"

# Token authentication: Ray reads RAY_AUTH_TOKEN, then RAY_AUTH_TOKEN_PATH, then ~/.ray/auth_token.
# Checked here so that a missing token is one clear line rather than an InvalidAuthToken trace.
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
if [[ $RAY_AUTH_MODE == token && -z ${RAY_AUTH_TOKEN:-} ]]; then
  token_file=${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}
  [[ -s $token_file ]] || die "no Ray auth token: set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, or put it in ~/.ray/auth_token (run \`ray get-auth-token\` on the head node)"
fi

# The runtime env (environment variables and excludes) goes in a file only this user can read.
runtime_env=$(umask 077 && mktemp "${TMPDIR:-/tmp}/xh-runtime-env.XXXXXX")
trap 'rm -f "$runtime_env"' EXIT
XH_JOB_ENV=${XH_JOB_ENV:-} python3 - "$runtime_env" "$working_dir" "$@" <<'PY'
import json, os, re, subprocess, sys

runtime_env_file, working_dir, args = sys.argv[1], sys.argv[2], sys.argv[3:]


def refuse(message):
    print(f"submit.sh: {message}", file=sys.stderr)
    sys.exit(2)


names = ["AWS_ENDPOINT_URL", "XH_S3_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
         "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_PROFILE", "MLFLOW_TRACKING_URI",
         "MLFLOW_S3_ENDPOINT_URL", "MLFLOW_TRACKING_USERNAME"]
extra = os.environ["XH_JOB_ENV"].split()
secret = [n for n in extra if any(w in n.upper() for w in ("SECRET", "PASSWORD", "TOKEN", "KEY"))]
if secret:
    refuse(f"XH_JOB_ENV names secrets ({' '.join(secret)}): a job's environment is readable by every "
           "token holder; give the cluster credentials through IRSA/instance profiles or a mounted file")
env_vars = {name: os.environ[name] for name in names + extra if os.environ.get(name)}

# A credential inside a value (http://user:password@host, ?token=...) is as readable as one in its own
# variable: by every token holder (`ray job list`, the jobs API) and in Ray's session logs. Never shown.
userinfo = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s]*@")
secret_query = re.compile(r"[?&][^=&#\s]*(token|secret|password|signature|credential|key)[^=&#\s]*=", re.I)
hint = ("put credentials in files on the cluster (~/.mlflow/credentials, a mounted AWS credentials file) "
        "or use IRSA/instance profiles")
for name, value in env_vars.items():
    if userinfo.search(value) or secret_query.search(value):
        refuse(f"{name} holds a credential inside a URI: a job's environment is readable by every token "
               f"holder; {hint}")
for position, arg in enumerate(args, 1):
    if userinfo.search(arg) or secret_query.search(arg):
        refuse(f"argument {position} holds a credential inside a URI: a job's entrypoint is readable by every "
               f"token holder; {hint}")
# The config files the job reads travel with the working directory: the same check, on what they hold.
configs = [a.split("=", 1)[1] if a.startswith("--config=") else b for a, b in zip(args, args[1:] + [""])
           if a.startswith("--config=") or a == "--config"]
for config in configs:
    try:
        with open(os.path.join(working_dir, config), errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        continue  # not in the working directory (a file on the cluster): the job reads it there
    found = [n for n, line in enumerate(lines, 1) if userinfo.search(line) or secret_query.search(line)]
    if found:
        refuse(f"--config {config} holds a credential inside a URI (line {found[0]}): the working directory is "
               f"readable by every token holder; {hint}")

# Credential files never travel, tracked or not; local state, caches and data neither: stages read their
# inputs from storage.
excludes = [".git/", ".venv/", "/runs/", "/mlruns/", "/demo-output/", "build/", "*.egg-info/",
            "__pycache__/", "*.pyc", ".pytest_cache/", "*.parquet", "*.bz2",
            "aws-credentials", "credentials", "*.credentials", ".env", ".env.*", "*.env", ".aws/", ".mlflow/",
            ".ray/", ".netrc", "auth_token", "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*", "id_ed25519*",
            ".git-credentials", ".git-credentials.*", ".pypirc", ".npmrc", ".pgpass", ".docker/", ".kube/",
            "*.jks", "*.keystore", "*.kdbx", ".htpasswd"]
# In a git checkout only tracked files travel: every untracked file or folder (ignored or not) is excluded
# by its own anchored pattern.
try:
    untracked = subprocess.run(["git", "-C", working_dir, "ls-files", "-z", "--others", "--directory"],
                               capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
except (OSError, subprocess.SubprocessError):
    untracked = []  # not a git checkout (an unpacked release, an image): the patterns above only
# A config file the job reads from its working directory travels even when untracked (checked above).
for path in untracked:
    inside = [c for c in configs if path.endswith("/") and os.path.normpath(c).startswith(path)]
    if inside:
        refuse(f"--config {inside[0]} lies in the untracked folder {path}, which is not uploaded; move it or git add it")
untracked = [p for p in untracked if p and os.path.normpath(p) not in {os.path.normpath(c) for c in configs}]
excludes += ["/" + re.sub(r"([\\*?\[\]!# ])", r"\\\1", path) for path in untracked]

runtime_env = {"env_vars": env_vars, "excludes": excludes}
with open(runtime_env_file, "w") as f:
    json.dump(runtime_env, f)  # JSON is YAML: `ray job submit --runtime-env` reads it as is
PY

extra_opts=()
read -r -a extra_opts <<<"${XH_SUBMIT_OPTS:-}"

# No exec: the trap removes the runtime-env file once the job has finished (or was handed off with --no-wait).
ray job submit --address "$RAY_ADDRESS" --working-dir "$working_dir" --runtime-env "$runtime_env" \
  ${extra_opts[@]+"${extra_opts[@]}"} -- xh "$stage" "$@"
