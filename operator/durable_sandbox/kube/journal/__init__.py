"""The operator's sealed record on the API server: Journal objects, the journal key, seals, leases and the Sandbox records."""
