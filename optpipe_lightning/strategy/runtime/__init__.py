"""The pipeline runtime over torch.distributed.pipelining: engine, stages, activation offload.

Copy engines, the pinned host allocator, microbatches, the model contract, process groups,
checkpoints; imports only ``planning`` (and the schedule part).
"""
