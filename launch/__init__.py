"""What runs around a run: the local SLURM cluster, the paper numbers, and the report."""
