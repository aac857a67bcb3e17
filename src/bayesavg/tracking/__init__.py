"""MLflow tracking: a stage talks to a worker process (``worker``) that makes the MLflow
calls (``store`` opens runs, ``mlflow_run`` logs into them, ``system_metrics`` samples
the machine while a run lasts, ``registry`` registers the best model: the modules that
import mlflow), so importing mlflow and opening its store overlap the stage's own work.
Nothing is imported here: importing the package must not import mlflow."""
