"""Training code that runs inside the trainer images (on Ray workers)."""
