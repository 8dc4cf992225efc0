"""Sessions: durable per-turn checkpoints in Redis, hydration, time travel."""
