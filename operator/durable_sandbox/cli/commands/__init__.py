"""One module per group of `dsb` commands."""
