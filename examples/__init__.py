"""Example manifests and Python flows (imported by the tests, runnable with `dsb run`)."""
