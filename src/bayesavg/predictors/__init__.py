"""Predictors: the networks each registry method draws from a posterior file; their temperature.
May import runtime, config, models, training, posteriors; never evaluation or later steps."""
