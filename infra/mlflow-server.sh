#!/usr/bin/env bash
# An MLflow tracking server for a team: a SQL backend store and artifacts proxied to S3, so that
# clients need no S3 credentials (only the server does).
#
#   MLFLOW_BACKEND_STORE_URI=postgresql://mlflow@db/mlflow MLFLOW_ARTIFACTS=s3://bucket/mlflow infra/mlflow-server.sh
set -euo pipefail
exec mlflow server \
  --backend-store-uri "${MLFLOW_BACKEND_STORE_URI:-sqlite:///runs/mlflow/server.db}" \
  --artifacts-destination "${MLFLOW_ARTIFACTS:-runs/mlflow/artifacts}" \
  --host "${MLFLOW_HOST:-127.0.0.1}" --port "${MLFLOW_PORT:-5000}"
