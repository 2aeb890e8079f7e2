"""The inventory: where it comes from (sources, slurm), the `ddp_*` contract each value is checked against, and the
cluster derived from it."""
