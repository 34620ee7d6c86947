"""The pipeline's domain logic, free of Dagster objects: the reward ladder, sampling workflows from the
generator, W4S's refinement turns, held-out scoring and the headline statistics across seeds."""
