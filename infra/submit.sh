#!/usr/bin/env bash
# Submit a stage to a Ray cluster as a job:
#
#   RAY_ADDRESS=http://head:8265 infra/submit.sh synth --config configs/demo.yaml --set storage.root=s3://bucket/xh
#
# The working directory is shipped (minus local state); S3 and MLflow settings travel as environment
# variables of the job, never as files. Ray 2.60 clusters use token authentication: the token is read
# from RAY_AUTH_TOKEN or the file Ray writes under ~/.ray/ on the head node.
set -euo pipefail
stage="${1:?usage: infra/submit.sh STAGE [--config FILE] [--set k=v ...]}"; shift
: "${RAY_ADDRESS:?set RAY_ADDRESS to the dashboard address of the cluster}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-token}"

# Environment the job's driver and workers get; credentials only if set here.
env_json=$(python3 - <<'PY'
import json, os
names = ["AWS_ENDPOINT_URL", "XH_S3_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
         "AWS_SESSION_TOKEN", "MLFLOW_TRACKING_URI", "MLFLOW_S3_ENDPOINT_URL"]
print(json.dumps({"env_vars": {n: os.environ[n] for n in names if os.environ.get(n)},
                  "excludes": [".venv/", "runs/", ".git/", "**/__pycache__/", "*.bz2", "*.parquet"]}))
PY
)

exec ray job submit --address "$RAY_ADDRESS" --working-dir . --runtime-env-json "$env_json" \
  -- python -m "workflows.${stage}" "$@"
