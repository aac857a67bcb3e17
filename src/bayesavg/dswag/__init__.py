"""Distributed SWAG, a trajectory kind run apart: clients, rounds, phases; shards and weights.
May import runtime, seeding, config, data, training, posteriors, trajectories; nothing later."""
