"""Static shapes, so that a program compiled for a TPU (XLA compiles one executable per input shape) compiles once:
the prefill buckets a prompt is padded to before decoding. Used by the plan (``components.workload.maxtext``: the
largest bucket a run's prompts may need) and by the MaxText trainer (``trainers.maxtext_generation``: the bucket of
its longest real prompt), so both count one way."""

MIN_PREFILL = 64  # the smallest prefill bucket (MaxText's base.yml, inference_microbenchmark_prefill_lengths)


def prefill_length(longest: int) -> int:
    """The prefill bucket of a prompt of ``longest`` tokens: the smallest power of two >= :data:`MIN_PREFILL`."""
    length = MIN_PREFILL
    while length < longest:
        length *= 2
    return length
