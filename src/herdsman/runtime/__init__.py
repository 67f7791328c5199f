"""The trio side of herdsman: the supervisor and the ports it drives (store, runner, git)."""
