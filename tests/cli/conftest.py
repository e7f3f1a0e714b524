"""The eval command's tests use the eval fixtures (one intra-op thread, sum-to-x records)."""

from tests.eval.conftest import one_intra_op_thread, sum_records, sum_records_file  # noqa: F401
