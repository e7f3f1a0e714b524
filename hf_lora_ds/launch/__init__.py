"""From a command line to a run that can start: an ``accelerate launch`` config adopted, the checks that read files,
the launcher's world made to agree with DeepSpeed's, and ``resolve``, which runs all of it once for run_sft, the
audit and the planner."""
