"""What the resources mean: the models, the CRDs generated from them, manifests, a Workflow's plan, Secrets and provider choice."""
