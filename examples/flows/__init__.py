"""Code-first example workflows: `dsb run examples.flows.<module>:<function>` from the repository root."""
