"""optpipe-lightning: memory-aware pipeline-parallel training."""
