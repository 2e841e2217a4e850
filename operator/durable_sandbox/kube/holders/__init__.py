"""Who holds a Sandbox resource, and a shared Sandbox changing hands."""
