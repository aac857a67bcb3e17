"""The papers' analyses: the loss landscape (lines, rays), the loss plane, DSWAG sweep measures.
May import runtime, models, training, posteriors, evaluation; never seeds or the report."""
