"""The eval command's tests use the eval fixtures (sum-to-x records)."""

from tests.eval.conftest import sum_records, sum_records_file  # noqa: F401
