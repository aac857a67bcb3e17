"""Evaluation: predicting by sampling (the BMA) and what is measured on it: metrics, OOD, sharpness.
May import every step above it, predictors included; never analyses, seeds or the report."""
