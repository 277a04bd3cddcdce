"""Running on a SLURM cluster: what the allocation gave, sweeps as job arrays, merging shards."""
