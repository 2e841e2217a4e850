"""The API server as every part of the operator uses it: the client, the resources, errors and its absence."""
