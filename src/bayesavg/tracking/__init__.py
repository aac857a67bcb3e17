"""MLflow tracking: a stage talks to a worker process (``worker``) that makes the MLflow
calls (``mlflow_run``, the only module that imports mlflow), so importing mlflow and
opening its store overlap the stage's own work. Nothing is imported here: importing the
package must not import mlflow."""
