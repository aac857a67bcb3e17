"""Results over seeds: every trajectory and predictor again at another seed, test split only.
May import every step above it (trajectories, dswag, predictors, evaluation); never the report."""
