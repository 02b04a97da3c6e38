#!/usr/bin/env bash
# An MLflow tracking server for a team: a SQL backend store and artifacts proxied to S3, so that
# clients need no S3 credentials (only the server does). The Kubernetes version is infra/k8s/mlflow.yaml.
#
#   MLFLOW_BACKEND_STORE_URI=postgresql://mlflow:PASSWORD@db:5432/mlflow \
#   MLFLOW_ARTIFACTS_DESTINATION=s3://bucket/mlflow-artifacts MLFLOW_HOST=0.0.0.0 infra/mlflow-server.sh
#
# The backend URI (it holds the database password) is read by `mlflow server` from its environment,
# so it never appears on a command line. Defaults: SQLite and local artifacts under runs/mlflow/.
# Reached by a name other than localhost or a private IP? List it: MLFLOW_SERVER_ALLOWED_HOSTS=mlflow.example.com
set -euo pipefail
export MLFLOW_BACKEND_STORE_URI=${MLFLOW_BACKEND_STORE_URI:-sqlite:///runs/mlflow/server.db}
export MLFLOW_ARTIFACTS_DESTINATION=${MLFLOW_ARTIFACTS_DESTINATION:-${MLFLOW_ARTIFACTS:-runs/mlflow/artifacts}}
mkdir -p runs/mlflow
exec mlflow server --serve-artifacts \
  --host "${MLFLOW_HOST:-127.0.0.1}" --port "${MLFLOW_PORT:-5000}" --workers "${MLFLOW_WORKERS:-2}"
