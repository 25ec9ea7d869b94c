"""`python -m seis ...` runs the `seis` command (for environments where the entry point is not installed)."""
from .cli import app

app(prog_name="seis")
