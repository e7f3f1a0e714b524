"""From a command line to a run that can start: the arguments (fields and their checks), the DeepSpeed config in
every form ``--deepspeed`` takes, an ``accelerate launch`` config adopted, the launcher's world made to agree with
DeepSpeed's, and the CLI (``cli``) that resolves all of it once, for run_sft, the audit and the planner.

Nothing here imports the trainer; ``cli`` alone imports the planner (for ``--deepspeed auto``)."""
