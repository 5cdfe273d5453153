"""The on-node agent: supervises the training process and watches preemption signals."""
