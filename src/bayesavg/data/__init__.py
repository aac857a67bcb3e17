"""Data: each dataset as shipped, the pipeline's prepared splits, shifted test images, OOD sets.
May import runtime and seeding only; every later step reads its images from here."""
