"""Stage `validate`: check every params.yaml key before any other stage runs.

dvc repro deletes a stage's outputs before running it, so validation must
come first. The output is the same for every valid params.yaml, so this
stage never causes downstream re-runs by itself.
"""

from _common import main, params
from _sets import RUNS

from bayesavg.data.ood_data import check_ood_spec
from bayesavg.data.shift import shifts
from bayesavg.runtime.errors import UserError
from bayesavg.runtime.io import write_json


def run() -> None:
    p = params()
    if not p.evaluate.predictors:  # valid for the library; the pipeline would drop its stages
        raise UserError(
            "params.yaml: evaluate.predictors: none listed; the pipeline evaluates them"
        )
    shift = p.evaluate.shift
    try:
        shifts(
            shift.angles,
            shift.corruptions,
            shift.severity,
            shift.cifar_c,
            shift.cifar_c_severities,
        )
    except ValueError as err:
        raise UserError(f"params.yaml: evaluate.shift: {err}") from None
    for spec in p.evaluate.ood.sets:  # the evaluate stages would fail on it, after training
        try:
            check_ood_spec(spec)
        except UserError as err:
            raise UserError(f"params.yaml: evaluate.ood.sets: {err}") from None
    write_json(RUNS / "validate.json", {"params": "valid"})


if __name__ == "__main__":
    main(run)
