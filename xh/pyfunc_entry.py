"""MLflow models-from-code entry point: MLflow runs this file when it loads a registered XH model.

Nothing in the project imports it; `xh.registry.log_and_register` names it as the `python_model`.
"""

from mlflow.models import set_model

from xh.registry import XHPyfunc

set_model(XHPyfunc())
