"""The audit: what the model will be trained on, counted and shown (``mask_audit``), and each trained turn's
inference prompt checked to start its training text (``inference_prompts``). ``audit_dataset`` is the entry."""

from hf_lora_ds.data.audit.inference_prompts import RoundTrip, check_round_trip, round_trip
from hf_lora_ds.data.audit.mask_audit import MaskAudit, audit_by_source, audit_dataset, show_samples

__all__ = [
    "MaskAudit",
    "RoundTrip",
    "audit_by_source",
    "audit_dataset",
    "check_round_trip",
    "round_trip",
    "show_samples",
]
