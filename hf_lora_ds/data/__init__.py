"""From records to tokenized samples with exact labels: reading (``records``, ``record_table``, ``sources``,
LLaMA-Factory's ``dataset_info``), the record formats, registered, and the one validator of their turns (the
``formats`` package, with ``content_parts`` and ``tool_calls``), per-turn training flags (``turn_flags``, and the
user turns they train: ``user_turns``), TRL's plain-text kinds (``plain_text``), thinking models' reasoning
(``thinking``), the label rule derived from the chat template (``template_rule``, ``labels``) and its fast path
(``skeleton``, ``template_blindness``), the dataset (``dataset``, built from a run's flags by ``run_data``), batching
(``collator``), and the checks of what training will see (``mask_audit``, ``inference_prompts``).

Imports nothing of the model, training or launch layers."""
