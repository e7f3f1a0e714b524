"""The run's settings parsed into values, below every other subpackage: it imports only core modules (errors)."""
