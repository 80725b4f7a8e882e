"""The long-running loops beside the workers: the relayer (outbox → Redis) and the sweeper."""
